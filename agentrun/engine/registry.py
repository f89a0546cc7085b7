"""The registry of agents by id. Near the bottom of the engine: it knows agents by their protocol
(``types.AgentSpec``), not the façade that implements it.

Every layer that needs an agent by id (the loop for a sub-agent, a worker continuing a run, the decision
transaction looking up a tool's schema) asks here; agents register themselves when they are built.
Which agents exist is configured in settings and loaded by ``AgentrunConfig.ready()``.
"""

from __future__ import annotations

from typing import TypeVar

from agentrun.core.errors import AgentRunError
from agentrun.engine.types import AgentSpec

_registry: dict[str, AgentSpec] = {}
A = TypeVar("A", bound=AgentSpec)


def register_agent(agent: A) -> A:  # noqa: UP047 - a TypeVar keeps the façade's type for its callers
    _registry[agent.id] = agent
    return agent


def get_agent(agent_id: str) -> AgentSpec:
    """The registered agent, or ``AgentRunError(AGENT_NOT_FOUND)``. (``agentrun.engine.agents.get_agent``
    gives the façade, ``Agent``, for surfaces that start runs and decide.)"""
    try:
        return _registry[agent_id]
    except KeyError:
        raise AgentRunError("AGENT_NOT_FOUND", f"No agent {agent_id!r} is registered.") from None


def all_agents() -> list[AgentSpec]:
    return sorted(_registry.values(), key=lambda a: a.id)


def snapshot() -> dict[str, AgentSpec]:
    """A copy of the registry (tests put it back with ``restore``)."""
    return dict(_registry)


def restore(saved: dict[str, AgentSpec]) -> None:
    _registry.clear()
    _registry.update(saved)

"""The registry of agents by id. The bottom of the engine: it imports nothing from it.

Every layer that needs an agent by id (the loop for a sub-agent, a worker continuing a run, the decision
transaction looking up a tool's schema) asks here; agents register themselves when they are built.
Which agents exist is configured in settings and loaded by ``AgentrunConfig.ready()``.
"""

from __future__ import annotations

from typing import Any

from agentrun.core.errors import AgentRunError

_registry: dict[str, Any] = {}


def register_agent(agent: Any) -> Any:
    _registry[agent.id] = agent
    return agent


def get_agent(agent_id: str) -> Any:
    """The registered ``Agent`` (``agentrun.engine.agents``), or ``AgentRunError(AGENT_NOT_FOUND)``."""
    try:
        return _registry[agent_id]
    except KeyError:
        raise AgentRunError("AGENT_NOT_FOUND", f"No agent {agent_id!r} is registered.") from None


def all_agents() -> list[Any]:
    return sorted(_registry.values(), key=lambda a: a.id)


def snapshot() -> dict[str, Any]:
    """A copy of the registry (tests put it back with ``restore``)."""
    return dict(_registry)


def restore(saved: dict[str, Any]) -> None:
    _registry.clear()
    _registry.update(saved)

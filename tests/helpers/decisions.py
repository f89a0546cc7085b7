"""A decision through the decision service (as a door makes it), or its transaction alone."""

from __future__ import annotations

from typing import Any

from agentrun.engine.decisions import DecisionOutcome, record_decisions
from agentrun.engine.service import decide
from agentrun.engine.types import PYTHON, Decider, DecisionCommand


def record_decision(
    *, agent_id: str, run_id: str, kind: str, decider: Decider = PYTHON, **request: Any
) -> DecisionOutcome:
    """The decision transaction alone, with no continuation queued: what a process that died right
    after the commit leaves behind (the sweeper continues such runs), or a test drives itself."""
    return record_decisions(
        DecisionCommand.one(agent_id=agent_id, run_id=run_id, kind=kind, decider=decider, **request)
    )


def decide_call(*, agent_id: str, run_id: str, kind: str, decider: Decider = PYTHON, **request: Any) -> DecisionOutcome:
    """One decision through the decision service (its continuation queued), as a door makes it."""
    return decide(DecisionCommand.one(agent_id=agent_id, run_id=run_id, kind=kind, decider=decider, **request))

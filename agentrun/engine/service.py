"""The one decision service. Every door — the Python API, REST (native and Mastra-compatible), the
``ws/agents`` socket, the dashboard, the admin, signed links, timeout policies — decides through
``decide_tool_calls``.

In one transaction it records the decisions (``decisions.record_decisions``: the run row locked, the
state re-checked, exactly once) and enqueues the run's continuation (``dispatch``), so neither exists
without the other. It never drives the run: the task runner does, and whoever wants the continuation's
chunks follows the run's chunk log from ``outcome.after_seq`` (``agentrun.core.fanout.subscribe``), like any
other subscriber.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import transaction

from agentrun.core.models import Decision
from agentrun.engine import dispatch
from agentrun.engine.decisions import DecisionOutcome, DecisionRequest, expire_run_if_due, record_decisions

__all__ = ["DecisionOutcome", "DecisionRequest", "decide_tool_call", "decide_tool_calls"]


def decide_tool_calls(
    *,
    agent_id: str,
    run_id: str,
    requests: Sequence[DecisionRequest],
    decided_by: Any = None,
    via: str = Decision.Via.PYTHON,
    batch: bool = True,
    on_recorded: Callable[[DecisionOutcome], None] | None = None,
    details: dict | None = None,
) -> DecisionOutcome:
    """Decide open calls of one run, all or nothing, and queue the run's continuation.

    ``decided_by``: a user (their permissions are checked), a name or None (trusted server code).
    ``details``: what made an automatic decision (``via`` policy), kept on the decision.
    ``on_recorded`` runs inside the transaction (REST keeps its Idempotency-Key answer there).
    Raises the contract's ``AgentRunError`` having changed nothing; in a batch its ``details.index``
    names the decision that failed.
    """
    # In a transaction of its own: a run past its time to live stays expired whatever happens next.
    expire_run_if_due(run_id)
    with transaction.atomic():
        outcome = record_decisions(
            agent_id=agent_id,
            run_id=run_id,
            requests=requests,
            decided_by=decided_by,
            via=via,
            batch=batch,
            details=details,
        )
        dispatch.enqueue_continuation(outcome.continue_agent_id, outcome.continue_run_id)
        if on_recorded is not None:
            on_recorded(outcome)
    return outcome


def decide_tool_call(
    *,
    agent_id: str,
    run_id: str,
    kind: str,
    tool_call_id: str | None = None,
    args: Any = None,
    reason: str | None = None,
    resume_data: Any = None,
    args_fingerprint: str | None = None,
    decided_by: Any = None,
    via: str = Decision.Via.PYTHON,
    on_recorded: Callable[[DecisionOutcome], None] | None = None,
    details: dict | None = None,
) -> DecisionOutcome:
    """One decision: ``decide_tool_calls`` with one request (its errors carry no index)."""
    request = DecisionRequest(
        kind=kind,
        tool_call_id=tool_call_id,
        args=args,
        reason=reason,
        resume_data=resume_data,
        args_fingerprint=args_fingerprint,
    )
    return decide_tool_calls(
        agent_id=agent_id,
        run_id=run_id,
        requests=[request],
        decided_by=decided_by,
        via=via,
        batch=False,
        on_recorded=on_recorded,
        details=details,
    )

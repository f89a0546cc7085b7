"""The one decision service. Every door — the Python API, REST (native and Mastra-compatible), the
``ws/agents`` socket, the dashboard, the admin, signed links, timeout policies — builds one typed
``DecisionCommand`` (``engine/types.py``: who decides, as a ``Decider``, and what) and hands it to
``decide``. Standing grants are made and revoked here too (``create_grant`` / ``revoke_grant``).

In one transaction it checks every rule of a safe decision and records the decisions
(``decisions.record_decisions``: the run row locked, the state re-checked, exactly once) and enqueues
the run's continuation (``dispatch``), so neither exists without the other. A door cannot forget a
rule: it has none of its own. It never drives the run: the task runner does, and whoever wants the
continuation's chunks follows the run's chunk log from ``outcome.after_seq``
(``agentrun.core.fanout.subscribe``), like any other subscriber.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import IntegrityError, transaction

from agentrun.core import receipts
from agentrun.core.models import StandingGrant
from agentrun.engine import dispatch
from agentrun.engine.decisions import (
    DecisionOutcome,
    RunDue,
    create_grant,
    expire_run_if_due,
    integrity_error,
    record_decisions,
    revoke_grant,
)
from agentrun.engine.types import Decider, DecisionCommand, DecisionRequest

__all__ = [
    "Decider",
    "DecisionCommand",
    "DecisionOutcome",
    "DecisionRequest",
    "create_grant",
    "decide",
    "decide_with_grant",
    "revoke_grant",
]


def decide(
    command: DecisionCommand, *, on_recorded: Callable[[DecisionOutcome], None] | None = None
) -> DecisionOutcome:
    """Decide open calls of one run, all or nothing, and queue the run's continuation.

    ``on_recorded`` runs inside the transaction (REST keeps its Idempotency-Key answer there).
    Raises the ``AgentRunError`` of the first rule the command breaks, having changed nothing; in a
    batch its ``details.index`` names the decision that failed.
    """
    try:
        return _decide(command, on_recorded)
    except RunDue as due:
        # Past its time to live (seen under the decision's lock, so a decision in time costs no query
        # of its own): expired in a transaction of its own, so that it stays expired whatever happens
        # next; the decision then meets an expired run and says so.
        expire_run_if_due(due.run_id)
        return _decide(command, on_recorded)


def _decide(command: DecisionCommand, on_recorded: Callable[[DecisionOutcome], None] | None) -> DecisionOutcome:
    """One transaction: the decisions and the continuation's queue row (docs/architecture.md)."""
    try:
        # The receipts last: the audit chain's head is locked from their insert to the commit only.
        with transaction.atomic(), receipts.sealed_last():
            outcome = record_decisions(command)
            if outcome.continue_run_id:
                dispatch.enqueue_continuation(outcome.continue_agent_id, outcome.continue_run_id)
            if on_recorded is not None:
                on_recorded(outcome)
    except IntegrityError as exc:
        raise integrity_error(command, exc) from exc
    return outcome


def decide_with_grant(command: DecisionCommand, grant: StandingGrant) -> DecisionOutcome:
    """Approve a call and grant its tool from now on ("always approve…" on a call card), together or
    not at all: the approval meets every rule of ``decide``, the grant every rule of a grant."""

    def grant_too(_: DecisionOutcome) -> None:
        create_grant(grant, command.decider)

    return decide(command, on_recorded=grant_too)

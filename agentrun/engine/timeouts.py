"""Timeout policies (``@tool(approval_timeout=…, on_timeout=…)``), applied by the sweep.

A call that waits for approval under a policy carries two deadlines on its row: ``warn_at`` (the
``approval.timeout_warning`` event) and ``timeout_at`` (the policy's outcome). The sweep finds due
rows with two indexed queries (partial indexes on open calls that have a deadline), so its cost
follows the work due, and clears each deadline once done. Outcomes are recorded ``via`` policy with
the policy named in the decision's ``details`` and ``reason``, never mistaken for a person's:

- ``decline`` / ``approve``: decided through the one decision service; the run goes on.
- ``cancel_run``: every open call of the run gets an ``expire`` decision and the run is cancelled.
- ``escalate``: no decision; ``approval.escalated`` names the tool's ``escalate_to`` groups (who are
  notified) and the call waits on.

The agent's ``suspended_run_ttl`` stays the outer bound: the sweep expires due runs first, and a
deadline after the run's expiry never comes.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentrun.core import metrics, outbox, rollup
from agentrun.core.errors import AgentRunError
from agentrun.core.models import SuspendedToolCall
from agentrun.core.selectors import describe_open_calls
from agentrun.core.timeutil import iso
from agentrun.engine import decisions, service
from agentrun.engine.registry import get_agent
from agentrun.engine.tools import TimeoutPolicy

logger = logging.getLogger("agentrun.timeouts")

BATCH = 100  # due calls handled per sweep round (the rest in the next one)

OUTCOME_REASONS = {
    "decline": "Declined automatically: nobody approved the call within {timeout}.",
    "approve": "Approved automatically: nobody decided the call within {timeout}.",
    "cancel_run": "Nobody approved {tool} within {timeout}: the run was cancelled.",
}


def sweep() -> dict:
    """Send the warnings that are due, then apply the timeouts that are due."""
    return {"warned": send_due_warnings(), "timed_out": apply_due_timeouts()}


def _open(**deadline: object):  # noqa: ANN202 - a queryset
    return SuspendedToolCall.objects.filter(status=SuspendedToolCall.Status.OPEN, **deadline).select_related("run")


def _policy(call: SuspendedToolCall) -> TimeoutPolicy | None:
    """The call's tool's policy, as registered now (escalation groups are read from it)."""
    try:
        tool = get_agent(call.run.agent_id).tools.get(call.tool_name)
    except AgentRunError:
        return None
    return tool.timeout_policy if tool is not None else None


def _described(call: SuspendedToolCall) -> dict | None:
    """The call as the listing shows it (None once it no longer waits)."""
    calls = describe_open_calls(SuspendedToolCall.objects.filter(pk=call.pk)).get(call.run_id, [])
    return calls[0].to_dict() if calls else None


def _data(call: SuspendedToolCall) -> dict:
    policy = _policy(call)
    data: dict[str, Any] = {
        "runId": call.run_id,
        "agentId": call.run.agent_id,
        "threadId": call.run.thread_id,
        "resourceId": call.run.resource_id,
        "toolCall": _described(call),
        "timeoutAt": iso(call.timeout_at),
        "onTimeout": call.on_timeout,
    }
    if call.on_timeout == "escalate":
        data["escalateTo"] = list(policy.escalate_to) if policy else []
    return data


def _claim(call: SuspendedToolCall, field: str) -> bool:
    """Clear a due deadline; only the sweeper that clears it acts on it (every worker sweeps)."""
    return bool(
        SuspendedToolCall.objects.filter(pk=call.pk, status=SuspendedToolCall.Status.OPEN)
        .exclude(**{f"{field}__isnull": True})
        .update(**{field: None})
    )


def send_due_warnings() -> int:
    sent = 0
    for call in list(_open(warn_at__lte=timezone.now()).order_by("warn_at")[:BATCH]):
        with transaction.atomic():
            if _claim(call, "warn_at"):
                outbox.record(
                    outbox.TIMEOUT_WARNING, agent_id=call.run.agent_id, run_id=call.run_id, data=partial(_data, call)
                )
                sent += 1
    return sent


def apply_due_timeouts() -> int:
    applied = 0
    for call in list(_open(timeout_at__lte=timezone.now()).order_by("timeout_at")[:BATCH]):
        try:
            applied += _apply(call)
        except AgentRunError as exc:
            # Decided, cancelled or expired meanwhile (or a sub-agent's call already decided on the
            # supervisor's side): nothing is left to do, and the deadline must not come round again.
            logger.info("timeout of %s not applied: %s", call.tool_call_id, exc.message)
            _claim(call, "timeout_at")
    return applied


def _apply(call: SuspendedToolCall) -> bool:
    outcome = call.on_timeout or "decline"
    policy = _policy(call)
    timeout = f"{policy.timeout:g} s" if policy else "its approval timeout"
    details = {"policy": "timeout", "onTimeout": outcome, "timeoutAt": iso(call.timeout_at)}
    if outcome == "escalate":
        with transaction.atomic():
            if not _claim(call, "timeout_at"):
                return False
            outbox.record(outbox.ESCALATED, agent_id=call.run.agent_id, run_id=call.run_id, data=lambda: _data(call))
            # For the metrics page and /metrics: an escalation decides nothing, so no decision counts it.
            rollup.record_escalation(
                agent_id=call.run.agent_id, tool_name=call.tool_name, waiting_since=call.created_at, slot_of=call.run_id
            )
            metrics.escalated(agent_id=call.run.agent_id, tool_name=call.tool_name)
        return True
    reason = OUTCOME_REASONS[outcome].format(tool=call.tool_name, timeout=timeout)
    if outcome == "cancel_run":
        return decisions.cancel_on_timeout(
            run_id=call.run_id, tool_call_id=call.tool_call_id, reason=reason, details=details
        )
    service.decide(
        service.DecisionCommand.one(
            agent_id=call.run.agent_id,
            run_id=call.run_id,
            tool_call_id=call.tool_call_id,
            kind=outcome,
            reason=reason,
            decider=service.Decider.policy(details),
        )
    )
    return True

"""The decision transaction: approve / decline / resume a suspended tool call, exactly once.

Also the other transitions a person or the system makes on a waiting run: expiry and cancellation.
Each is one atomic block that locks the run row (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite
transactions start IMMEDIATE, which serialises writers), re-checks the state it read, and writes.
A unique constraint on (run, tool call, suspension) backs the lock: a second decision cannot exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from agentrun import access
from agentrun.engine.inputs import json_problem
from agentrun.errors import AgentRunError
from agentrun.fanout import notify_approvals
from agentrun.models import Decision, Run, RunStep, Snapshot, SuspendedToolCall
from agentrun.timeutil import iso

DECISION_KINDS = {"approve", "decline", "resume"}


@dataclass
class DecisionOutcome:
    decision: Decision
    run_status: str

    def to_dict(self) -> dict:
        return {
            "runId": self.decision.run_id,
            "toolCallId": self.decision.tool_call_id,
            "decision": self.decision.kind,
            "status": self.run_status,
        }


def first_open_call(run_id: str) -> SuspendedToolCall | None:
    return SuspendedToolCall.objects.filter(run_id=run_id, status=SuspendedToolCall.Status.OPEN).first()


def _already_decided(decision: Decision) -> AgentRunError:
    who = decision.decided_by_username or ("the system" if decision.via == "system" else "someone")
    return AgentRunError(
        "TOOL_CALL_ALREADY_DECIDED",
        f"Tool call {decision.tool_call_id} was already decided ({decision.kind}) by {who}.",
        details={
            "toolCallId": decision.tool_call_id,
            "decision": decision.kind,
            "decidedBy": decision.decided_by_username,
            "decidedAt": iso(decision.decided_at),
            "via": decision.via,
        },
    )


def _not_open_error(run: Run, tool_call_id: str | None) -> AgentRunError:
    """Why there is no open call to decide: who won the race, or what state the run is in."""
    decisions = Decision.objects.filter(run=run)
    if tool_call_id is not None:
        decisions = decisions.filter(tool_call_id=tool_call_id)
    if (latest := decisions.order_by("-decided_at", "-id").first()) is not None:
        return _already_decided(latest)
    if run.is_final:
        return AgentRunError("RUN_NOT_FOUND", f"Run {run.id} has finished ({run.status}).")
    if run.status != Run.Status.SUSPENDED:
        return AgentRunError("RUN_NOT_SUSPENDED", f"Run {run.id} is {run.status}, not suspended.")
    return AgentRunError(
        "TOOL_CALL_NOT_SUSPENDED", f"Tool call {tool_call_id} is not among the open calls of run {run.id}."
    )


def _tool_for(agent_id: str, call: SuspendedToolCall) -> Any:
    """The tool whose schemas govern this call: the sub-agent's inner tool for a surfaced inner call."""
    from agentrun.engine.agents import get_agent

    if call.inner_run_id:
        inner = SuspendedToolCall.objects.filter(run_id=call.inner_run_id, tool_call_id=call.inner_tool_call_id).first()
        if inner is not None:
            return get_agent(call.inner_agent_id).tools.get(inner.tool_name)
    return get_agent(agent_id).tools.get(call.tool_name)


def decide(
    *,
    agent_id: str,
    run_id: str,
    kind: str,
    tool_call_id: str | None = None,
    args: Any = None,
    reason: str | None = None,
    resume_data: Any = None,
    decided_by: Any = None,
    via: str = Decision.Via.PYTHON,
) -> DecisionOutcome:
    """Record a decision on an open tool call, or raise the contract's error having changed nothing."""
    if kind not in DECISION_KINDS:
        raise AgentRunError("INVALID_REQUEST", f"unknown decision {kind!r}")
    if reason is not None and (not isinstance(reason, str) or json_problem(reason)):
        raise AgentRunError("INVALID_REQUEST", "reason must be a string of Unicode text (no NUL characters)")
    # A person must be allowed to decide this agent's calls (global permission and per-agent scope);
    # checked first, so someone who may not decide learns nothing about the run. None or a name: trusted.
    person = decided_by if access.is_person(decided_by) else None
    if person is not None and not access.can_decide_agent(person, agent_id):
        raise AgentRunError("PERMISSION_DENIED", f"You may not decide the tool calls of agent {agent_id}.")
    expire_run_if_due(run_id)
    try:
        with transaction.atomic():
            run = Run.objects.select_for_update().filter(pk=run_id, agent_id=agent_id).first()
            if run is None:
                raise AgentRunError("RUN_NOT_FOUND", f"No run {run_id} for agent {agent_id}.")
            open_calls = list(
                SuspendedToolCall.objects.filter(run=run, status=SuspendedToolCall.Status.OPEN).order_by(
                    "position", "id"
                )
            )
            if tool_call_id is None:
                if len(open_calls) > 1:
                    raise AgentRunError(
                        "AMBIGUOUS_TOOL_CALL",
                        f"Run {run.id} has {len(open_calls)} open tool calls; name one with toolCallId.",
                        details={"toolCallIds": [c.tool_call_id for c in open_calls]},
                    )
                call = open_calls[0] if open_calls else None
            else:
                call = next((c for c in open_calls if c.tool_call_id == tool_call_id), None)
            if call is None or run.status != Run.Status.SUSPENDED:
                raise _not_open_error(run, tool_call_id)
            if person is not None and call.inner_agent_id and not access.can_decide_agent(person, call.inner_agent_id):
                # Deciding a surfaced sub-agent call runs the sub-agent's tool: its reviewers' call too.
                raise AgentRunError(
                    "PERMISSION_DENIED", f"You may not decide the tool calls of agent {call.inner_agent_id}."
                )

            if kind == "resume" and call.requires_approval:
                raise AgentRunError(
                    "WRONG_DECISION_KIND", f"Tool call {call.tool_call_id} waits for approval: approve or decline it."
                )
            if kind in ("approve", "decline") and not call.requires_approval:
                raise AgentRunError(
                    "WRONG_DECISION_KIND", f"Tool call {call.tool_call_id} waits for resume data: resume it."
                )
            if args is not None and kind != "approve":
                raise AgentRunError("INVALID_REQUEST", "args can only be given when approving")
            tool = _tool_for(agent_id, call)
            edited_args = None
            if kind == "approve" and args is not None:
                if tool is None:
                    raise AgentRunError("ARGS_INVALID", f"tool {call.tool_name!r} is not registered")
                edited_args = tool.validate_args(args)
            if kind == "resume" and tool is not None:
                resume_data = tool.validate_resume_data(resume_data)

            decision = Decision.objects.create(
                run=run,
                agent_id=run.agent_id,
                thread_id=run.thread_id,
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                suspension=call.suspension,
                kind=kind,
                args=call.args,
                edited_args=edited_args,
                resume_data=resume_data if kind == "resume" else None,
                reason=reason if kind != "resume" else None,
                decided_by=decided_by if getattr(decided_by, "pk", None) else None,
                decided_by_username=getattr(decided_by, "username", None)
                or (decided_by if isinstance(decided_by, str) else None),
                via=via,
            )
            call.status = SuspendedToolCall.Status.DECIDED
            call.decision = decision
            call.save(update_fields=["status", "decision"])
            if len(open_calls) == 1:
                # The last open call is decided: the run stops waiting, its snapshot goes.
                run.status = Run.Status.IN_PROGRESS
                run.save(update_fields=["status"])
                Snapshot.objects.filter(run=run).delete()
            transaction.on_commit(lambda: _notify_decided(decision))
            return DecisionOutcome(decision=decision, run_status=run.status)
    except IntegrityError as exc:
        # Only reachable where row locks are not enforced: the unique constraint decides the race.
        latest = Decision.objects.filter(run_id=run_id).order_by("-decided_at", "-id").first()
        if latest is None:
            raise
        raise _already_decided(latest) from exc


def _notify_decided(decision: Decision) -> None:
    notify_approvals(
        "decided",
        runId=decision.run_id,
        agentId=decision.agent_id,
        threadId=decision.thread_id,
        toolCallIds=[decision.tool_call_id],
        decision=decision.kind,
        decidedBy=decision.decided_by_username,
    )


# --- expiry -------------------------------------------------------------------------------------
def expire_run_if_due(run_id: str) -> bool:
    """Expire a waiting run whose TTL has passed (the sweeper does the same for every due run)."""
    if not Snapshot.objects.filter(run_id=run_id, expires_at__lte=timezone.now()).exists():
        return False
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.status != Run.Status.SUSPENDED or not run.expires_at or run.expires_at > timezone.now():
            return False
        now = timezone.now()
        for call in SuspendedToolCall.objects.filter(run=run, status=SuspendedToolCall.Status.OPEN):
            Decision.objects.create(
                run=run,
                agent_id=run.agent_id,
                thread_id=run.thread_id,
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                suspension=call.suspension,
                kind=Decision.Kind.EXPIRE,
                args=call.args,
                via=Decision.Via.SYSTEM,
                reason="The run waited longer than its time to live.",
            )
        _end_waiting_run(run, status=Run.Status.EXPIRED, step_status=RunStep.Status.EXPIRED, now=now)
    return True


def _end_waiting_run(run: Run, *, status: str, step_status: str, now: datetime) -> None:
    """Move a run (locked by the caller) to a final state: its calls, open steps and snapshot go."""
    SuspendedToolCall.objects.filter(run=run).delete()
    RunStep.objects.filter(run=run, status=RunStep.Status.IN_PROGRESS).update(
        **{"status": step_status, f"{step_status}_at": now}
    )
    Snapshot.objects.filter(run=run).delete()
    run.status = status
    setattr(run, f"{status}_at", now)
    run.save(update_fields=["status", f"{status}_at"])
    transaction.on_commit(
        lambda: notify_approvals("removed", runId=run.id, agentId=run.agent_id, threadId=run.thread_id)
    )


def expire_due_runs() -> int:
    due = Snapshot.objects.filter(expires_at__lte=timezone.now()).values_list("run_id", flat=True)
    return sum(expire_run_if_due(run_id) for run_id in list(due))


# --- cancellation -------------------------------------------------------------------------------
def cancel_run(*, run_id: str, agent_id: str | None = None) -> Run:
    with transaction.atomic():
        runs = Run.objects.select_for_update().filter(pk=run_id)
        if agent_id is not None:
            runs = runs.filter(agent_id=agent_id)
        run = runs.first()
        if run is None:
            raise AgentRunError("RUN_NOT_FOUND", f"No run {run_id}.")
        if run.is_final:
            raise AgentRunError("RUN_NOT_SUSPENDED", f"Run {run_id} has already finished ({run.status}).")
        _end_waiting_run(run, status=Run.Status.CANCELLED, step_status=RunStep.Status.CANCELLED, now=timezone.now())
    return run

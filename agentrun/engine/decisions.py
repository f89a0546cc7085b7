"""The decision transaction: approve / decline / resume suspended tool calls, exactly once.

Also the other transitions a person, the system or a policy makes on a waiting run: expiry,
cancellation, a standing grant's approval, a timeout's cancellation. Each is one atomic block that
locks the run row (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite transactions start IMMEDIATE, which
serialises writers), re-checks the state it read, and writes, its outbox event (``agentrun.core.outbox``)
included. A unique constraint on (run, tool call, suspension) backs the lock: a second decision
cannot exist.

``record_decisions`` writes decisions in the caller's transaction and nothing else: the one service
every surface calls (``agentrun.engine.service``) wraps it with the continuation's enqueue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from agentrun.core import access, metrics, outbox, tracing
from agentrun.core.errors import AgentRunError
from agentrun.core.fanout import notify_approvals
from agentrun.core.models import Decision, Run, RunStep, Snapshot, StandingGrant, SuspendedToolCall, args_fingerprint
from agentrun.core.timeutil import iso
from agentrun.engine.inputs import json_problem
from agentrun.engine.registry import get_agent
from agentrun.engine.tools import Tool

DECISION_KINDS = ("approve", "decline", "resume")


@dataclass(frozen=True)
class DecisionRequest:
    """One decision on one open call, as any surface hands it to the engine."""

    kind: str  # approve | decline | resume
    tool_call_id: str | None = None  # None: the run's only open call
    args: Any = None  # approve only: the edited arguments (a full replacement; a JSON string is parsed)
    reason: str | None = None
    resume_data: Any = None  # resume only
    args_fingerprint: str | None = None  # the displayed arguments' fingerprint (docs/api.md#argsfingerprint)


@dataclass
class DecisionOutcome:
    """What a decision did. ``run_id`` / ``tool_call_ids`` are the ones the caller addressed;
    ``after_seq``: the continuation's chunks on that run have a greater ``seq``."""

    run_id: str
    tool_call_ids: list[str]
    decisions: list[Decision]
    run_status: str
    after_seq: int
    # The run whose continuation carries the decision out: the addressed run, or the supervisor's run
    # when the addressed call is a sub-agent's call surfaced there.
    continue_agent_id: str = ""
    continue_run_id: str = ""

    @property
    def decision(self) -> Decision:
        return self.decisions[0]

    def to_dict(self) -> dict:
        """The 202 body of a single decision (docs/api.md#decisions)."""
        return {
            "runId": self.run_id,
            "toolCallId": self.tool_call_ids[0],
            "decision": self.decisions[0].kind,
            "status": self.run_status,
        }

    def batch_dict(self) -> dict:
        """The 202 body of a batch (docs/api.md#batch-decisions)."""
        return {
            "runId": self.run_id,
            "decisions": [
                {"toolCallId": tool_call_id, "decision": d.kind}
                for tool_call_id, d in zip(self.tool_call_ids, self.decisions, strict=True)
            ],
            "status": self.run_status,
        }


AUTOMATIC_DECIDERS = {Decision.Via.SYSTEM: "the system", Decision.Via.POLICY: "a policy"}


def already_decided_error(decision: Decision) -> AgentRunError:
    who = decision.decided_by_username or AUTOMATIC_DECIDERS.get(decision.via, "someone")
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


def decision_for_call(run: Run, tool_call_id: str | None) -> Decision | None:
    """The decision that took this call (or, without a call id, the run's latest): who won the race.

    A sub-agent's inner call carries the decision made on the supervisor's call that surfaced it.
    """
    if tool_call_id is None:
        return Decision.objects.filter(run=run).order_by("-decided_at", "-id").first()
    call = SuspendedToolCall.objects.filter(run=run, tool_call_id=tool_call_id).select_related("decision").first()
    if call is not None and call.decision is not None:
        return call.decision
    own = Decision.objects.filter(run=run, tool_call_id=tool_call_id).order_by("-decided_at", "-id").first()
    if own is not None or run.parent_run_id is None:
        return own
    return (
        Decision.objects.filter(run_id=run.parent_run_id, tool_call_id=run.parent_tool_call_id)
        .order_by("-decided_at", "-id")
        .first()
    )


def _not_open_error(run: Run, tool_call_id: str | None) -> AgentRunError:
    """Why there is no open call to decide: who won the race, or what state the run is in."""
    if (decision := decision_for_call(run, tool_call_id)) is not None:
        return already_decided_error(decision)
    if run.is_final:
        return AgentRunError("RUN_NOT_FOUND", f"Run {run.id} has finished ({run.status}).")
    if run.status != Run.Status.SUSPENDED:
        return AgentRunError("RUN_NOT_SUSPENDED", f"Run {run.id} is {run.status}, not suspended.")
    return AgentRunError(
        "TOOL_CALL_NOT_SUSPENDED", f"Tool call {tool_call_id} is not among the open calls of run {run.id}."
    )


def _tool_for(agent_id: str, call: SuspendedToolCall) -> Tool | None:
    """The tool whose schemas govern this call: the sub-agent's inner tool for a surfaced inner call."""
    if call.inner_run_id:
        inner = SuspendedToolCall.objects.filter(run_id=call.inner_run_id, tool_call_id=call.inner_tool_call_id).first()
        if inner is not None:
            return get_agent(call.inner_agent_id).tools.get(inner.tool_name)
    return get_agent(agent_id).tools.get(call.tool_name)


def _inner_args(call: SuspendedToolCall) -> Any:
    inner = SuspendedToolCall.objects.filter(run_id=call.inner_run_id, tool_call_id=call.inner_tool_call_id).first()
    return inner.args if inner is not None else None


def _check_request(request: DecisionRequest) -> None:
    """What can be refused before anything is read."""
    if request.kind not in DECISION_KINDS:
        raise AgentRunError("INVALID_REQUEST", f"unknown decision {request.kind!r}")
    if request.reason is not None and (not isinstance(request.reason, str) or json_problem(request.reason)):
        raise AgentRunError("INVALID_REQUEST", "reason must be a string of Unicode text (no NUL characters)")
    if request.args is not None and request.kind != "approve":
        raise AgentRunError("INVALID_REQUEST", "args can only be given when approving")
    if request.args_fingerprint is not None and not isinstance(request.args_fingerprint, str):
        raise AgentRunError("INVALID_REQUEST", "argsFingerprint must be a string")


def _indexed(exc: AgentRunError, index: int | None) -> AgentRunError:
    if index is not None:
        exc.details = {**(exc.details or {}), "index": index}
    return exc


def _surfacing_call(run: Run, tool_call_id: str | None) -> SuspendedToolCall | None:
    """The supervisor's open call that surfaces this sub-agent run's call, if it is one.

    Deciding an inner call is deciding the supervisor's call that shows it (docs/runs.md#sub-agents): one
    decision, and the supervisor's run goes on, whichever door the person used.
    """
    calls = SuspendedToolCall.objects.filter(
        run_id=run.parent_run_id, inner_run_id=run.pk, status=SuspendedToolCall.Status.OPEN
    )
    if tool_call_id is not None:
        calls = calls.filter(inner_tool_call_id=tool_call_id)
    return calls.select_related("run").first()


def record_decisions(
    *,
    agent_id: str,
    run_id: str,
    requests: Sequence[DecisionRequest],
    decided_by: Any = None,
    via: str = Decision.Via.PYTHON,
    batch: bool = False,
    details: dict | None = None,
) -> DecisionOutcome:
    """Record decisions on open calls of one run, all or none; or raise the contract's error having
    changed nothing (in a batch, ``details.index`` names the request that failed). ``details``: what
    made an automatic decision (a timeout policy), kept on each decision.

    Runs in the caller's transaction (opened here if there is none). Does not continue the run, and does
    not expire it: callers run ``expire_run_if_due`` first, in a transaction of its own.
    """
    if not requests:
        raise AgentRunError("INVALID_REQUEST", "decisions must not be empty")
    for index, request in enumerate(requests):
        try:
            _check_request(request)
        except AgentRunError as exc:
            raise _indexed(exc, index if batch else None) from None
    ids = [r.tool_call_id for r in requests]
    if batch and (None in ids or len(set(ids)) != len(ids)):
        raise AgentRunError("INVALID_REQUEST", "each decision of a batch names a different toolCallId")
    # A person must be allowed to decide this agent's calls (global permission and per-agent scope);
    # checked first, so someone who may not decide learns nothing about the run. None or a name: trusted.
    person = decided_by if access.is_person(decided_by) else None
    if person is not None and not access.can_decide_agent(person, agent_id):
        raise AgentRunError("PERMISSION_DENIED", f"You may not decide the tool calls of agent {agent_id}.")

    return _record(
        agent_id=agent_id,
        run_id=run_id,
        requests=requests,
        decided_by=decided_by,
        person=person,
        via=via,
        batch=batch,
        details=details,
        may_be_surfaced=len(requests) == 1,
    )


def _record_on_surfacing_call(
    inner: Run,
    surfacing: SuspendedToolCall,
    request: DecisionRequest,
    *,
    decided_by: Any,
    person: Any,
    via: str,
    batch: bool,
    details: dict | None,
) -> DecisionOutcome:
    """A sub-agent's call (of ``inner``, locked) decided as the supervisor's call that surfaces it."""
    if person is not None and not access.can_decide_agent(person, surfacing.run.agent_id):
        raise AgentRunError(
            "PERMISSION_DENIED", f"You may not decide the tool calls of agent {surfacing.run.agent_id}."
        )
    outer = _record(
        agent_id=surfacing.run.agent_id,
        run_id=surfacing.run_id,
        requests=[_redirected(request, surfacing)],
        decided_by=decided_by,
        person=person,
        via=via,
        batch=batch,
        details=details,
    )
    outer.run_id = inner.pk
    outer.tool_call_ids = [surfacing.inner_tool_call_id]
    outer.run_status = Run.Status.IN_PROGRESS  # the supervisor's continuation resumes it
    outer.after_seq = inner.next_seq - 1
    return outer


def _redirected(request: DecisionRequest, surfacing: SuspendedToolCall) -> DecisionRequest:
    return DecisionRequest(
        kind=request.kind,
        tool_call_id=surfacing.tool_call_id,
        args=request.args,
        reason=request.reason,
        resume_data=request.resume_data,
        args_fingerprint=request.args_fingerprint,
    )


def _record(
    *,
    agent_id: str,
    run_id: str,
    requests: Sequence[DecisionRequest],
    decided_by: Any,
    person: Any,
    via: str,
    batch: bool,
    details: dict | None,
    may_be_surfaced: bool = False,
) -> DecisionOutcome:
    """``may_be_surfaced``: one request, which may name a sub-agent's call surfaced on its supervisor's
    run (the locked run tells: a sub-agent's run has a parent). The inner run is locked before the
    outer one, the order a timeout's cancellation locks them in too."""
    try:
        with transaction.atomic():
            run = Run.objects.select_for_update().filter(pk=run_id, agent_id=agent_id).first()
            if run is None:
                raise AgentRunError("RUN_NOT_FOUND", f"No run {run_id} for agent {agent_id}.")
            if may_be_surfaced and run.parent_run_id is not None:
                surfacing = _surfacing_call(run, requests[0].tool_call_id)
                if surfacing is not None:
                    return _record_on_surfacing_call(
                        run,
                        surfacing,
                        requests[0],
                        decided_by=decided_by,
                        person=person,
                        via=via,
                        batch=batch,
                        details=details,
                    )
            open_calls = list(
                SuspendedToolCall.objects.filter(run=run, status=SuspendedToolCall.Status.OPEN).order_by(
                    "position", "id"
                )
            )
            decisions = []
            decided_ids = []
            for index, request in enumerate(requests):
                try:
                    call = _open_call(run, open_calls, request.tool_call_id)
                    decisions.append(
                        _decide_call(run, call, request, decided_by=decided_by, person=person, via=via, details=details)
                    )
                except AgentRunError as exc:
                    raise _indexed(exc, index if batch else None) from None
                open_calls.remove(call)
                decided_ids.append(call.tool_call_id)
            if not open_calls:
                # The last open call is decided: the run stops waiting, its snapshot goes.
                run.status = Run.Status.IN_PROGRESS
                run.save(update_fields=["status"])
                Snapshot.objects.filter(run=run).delete()
            for decision in decisions:
                _record_decided_event(run, decision)
            transaction.on_commit(lambda: _notify_decided(run, decisions))
            return DecisionOutcome(
                run_id=run.id,
                tool_call_ids=decided_ids,
                decisions=decisions,
                run_status=run.status,
                after_seq=run.next_seq - 1,
                continue_agent_id=run.agent_id,
                continue_run_id=run.id,
            )
    except IntegrityError as exc:
        # Only reachable where row locks are not enforced: the unique constraint decided the race.
        run = Run.objects.filter(pk=run_id).first()
        winner = decision_for_call(run, requests[0].tool_call_id) if run is not None else None
        if winner is None:
            raise
        raise already_decided_error(winner) from exc


def _open_call(run: Run, open_calls: list[SuspendedToolCall], tool_call_id: str | None) -> SuspendedToolCall:
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
    return call


def _decide_call(
    run: Run,
    call: SuspendedToolCall,
    request: DecisionRequest,
    *,
    decided_by: Any,
    person: Any,
    via: str,
    details: dict | None = None,
) -> Decision:
    """Validate one decision against its open call and record it (the run is locked by the caller)."""
    kind = request.kind
    if person is not None and call.inner_agent_id and not access.can_decide_agent(person, call.inner_agent_id):
        # Deciding a surfaced sub-agent call runs the sub-agent's tool: its reviewers' call too.
        raise AgentRunError("PERMISSION_DENIED", f"You may not decide the tool calls of agent {call.inner_agent_id}.")
    if kind == "resume" and call.requires_approval:
        raise AgentRunError(
            "WRONG_DECISION_KIND", f"Tool call {call.tool_call_id} waits for approval: approve or decline it."
        )
    if kind in ("approve", "decline") and not call.requires_approval:
        raise AgentRunError("WRONG_DECISION_KIND", f"Tool call {call.tool_call_id} waits for resume data: resume it.")
    if request.args_fingerprint is not None:
        # The person approves what they saw: the call's arguments (or, for a surfaced sub-agent call,
        # the inner call's, which are what would run), unchanged since they were displayed.
        current = args_fingerprint(call.args)
        seen = {current, args_fingerprint(_inner_args(call))} if call.inner_run_id else {current}
        if request.args_fingerprint.lower() not in seen:
            raise AgentRunError(
                "ARGS_CHANGED",
                f"The arguments of tool call {call.tool_call_id} are not the ones you saw; review them again.",
                details={"toolCallId": call.tool_call_id, "argsFingerprint": current},
            )
    tool = _tool_for(run.agent_id, call)
    edited_args = None
    if kind == "approve" and request.args is not None:
        if tool is None:
            raise AgentRunError("ARGS_INVALID", f"tool {call.tool_name!r} is not registered")
        edited_args = tool.validate_args(request.args)
    resume_data = request.resume_data
    if kind == "resume" and tool is not None:
        resume_data = tool.validate_resume_data(resume_data)
    decision = _create_decision(
        run,
        call,
        kind=kind,
        via=via,
        edited_args=edited_args,
        resume_data=resume_data if kind == "resume" else None,
        reason=request.reason if kind != "resume" else None,
        decided_by=decided_by if getattr(decided_by, "pk", None) else None,
        decided_by_username=getattr(decided_by, "username", None)
        or (decided_by if isinstance(decided_by, str) else None),
        details=details,
    )
    call.status = SuspendedToolCall.Status.DECIDED
    call.decision = decision
    call.save(update_fields=["status", "decision"])
    return decision


def _create_decision(run: Run, call: SuspendedToolCall, *, kind: str, via: str, **fields: Any) -> Decision:
    """The audit record of one decision on one suspension of a call (the unique constraint's row), with
    the risk the call showed: a surfaced sub-agent call's row carries its inner call's risk."""
    decision = Decision.objects.create(
        run=run,
        agent_id=run.agent_id,
        thread_id=run.thread_id,
        tool_call_id=call.tool_call_id,
        tool_name=call.tool_name,
        suspension=call.suspension,
        args=call.args,
        risk=call.risk,
        waiting_since=call.created_at,  # the call's suspension began then (store.record_suspension)
        kind=kind,
        via=via,
        **fields,
    )
    _count(decision)
    return decision


def _count(decision: Decision) -> None:
    """For /metrics and traces (docs/operations.md): counted when the decision's transaction commits."""
    tracing.event("agentrun.decision", run_id=decision.run_id, tool_call_id=decision.tool_call_id, kind=decision.kind)
    metrics.decision_recorded(
        agent_id=decision.agent_id,
        tool_name=decision.tool_name,
        kind=decision.kind,
        via=decision.via,
        decided_at=decision.decided_at,
        waiting_since=decision.waiting_since,
    )


def _record_decided_event(run: Run, decision: Decision) -> None:
    outbox.record(outbox.TOOLCALL_DECIDED, agent_id=run.agent_id, run_id=run.id, data=decision.to_dict)


# --- standing grants ----------------------------------------------------------------------------
def matching_grant(run: Run, tool_name: str) -> StandingGrant | None:
    """The oldest live grant approving ``tool_name`` of this run's agent on its thread or resource."""
    scopes = Q(scope=StandingGrant.Scope.THREAD, scope_id=run.thread_id)
    if run.resource_id:
        scopes |= Q(scope=StandingGrant.Scope.RESOURCE, scope_id=run.resource_id)
    return (
        StandingGrant.objects.filter(scopes, agent_id=run.agent_id, tool_name=tool_name, revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))
        .order_by("created_at", "id")
        .first()
    )


def approve_by_grant(run: Run, *, tool_call_id: str, tool_name: str, args: Any, risk: str) -> Decision | None:
    """A call about to wait for approval that a standing grant covers is approved by it: the decision
    (``via`` policy, naming the grant, with the ``risk`` the call would have waited with) is recorded and
    the loop runs the tool at once. None: no grant."""
    grant = matching_grant(run, tool_name)
    if grant is None:
        return None
    with transaction.atomic():
        decision = Decision.objects.create(
            run=run,
            agent_id=run.agent_id,
            thread_id=run.thread_id,
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            args=args,
            risk=risk,
            kind=Decision.Kind.APPROVE,
            via=Decision.Via.POLICY,
            reason=f"Approved by standing grant {grant.id} ({grant.describe()}).",
            details={"policy": "grant", "grantId": grant.id, "scope": grant.scope, "scopeId": grant.scope_id},
        )
        _count(decision)
        _record_decided_event(run, decision)
    return decision


def carry_to_inner_run(*, inner_run_id: str, inner_tool_call_id: str, decision: Decision) -> None:
    """The supervisor's decision reaches the sub-agent's open call: that call carries the same decision
    (no second record). Idempotent: a retried continuation finds the call already decided."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=inner_run_id).first()
        if run is None:
            return
        call = SuspendedToolCall.objects.filter(
            run=run, tool_call_id=inner_tool_call_id, status=SuspendedToolCall.Status.OPEN
        ).first()
        if call is None:
            return
        call.status = SuspendedToolCall.Status.DECIDED
        call.decision = decision
        call.save(update_fields=["status", "decision"])
        if not SuspendedToolCall.objects.filter(run=run, status=SuspendedToolCall.Status.OPEN).exists():
            run.status = Run.Status.IN_PROGRESS
            run.save(update_fields=["status"])
            Snapshot.objects.filter(run=run).delete()
        transaction.on_commit(lambda: _notify_decided(run, [decision], tool_call_ids=[inner_tool_call_id]))


def _notify_decided(run: Run, decisions: list[Decision], tool_call_ids: list[str] | None = None) -> None:
    notify_approvals(
        "decided",
        runId=run.id,
        agentId=run.agent_id,
        threadId=run.thread_id,
        toolCallIds=tool_call_ids or [d.tool_call_id for d in decisions],
        decision=decisions[0].kind,
        decidedBy=decisions[0].decided_by_username,
    )


# --- expiry -------------------------------------------------------------------------------------
def expire_run_if_due(run_id: str, *, skip_locked: bool = False) -> bool:
    """Expire a waiting run whose TTL has passed (the sweeper does the same for every due run).
    ``skip_locked``: a run someone else holds locked is left alone (a sweeper; the next round sees it)."""
    if not Snapshot.objects.filter(run_id=run_id, expires_at__lte=timezone.now()).exists():
        return False
    with transaction.atomic():
        run = Run.objects.select_for_update(skip_locked=skip_locked).filter(pk=run_id).first()
        if run is None or run.status != Run.Status.SUSPENDED or not run.expires_at or run.expires_at > timezone.now():
            return False
        now = timezone.now()
        for call in SuspendedToolCall.objects.filter(run=run, status=SuspendedToolCall.Status.OPEN):
            _create_decision(
                run,
                call,
                kind=Decision.Kind.EXPIRE,
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
    outbox.record(f"run.{status}", agent_id=run.agent_id, run_id=run.id, data=run.to_dict)
    transaction.on_commit(
        lambda: notify_approvals("removed", runId=run.id, agentId=run.agent_id, threadId=run.thread_id)
    )


def due_runs(limit: int):  # noqa: ANN201 - a queryset of run ids
    """The ``limit`` most overdue waiting runs (on the partial index ``snapshot_expiry``)."""
    due = Snapshot.objects.filter(expires_at__lte=timezone.now()).order_by("expires_at")
    return due.values_list("run_id", flat=True)[:limit]


def expire_due_runs(limit: int = 100) -> int:
    """The sweep's expiry: several sweepers share the due runs, each skipping the runs another one
    holds (``SKIP LOCKED``) instead of waiting for them."""
    return sum(expire_run_if_due(run_id, skip_locked=True) for run_id in list(due_runs(limit)))


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


def cancel_on_timeout(*, run_id: str, tool_call_id: str, reason: str, details: dict) -> bool:
    """``on_timeout="cancel_run"``: the call nobody approved in time ends its run, cancelled. Every
    open call gets an ``expire`` decision ``via`` policy (naming the policy); a sub-agent's run takes
    the supervisor's runs waiting on it along. False if the call no longer waits."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        waiting = SuspendedToolCall.objects.filter(run_id=run_id, status=SuspendedToolCall.Status.OPEN)
        if run is None or run.status != Run.Status.SUSPENDED or not waiting.filter(tool_call_id=tool_call_id).exists():
            return False
        now = timezone.now()
        while run is not None and not run.is_final:
            for call in SuspendedToolCall.objects.filter(run=run, status=SuspendedToolCall.Status.OPEN):
                _create_decision(
                    run, call, kind=Decision.Kind.EXPIRE, via=Decision.Via.POLICY, reason=reason, details=details
                )
            _end_waiting_run(run, status=Run.Status.CANCELLED, step_status=RunStep.Status.CANCELLED, now=now)
            run = Run.objects.select_for_update().filter(pk=run.parent_run_id).first() if run.parent_run_id else None
    return True

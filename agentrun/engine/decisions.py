"""The decision transaction: approve / decline / resume suspended tool calls, exactly once, under the
rules of a safe decision. Also the other transitions a person, the system or a policy makes on a
waiting run: expiry, cancellation, a standing grant's approval, a timeout's cancellation.

Each is one atomic block that locks the run row (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite
transactions start IMMEDIATE, which serialises writers), re-checks the state it read, and writes, its
outbox event (``agentrun.core.outbox``) included. Unique constraints back the lock: a second decision on
one suspension, or a person's second approval of the same arguments, cannot exist.

The rules every door meets here, whatever it is (docs/api.md#decisions): the decider may decide the
agent (and a surfaced sub-agent's); the call still waits, on the suspension the decider saw; the
arguments are the ones the decider saw (``argsFingerprint``), and a high-risk approval from anywhere
but in-process Python must prove it (``FINGERPRINT_REQUIRED``); edits and resume data are valid;
a call that needs N approvals runs after N distinct people approved the same arguments (an edit starts
the count again, a decline ends it, the run's starter may be excluded). ``record_decisions`` writes in
the caller's transaction and nothing else: the one service every door calls
(``agentrun.engine.service``) wraps it with the continuation's enqueue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from agentrun.core import access, claims, metrics, outbox, prepared, receipts, tracing
from agentrun.core.errors import AgentRunError
from agentrun.core.fanout import notify_approvals
from agentrun.core.models import Decision, Run, RunStep, Snapshot, StandingGrant, SuspendedToolCall, args_fingerprint
from agentrun.core.timeutil import iso
from agentrun.engine.inputs import json_problem
from agentrun.engine.registry import get_agent
from agentrun.engine.tools import Tool
from agentrun.engine.types import (
    DECISION_KINDS,
    Decider,
    DecisionCommand,
    DecisionRequest,
)

__all__ = ["DecisionCommand", "DecisionOutcome", "DecisionRequest", "record_decisions"]


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
    # when the addressed call is a sub-agent's call surfaced there. Empty: nothing to carry out yet
    # (an approval towards a quorum that is not complete).
    continue_agent_id: str = ""
    continue_run_id: str = ""
    # Per tool call id, for calls that need more than one approval: ``{required, given: [...]}``.
    approvals: dict[str, dict] = field(default_factory=dict)

    @property
    def decision(self) -> Decision:
        return self.decisions[0]

    def to_dict(self) -> dict:
        """The 202 body of a single decision (docs/api.md#decisions)."""
        body: dict[str, Any] = {
            "runId": self.run_id,
            "toolCallId": self.tool_call_ids[0],
            "decision": self.decisions[0].kind,
            "status": self.run_status,
        }
        if self.tool_call_ids[0] in self.approvals:
            body["approvals"] = self.approvals[self.tool_call_ids[0]]
        return body

    def batch_dict(self) -> dict:
        """The 202 body of a batch (docs/api.md#batch-decisions)."""
        items = []
        for tool_call_id, d in zip(self.tool_call_ids, self.decisions, strict=True):
            item: dict[str, Any] = {"toolCallId": tool_call_id, "decision": d.kind}
            if tool_call_id in self.approvals:
                item["approvals"] = self.approvals[tool_call_id]
            items.append(item)
        return {"runId": self.run_id, "decisions": items, "status": self.run_status}


AUTOMATIC_DECIDERS = {Decision.Via.SYSTEM: "the system", Decision.Via.POLICY: "a policy"}


def already_decided_error(decision: Decision) -> AgentRunError:
    who = decision.decided_by_username or AUTOMATIC_DECIDERS.get(Decision.Via(decision.via), "someone")
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
    decided = Decision.objects.filter(completes=True)
    if tool_call_id is None:
        return decided.filter(run=run).order_by("-decided_at", "-id").first()
    call = SuspendedToolCall.objects.filter(run=run, tool_call_id=tool_call_id).select_related("decision").first()
    if call is not None and call.decision is not None:
        return call.decision
    own = decided.filter(run=run, tool_call_id=tool_call_id).order_by("-decided_at", "-id").first()
    if own is not None or run.parent_run_id is None:
        return own
    return (
        decided.filter(run_id=run.parent_run_id, tool_call_id=run.parent_tool_call_id)
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


def inner_call(call: SuspendedToolCall) -> SuspendedToolCall | None:
    """The sub-agent's open call that ``call`` (a supervisor's call) surfaces, if it does."""
    if not call.inner_run_id:
        return None
    return SuspendedToolCall.objects.filter(run_id=call.inner_run_id, tool_call_id=call.inner_tool_call_id).first()


def shown_args(call: SuspendedToolCall, inner: SuspendedToolCall | None) -> Any:
    """The arguments a person deciding ``call`` is shown, and approves: an earlier approver's edit still
    waiting for more approvals, else the surfaced sub-agent call's (what would run), else the call's."""
    if call.pending_args is not None:
        return call.pending_args
    return inner.args if inner is not None else call.args


def shown_fingerprint(call: SuspendedToolCall) -> str:
    """The ``argsFingerprint`` of what a person deciding ``call`` is shown (the listing's, the card's)."""
    return args_fingerprint(shown_args(call, inner_call(call)))


def _tool_for(agent_id: str, call: SuspendedToolCall, inner: SuspendedToolCall | None) -> Tool | None:
    """The tool whose schemas govern this call: the sub-agent's inner tool for a surfaced inner call."""
    if call.inner_agent_id and inner is not None:
        return get_agent(call.inner_agent_id).tools.get(inner.tool_name)
    return get_agent(agent_id).tools.get(call.tool_name)


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
    if request.suspension is not None and (
        isinstance(request.suspension, bool) or not isinstance(request.suspension, int)
    ):
        raise AgentRunError("INVALID_REQUEST", "suspension must be a whole number")


def _indexed(exc: AgentRunError, index: int | None) -> AgentRunError:
    if index is not None:
        exc.details = {**(exc.details or {}), "index": index}
    return exc


def _refuse_person(decider: Decider, agent_id: str) -> None:
    if decider.checked and not access.can_decide_agent(decider.user, agent_id):
        raise AgentRunError("PERMISSION_DENIED", f"You may not decide the tool calls of agent {agent_id}.")


def _surfacing_call(run: Run, tool_call_id: str | None) -> SuspendedToolCall | None:
    """The supervisor's open call that surfaces this sub-agent run's call, if it is one.

    Deciding an inner call is deciding the supervisor's call that shows it (docs/runs.md#sub-agents):
    one decision, and the supervisor's run goes on, whichever door the person used.
    """
    calls = SuspendedToolCall.objects.filter(
        run_id=run.parent_run_id, inner_run_id=run.pk, status=SuspendedToolCall.Status.OPEN
    )
    if tool_call_id is not None:
        calls = calls.filter(inner_tool_call_id=tool_call_id)
    return calls.select_related("run").first()


def record_decisions(command: DecisionCommand) -> DecisionOutcome:
    """Record the command's decisions on open calls of one run, all or none; or raise the error of the
    first rule it breaks having changed nothing (in a batch, ``details.index`` names the request).

    Runs in the caller's transaction (opened here if there is none; no savepoint inside the caller's:
    docs/performance.md, "Decision cycle and topology (third pass)"). Does not continue the run, and
    does not expire it: a run past its time to live raises ``RunDue`` having changed nothing, and the
    caller expires it in a transaction of its own (``expire_run_if_due``, as ``service.decide`` does).
    In the caller's transaction an ``IntegrityError`` (a race a unique constraint decided) reaches the
    caller, who explains it once its transaction is over (``integrity_error``).
    """
    requests = command.requests
    if not requests:
        raise AgentRunError("INVALID_REQUEST", "decisions must not be empty")
    for index, request in enumerate(requests):
        try:
            _check_request(request)
        except AgentRunError as exc:
            raise _indexed(exc, index if command.batch else None) from None
    ids = [r.tool_call_id for r in requests]
    if command.batch and (None in ids or len(set(ids)) != len(ids)):
        raise AgentRunError("INVALID_REQUEST", "each decision of a batch names a different toolCallId")
    # Checked first, so someone who may not decide learns nothing about the run.
    _refuse_person(command.decider, command.agent_id)
    if transaction.get_connection().in_atomic_block:
        return _record(command, may_be_surfaced=len(requests) == 1)
    try:
        with transaction.atomic():
            return _record(command, may_be_surfaced=len(requests) == 1)
    except IntegrityError as exc:
        raise integrity_error(command, exc) from exc


class RunDue(AgentRunError):
    """The run is past its time to live: nothing was recorded; expire it (in a transaction of its own)
    and the decision is refused (``RUN_NOT_SUSPENDED`` if nobody does)."""

    def __init__(self, run_id: str) -> None:
        super().__init__("RUN_NOT_SUSPENDED", f"Run {run_id} waited longer than its time to live.")
        self.run_id = run_id


def integrity_error(command: DecisionCommand, exc: IntegrityError) -> Exception:
    """What a unique constraint deciding a race means (outside the failed transaction): who won, or a
    person's second approval. Only reachable where row locks are not enforced."""
    run_row = Run.objects.filter(pk=command.run_id).first()
    winner = decision_for_call(run_row, command.requests[0].tool_call_id) if run_row is not None else None
    if winner is None:
        if command.requests[0].kind == "approve":
            return AgentRunError("ALREADY_APPROVED", "You already approved these arguments.")
        return exc
    return already_decided_error(winner)


def _record_on_surfacing_call(inner: Run, surfacing: SuspendedToolCall, command: DecisionCommand) -> DecisionOutcome:
    """A sub-agent's call (of ``inner``, locked) decided as the supervisor's call that surfaces it."""
    _refuse_person(command.decider, surfacing.run.agent_id)
    request = command.requests[0]
    if request.suspension is not None:
        # The suspension the decider saw is the inner call's: it must still be the one waiting.
        inner_call_row = SuspendedToolCall.objects.filter(run=inner, tool_call_id=surfacing.inner_tool_call_id).first()
        if inner_call_row is None or inner_call_row.suspension != request.suspension:
            raise _not_open_error(inner, request.tool_call_id)
    redirected = DecisionRequest(
        kind=request.kind,
        tool_call_id=surfacing.tool_call_id,
        args=request.args,
        reason=request.reason,
        resume_data=request.resume_data,
        args_fingerprint=request.args_fingerprint,
    )
    outer = _record(
        DecisionCommand(
            agent_id=surfacing.run.agent_id,
            run_id=surfacing.run_id,
            requests=(redirected,),
            decider=command.decider,
            batch=command.batch,
        )
    )
    if surfacing.tool_call_id in outer.approvals:
        outer.approvals[surfacing.inner_tool_call_id or ""] = outer.approvals.pop(surfacing.tool_call_id)
    outer.run_id = inner.pk
    outer.tool_call_ids = [surfacing.inner_tool_call_id or ""]
    if outer.continue_run_id:
        outer.run_status = Run.Status.IN_PROGRESS  # the supervisor's continuation resumes it
    outer.after_seq = inner.next_seq - 1
    return outer


def _record(command: DecisionCommand, *, may_be_surfaced: bool = False) -> DecisionOutcome:
    """``may_be_surfaced``: one request, which may name a sub-agent's call surfaced on its supervisor's
    run (the locked run tells: a sub-agent's run has a parent). The inner run is locked before the
    outer one, the order a timeout's cancellation locks them in too."""
    requests = command.requests
    # No savepoint: every error here fails the whole decision (record_decisions).
    with transaction.atomic(savepoint=False):
        run, open_calls = _locked_run_and_open_calls(command.run_id, command.agent_id)
        if run is None:
            raise AgentRunError("RUN_NOT_FOUND", f"No run {command.run_id} for agent {command.agent_id}.")
        if run.status == Run.Status.SUSPENDED and run.expires_at is not None and run.expires_at <= timezone.now():
            # Checked under the lock the decision takes anyway (no query of its own before it).
            raise RunDue(run.pk)
        if may_be_surfaced and run.parent_run_id is not None:
            surfacing = _surfacing_call(run, requests[0].tool_call_id)
            if surfacing is not None:
                return _record_on_surfacing_call(run, surfacing, command)
        decisions: list[Decision] = []
        # The decision's writes (its rows, the calls', the run's) are made once every rule was checked,
        # then the decisions sealed. One statement each, in this order: the counters' triggers (the
        # decisions' rollup, the waiting calls', the listing's) lock their rows in the order every
        # writer takes them, so that decisions, suspensions and cancellations never deadlock.
        writes: list[prepared.Statement] = []
        decided_ids: list[str] = []
        approvals: dict[str, dict] = {}
        for index, request in enumerate(requests):
            try:
                call = _open_call(run, open_calls, request.tool_call_id)
                decision, progress = _decide_call(run, call, request, command.decider, writes)
            except AgentRunError as exc:
                raise _indexed(exc, index if command.batch else None) from None
            decisions.append(decision)
            decided_ids.append(call.tool_call_id)
            if progress is not None:
                approvals[call.tool_call_id] = progress
            if decision.completes:
                open_calls.remove(call)
        completed = [d for d in decisions if d.completes]
        if completed and not open_calls:
            # The last open call is decided: the run stops waiting, its snapshot goes.
            run.status = Run.Status.IN_PROGRESS
            writes.append(prepared.table(Run).update_statement(run, ["status"]))
            writes.append(prepared.table(Snapshot).delete_statement('"run_id" = %s', [run.pk]))
        prepared.execute_all(writes)
        for decision in decisions:
            receipts.seal(decision)  # its signed receipt, in this transaction (docs/security.md, "Audit receipts")
        for decision in decisions:
            _record_decided_event(run, decision, approvals.get(decision.tool_call_id))
        transaction.on_commit(lambda: _notify_decided(run, decisions))
        return DecisionOutcome(
            run_id=run.id,
            tool_call_ids=decided_ids,
            decisions=decisions,
            run_status=run.status,
            after_seq=run.next_seq - 1,
            continue_agent_id=run.agent_id if completed else "",
            continue_run_id=run.id if completed else "",
            approvals=approvals,
        )


def _locked_run_and_open_calls(run_id: str, agent_id: str) -> tuple[Run | None, list[SuspendedToolCall]]:
    """The run, locked (``FOR UPDATE`` where the database has it: SQLite's writers serialise anyway),
    then its open calls in (position, id) order, by SQL written once (agentrun.core.prepared): on
    every decision's path. Two statements, not one with a join: under PostgreSQL's READ COMMITTED a
    statement that waited for the lock reads the joined rows as they were when it began, so a
    decision committed meanwhile on another call of the run would not be seen; the second statement
    reads them once the lock is held."""
    found = prepared.table(Run).rows('"id" = %s AND "agent_id" = %s', [run_id, agent_id], lock=True)
    if not found:
        return None, []
    calls = prepared.table(SuspendedToolCall).rows(
        '"run_id" = %s AND "status" = %s', [run_id, SuspendedToolCall.Status.OPEN], order='"position", "id"'
    )
    return found[0], calls


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
    run: Run, call: SuspendedToolCall, request: DecisionRequest, decider: Decider, writes: list[prepared.Statement]
) -> tuple[Decision, dict | None]:
    """Check one decision against its open call under every rule, and make its record (the run is
    locked by the caller): its writes are added to ``writes``, which the caller runs, then seals the
    decision. Returns the decision and, for a call that needs several approvals, the progress."""
    kind = request.kind
    if call.inner_agent_id:
        # Deciding a surfaced sub-agent call runs the sub-agent's tool: its reviewers' call too.
        _refuse_person(decider, call.inner_agent_id)
    if kind == "resume" and call.requires_approval:
        raise AgentRunError(
            "WRONG_DECISION_KIND", f"Tool call {call.tool_call_id} waits for approval: approve or decline it."
        )
    declined_question = kind == "decline" and request.declines_question and not call.requires_approval
    if kind in ("approve", "decline") and not call.requires_approval and not declined_question:
        raise AgentRunError("WRONG_DECISION_KIND", f"Tool call {call.tool_call_id} waits for resume data: resume it.")
    if request.suspension is not None and request.suspension != call.suspension:
        # The decider saw an earlier suspension of this call (a link, a chat message): it was decided,
        # and what waits now is something they have not seen.
        raise _stale_suspension_error(run, call, request.suspension)
    inner = inner_call(call)
    shown = shown_args(call, inner)
    current = args_fingerprint(shown)
    if request.args_fingerprint is not None and request.args_fingerprint.lower() != current:
        raise AgentRunError(
            "ARGS_CHANGED",
            f"The arguments of tool call {call.tool_call_id} are not the ones you saw; review them again.",
            details={"toolCallId": call.tool_call_id, "argsFingerprint": current},
        )
    tool = _tool_for(run.agent_id, call, inner)
    edited_args = None
    if kind == "approve" and request.args is not None:
        if tool is None:
            raise AgentRunError("ARGS_INVALID", f"tool {call.tool_name!r} is not registered")
        edited_args = tool.validate_args(request.args)
    resume_data = request.resume_data
    if kind == "resume" and tool is not None:
        resume_data = tool.validate_resume_data(resume_data)
    if (
        call.risk == SuspendedToolCall.Risk.HIGH
        and kind in ("approve", "resume")
        and decider.via != Decision.Via.PYTHON
        and request.args_fingerprint is None
    ):
        # Proof of sight: whoever approves a high-risk call from a door says what they were shown.
        raise AgentRunError(
            "FINGERPRINT_REQUIRED",
            f"Tool call {call.tool_call_id} is high risk: send the argsFingerprint of the arguments you approve.",
            details={"toolCallId": call.tool_call_id},
        )
    completes, progress = True, None
    progress_given: list[dict] = []
    if kind == "approve":
        completes, progress_given = _count_approval(run, call, decider, current, edited_args)
        if call.approvals_required > 1:
            progress = {"required": call.approvals_required, "given": progress_given}
    details = dict(decider.details) if decider.details is not None else None
    # Someone else was on this call: never a reason to refuse, but the record says so
    # (docs/dashboard.md#shared-work).
    if claim := claims.claim_on_decision(call, decider.username):
        details = {**(details or {}), "claim": claim}
    decision = _create_decision(
        run,
        call,
        kind=kind,
        via=decider.via,
        inner=inner or False,
        shown_fingerprint=current,
        edited_args=edited_args,
        resume_data=resume_data if kind == "resume" else None,
        reason=request.reason if kind != "resume" else None,
        decided_by=decider.user,
        decided_by_username=decider.username,
        details=details,
        completes=completes,
        writes=writes,
    )
    if progress is not None:
        progress_given.append({"decidedBy": decision.decided_by_username, "decidedAt": iso(decision.decided_at)})
    if completes:
        call.status = SuspendedToolCall.Status.DECIDED
        call.decision = decision
        fields = ["status", "decision", *claims.clear_on_decision(call)]
        writes.append(prepared.table(SuspendedToolCall).update_statement(call, fields))
    elif edited_args is not None:
        # The next approver sees, and approves, this edit: the count started again with it.
        call.pending_args = edited_args
        writes.append(prepared.table(SuspendedToolCall).update_statement(call, ["pending_args"]))
    return decision, progress


def _stale_suspension_error(run: Run, call: SuspendedToolCall, seen: int) -> AgentRunError:
    decided = Decision.objects.filter(run=run, tool_call_id=call.tool_call_id, suspension=seen, completes=True).first()
    if decided is not None:
        return already_decided_error(decided)
    return AgentRunError(
        "ARGS_CHANGED",
        f"Tool call {call.tool_call_id} waits on something else than what you saw; review it again.",
        details={"toolCallId": call.tool_call_id},
    )


def _approver(decision: Decision) -> str:
    """Who counts as one approver (``Decider.identity`` of the decider who made ``decision``)."""
    return f"user:{decision.decided_by_id}" if decision.decided_by_id else f"name:{decision.decided_by_username}"


def _count_approval(
    run: Run, call: SuspendedToolCall, decider: Decider, shown_fingerprint: str, edited_args: Any
) -> tuple[bool, list[dict]]:
    """Whether this approval completes the call's quorum, and the approvals given before it that count:
    those of distinct people on the same arguments (an edit starts the count again)."""
    if (
        not settings.AGENTRUN_SELF_APPROVAL
        and decider.user is not None
        and run.started_by_id is not None
        and decider.user.pk == run.started_by_id
    ):
        raise AgentRunError(
            "PERMISSION_DENIED",
            "You started this run: another person must approve its calls (separation of duties).",
            details={"toolCallId": call.tool_call_id},
        )
    if call.approvals_required <= 1:
        return True, []
    approved = args_fingerprint(edited_args) if edited_args is not None else shown_fingerprint
    earlier = Decision.objects.filter(
        run=run, tool_call_id=call.tool_call_id, suspension=call.suspension, kind=Decision.Kind.APPROVE, completes=False
    ).order_by("decided_at", "id")
    counted = [d for d in earlier if d.approved_fingerprint == approved]
    if decider.identity in {_approver(d) for d in counted}:
        raise AgentRunError(
            "ALREADY_APPROVED",
            f"You already approved these arguments of tool call {call.tool_call_id}; another person must approve.",
            details={"toolCallId": call.tool_call_id, "approvalsRequired": call.approvals_required},
        )
    given = [{"decidedBy": d.decided_by_username, "decidedAt": iso(d.decided_at)} for d in counted]
    return len(counted) + 1 >= call.approvals_required, given


def approvals_given(call: SuspendedToolCall) -> list[Decision]:
    """The approvals that count towards ``call``'s quorum now (on the arguments it shows)."""
    if call.approvals_required <= 1:
        return []
    current = args_fingerprint(shown_args(call, inner_call(call)))
    earlier = Decision.objects.filter(
        run_id=call.run_id,
        tool_call_id=call.tool_call_id,
        suspension=call.suspension,
        kind=Decision.Kind.APPROVE,
        completes=False,
    ).order_by("decided_at", "id")
    return [d for d in earlier if d.approved_fingerprint == current]


def _inner_fields(call: SuspendedToolCall, inner: SuspendedToolCall | None) -> dict[str, Any]:
    """What a decision records of the sub-agent call the reviewer saw."""
    if not call.inner_run_id:
        return {}
    return {
        "inner_agent_id": call.inner_agent_id,
        "inner_run_id": call.inner_run_id,
        "inner_tool_call_id": call.inner_tool_call_id,
        "inner_tool_name": inner.tool_name if inner is not None else None,
        "inner_args": inner.args if inner is not None else None,
    }


def _create_decision(
    run: Run,
    call: SuspendedToolCall,
    *,
    kind: str,
    via: str,
    inner: SuspendedToolCall | None | bool = True,
    shown_fingerprint: str | None = None,
    writes: list[prepared.Statement] | None = None,
    **fields: Any,
) -> Decision:
    """The audit record of one decision on one suspension of a call — every decision on a waiting call
    is created here (a person's, a policy's, expiry's): with the risk and the arguments the call showed
    (a surfaced sub-agent call's inner call), and counted for /metrics. ``inner`` / ``shown_fingerprint``:
    given when the caller read them already (True: read them here). ``writes``: its INSERT is added
    there, for the caller to run and then seal the decision; else it is inserted and sealed here."""
    if inner is True:
        inner = inner_call(call)
    inner = inner or None
    decision = Decision(
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
        args_fingerprint=shown_fingerprint or args_fingerprint(shown_args(call, inner)),
        **_inner_fields(call, inner),
        **fields,
    )
    insert = prepared.table(Decision).insert_statement([decision])
    if writes is not None:
        writes.append(insert)
    else:
        prepared.execute(insert.sql, insert.params)
        receipts.seal(decision)  # its signed receipt, in this transaction (docs/security.md, "Audit receipts")
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


def _record_decided_event(run: Run, decision: Decision, progress: dict | None = None) -> None:
    if decision.completes:
        outbox.record(outbox.TOOLCALL_DECIDED, agent_id=run.agent_id, run_id=run.id, data=decision.to_dict)
    else:
        # One person's approval of a call that needs more: webhooks show the progress.
        outbox.record(
            outbox.APPROVAL_GIVEN,
            agent_id=run.agent_id,
            run_id=run.id,
            data=lambda: {**decision.to_dict(), "approvals": progress},
        )


# --- standing grants ----------------------------------------------------------------------------
DEFAULT_GRANT_DAYS = 30


def grant_expiry(expires_in: float | None) -> datetime:
    """When a grant made now expires: ``expires_in`` seconds (default 30 days), at most
    ``AGENTRUN_GRANT_MAX_DAYS``. A grant never lasts for ever (docs/runs.md#decisions)."""
    longest = settings.AGENTRUN_GRANT_MAX_DAYS * 86400
    if expires_in is None:
        expires_in = min(DEFAULT_GRANT_DAYS * 86400, longest)
    if isinstance(expires_in, bool) or not isinstance(expires_in, int | float) or not 0 < expires_in <= longest:
        raise AgentRunError(
            "INVALID_REQUEST",
            f"A grant lasts between a second and {settings.AGENTRUN_GRANT_MAX_DAYS} days.",
            details={"field": "expiresIn", "maxSeconds": longest},
        )
    return timezone.now() + timedelta(seconds=expires_in)


def grantable_tool(agent_id: str, tool_name: str) -> Tool:
    """The tool a grant would approve, refused when no grant may cover it: a high-risk tool (nobody
    would see the call), a tool whose calls need several approvals, or one that asks for no approval."""
    tool = get_agent(agent_id).tools.get(tool_name)
    if tool is None:
        raise AgentRunError("INVALID_REQUEST", f"Agent {agent_id} has no tool {tool_name!r}.")
    if tool.risk == "high":
        raise AgentRunError("INVALID_REQUEST", f"{tool_name} is high risk: a grant never approves it.")
    if (tool.approvals_required or get_agent(agent_id).approvals_required) > 1:
        raise AgentRunError("INVALID_REQUEST", f"{tool_name} needs several approvals: a grant never approves it.")
    if not tool.requires_approval:
        raise AgentRunError("INVALID_REQUEST", f"{tool_name} does not wait for approval: nothing to grant.")
    return tool


def check_grant(grant: StandingGrant, decider: Decider) -> None:
    """Whether ``decider`` may make (or revoke) ``grant``: a person allowed to decide its agent, for a
    tool a grant may cover, with an expiry within bounds. Raises having changed nothing."""
    if not decider.checked:
        raise AgentRunError("PERMISSION_DENIED", "Only a person may grant.")
    _refuse_person(decider, grant.agent_id)
    grantable_tool(grant.agent_id, grant.tool_name)
    if grant.scope not in StandingGrant.Scope.values:
        raise AgentRunError("INVALID_REQUEST", f"scope must be thread or resource, not {grant.scope!r}")
    if not grant.scope_id:
        raise AgentRunError("INVALID_REQUEST", "a grant names the thread or resource it covers")


def create_grant(grant: StandingGrant, decider: Decider) -> StandingGrant:
    """Record a standing grant made by a person (the dashboard, the admin): checked, with its expiry."""
    check_grant(grant, decider)
    if grant.expires_at is None:
        grant.expires_at = grant_expiry(None)
    elif grant.expires_at > timezone.now() + timedelta(days=settings.AGENTRUN_GRANT_MAX_DAYS):
        raise AgentRunError("INVALID_REQUEST", f"A grant lasts at most {settings.AGENTRUN_GRANT_MAX_DAYS} days.")
    grant.created_by = decider.user  # type: ignore[assignment]  # a person: checked above
    grant.created_by_username = decider.username
    grant.save()
    return grant


def revoke_grant(grant: StandingGrant, decider: Decider) -> bool:
    """Revoke a live grant (False if it was revoked already): a person who may decide its agent."""
    if decider.checked:
        _refuse_person(decider, grant.agent_id)
    return bool(
        StandingGrant.objects.filter(pk=grant.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by_username=decider.username
        )
    )


def _grant_still_trusted(grant: StandingGrant, run: Run) -> bool:
    """A grant works only while its creator may still decide every agent the call belongs to (a
    sub-agent's run: its supervisors' too): someone who left the reviewers, or was deactivated, grants
    nothing any more."""
    creator = grant.created_by
    if creator is None or not creator.is_active:
        return False
    agent_ids = {run.agent_id}
    parent_id = run.parent_run_id
    while parent_id:
        parent = Run.objects.filter(pk=parent_id).values("agent_id", "parent_run_id").first()
        if parent is None:
            break
        agent_ids.add(parent["agent_id"])
        parent_id = parent["parent_run_id"]
    return all(access.can_decide_agent(creator, agent_id) for agent_id in agent_ids)


_LIVE_GRANTS: dict[str, str] = {}


def matching_grant(run: Run, tool_name: str) -> StandingGrant | None:
    """The oldest live grant approving ``tool_name`` of this run's agent on its thread or resource whose
    creator may still decide it. (Read on every call that waits for approval: SQL written once,
    ``agentrun.core.prepared``.)"""
    grants, users = prepared.table(StandingGrant), prepared.table(get_user_model())
    vendor = prepared.connection().vendor
    if vendor not in _LIVE_GRANTS:
        g = grants.name
        agent, tool, scope, scope_id, revoked, expires, created_by = (
            f"{g}.{grants.column(n)}"
            for n in ("agent_id", "tool_name", "scope", "scope_id", "revoked_at", "expires_at", "created_by")
        )
        _LIVE_GRANTS[vendor] = (
            f"SELECT {grants.select}, {users.select} FROM {g} LEFT OUTER JOIN {users.name} "
            f"ON {users.name}.{users.column('id')} = {created_by} WHERE {agent} = %s AND {tool} = %s "
            f"AND {revoked} IS NULL AND ({expires} IS NULL OR {expires} > %s) "
            f"AND (({scope} = %s AND {scope_id} = %s) OR ({scope} = %s AND {scope_id} = %s)) "
            f"ORDER BY {g}.{grants.column('created_at')}, {g}.{grants.column('id')}"
        )
    params = [
        run.agent_id,
        tool_name,
        grants.prep("expires_at", timezone.now()),
        StandingGrant.Scope.THREAD,
        run.thread_id,
        StandingGrant.Scope.RESOURCE,
        run.resource_id or None,  # no resource: no grant of a resource applies
    ]
    live = []
    after = len(grants.fields)
    for row in prepared.fetch(_LIVE_GRANTS[vendor], params):
        grant = grants.instance(row)
        grant.created_by = users.instance(row, after) if row[after] is not None else None
        live.append(grant)
    return next((g for g in live if _grant_still_trusted(g, run)), None)


def approve_by_grant(
    run: Run, *, tool_call_id: str, tool_name: str, args: Any, risk: str, approvals_required: int
) -> Decision | None:
    """A call about to wait for approval that a standing grant covers is approved by it: the decision
    (``via`` policy, naming the grant, with the ``risk`` the call would have waited with) is recorded and
    the loop runs the tool at once. None: no grant — and never for a high-risk call or one that needs
    several people, whatever a grant says."""
    if risk == SuspendedToolCall.Risk.HIGH or approvals_required > 1:
        return None
    grant = matching_grant(run, tool_name)
    if grant is None:
        return None
    decider = Decider.policy({"policy": "grant", "grantId": grant.id, "scope": grant.scope, "scopeId": grant.scope_id})
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
            via=decider.via,
            reason=f"Approved by standing grant {grant.id} ({grant.describe()}).",
            details=dict(decider.details or {}),
            args_fingerprint=args_fingerprint(args),
        )
        receipts.seal(decision)
        _count(decision)
        _record_decided_event(run, decision)
    return decision


def carry_to_inner_run(*, inner_run_id: str, inner_tool_call_id: str, decision: Decision, pending_args: Any) -> None:
    """The supervisor's decision reaches the sub-agent's open call: that call carries the same decision
    (no second record), with the arguments approved by a quorum after an edit (``pending_args``).
    Idempotent: a retried continuation finds the call already decided."""
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
        call.pending_args = pending_args
        call.save(update_fields=["status", "decision", "pending_args"])
        if not SuspendedToolCall.objects.filter(run=run, status=SuspendedToolCall.Status.OPEN).exists():
            run.status = Run.Status.IN_PROGRESS
            run.save(update_fields=["status"])
            Snapshot.objects.filter(run=run).delete()
        transaction.on_commit(lambda: _notify_decided(run, [decision], tool_call_ids=[inner_tool_call_id]))


def args_to_run(call: SuspendedToolCall, decision: Decision) -> Any:
    """The arguments a decided call runs with: the deciding approver's edit, else the edit the quorum
    approved, else the call's own."""
    if decision.edited_args is not None:
        return decision.edited_args
    return call.pending_args if call.pending_args is not None else call.args


def _notify_decided(run: Run, decisions: list[Decision], tool_call_ids: list[str] | None = None) -> None:
    last = decisions[-1]
    notify_approvals(
        "decided" if any(d.completes for d in decisions) else "approval",
        runId=run.id,
        agentId=run.agent_id,
        threadId=run.thread_id,
        toolCallIds=tool_call_ids or [d.tool_call_id for d in decisions],
        decision=last.kind,
        decidedBy=last.decided_by_username,
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

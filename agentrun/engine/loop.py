"""The agent loop. One ``Segment`` drives a run from where it rests until it rests again.

A run is made of segments: ``stream()`` starts the first, every approve/decline/resume starts another.
A segment holds the run's lease (one driver at a time, across processes), applies decided tool calls,
then calls the model and runs tools until the run completes, fails, or waits for people again.
Chunks are numbered by the segment's ``ChunkLog`` and end with exactly one ``finish``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from agentrun.core import logcontext, metrics, tracing
from agentrun.core.chunks import Chunk, ChunkType
from agentrun.core.errors import AgentRunError
from agentrun.core.fanout import TAKEOVER_CODE, RunPublisher
from agentrun.core.ids import new_id
from agentrun.core.models import Decision, Run, RunStep, SuspendedToolCall
from agentrun.core.outages import INFRASTRUCTURE_ERRORS
from agentrun.engine import background, faults, store
from agentrun.engine.chunklog import ChunkLog, LeaseLost
from agentrun.engine.decisions import approve_by_grant, args_to_run, carry_to_inner_run
from agentrun.engine.inputs import decode_model_args
from agentrun.engine.lease import RunLease
from agentrun.engine.providers import ModelError, ModelFinish, ModelToolCall, TextDelta, usage_dict
from agentrun.engine.registry import get_agent
from agentrun.engine.runtime import db
from agentrun.engine.tools import InnerRunSuspended, Tool, ToolContext, ToolSuspended
from agentrun.engine.types import AgentSpec, InnerCall, OpenCall, OutcomeStatus, Waiting

logger = logging.getLogger("agentrun.engine")

DEFAULT_DECLINE_REASON = "Tool call was not approved by the user"
DECLINED_QUESTION = "Declined: the user chose not to answer this question"
# The finish a segment's taker writes for the segment its dead predecessor left open (README
# "Production"): the run is not failed, it goes on in the taker's segment right after.
TAKEOVER_FINISH = {
    "finishReason": "error",
    "usage": usage_dict(0, 0),
    "error": {
        "code": TAKEOVER_CODE,
        "message": "The process driving this segment stopped; the run continues in the next segment.",
    },
}


@dataclass
class Outcome:
    """How one tool call ended: ``ok``, ``error``, ``denied`` (with an output), or ``suspended`` (then
    ``waiting`` says for what)."""

    status: OutcomeStatus
    output: str = ""
    result: Any = None
    waiting: Waiting | None = None
    background_task_id: str | None = None


@dataclass
class SegmentResult:
    finish_reason: str
    first_text: str = ""  # the text of every model call of the segment (the turn), joined
    tool_calls: list[dict] = field(default_factory=list)
    usage: dict = field(default_factory=lambda: usage_dict(0, 0))


class Segment:
    def __init__(
        self,
        agent: AgentSpec,
        run_id: str,
        sinks: list | None = None,
        *,
        directive: str | None = None,
        only_if_needed: bool = False,
        lease_owner: str | None = None,
        created: Run | None = None,
    ) -> None:
        self.agent = agent
        self.lease_owner = lease_owner  # a lease this process held for the run (a retry after an outage)
        self.created = created  # the run, just created with its lease (lease.create_run_to_drive)
        self.only_if_needed = only_if_needed
        self.run_id = run_id
        self.publisher = RunPublisher(run_id)
        self.sinks = [*(sinks or []), self.publisher]
        # A continuation turn after background tasks starts with a system message naming them.
        self.directive = directive
        self.result = SegmentResult(finish_reason="stop")
        self.finished = False  # the segment's finish is emitted
        self.waited = True  # the run may have a snapshot: it was suspended, or suspended in this segment

    def emit(self, type_: ChunkType, payload: dict, *, hold: bool = False) -> Chunk:
        return self.log.emit(type_, payload, hold=hold)

    def _emit_finish(self, reason: str) -> None:
        """The segment's one finish, held for the write that ends the segment: it is logged with the
        state it announces (an answer, a suspension, a failure), never after it (README "Production")."""
        self.result.finish_reason = reason
        self.emit("finish", {"finishReason": reason, "usage": self.result.usage}, hold=True)
        self.finished = True

    async def _write(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A store write that logs the chunks emitted so far (held ones included) in its transaction."""
        try:
            result = await db(fn)(*args, **kwargs)
        except BaseException:
            if any(c["type"] == "finish" for c in self.log.rolled_back()):
                self.finished = False  # the segment's finish went with the failed write
            raise
        self.log.committed()
        return result

    async def _flush(self) -> None:
        await self._write(self.log.flush_sync)

    async def _write_last(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """The segment's last write: it releases the lease in its own UPDATE of the run."""
        await self._write(fn, *args, release=True, **kwargs)
        self.lease.released = True

    # --- the segment ----------------------------------------------------------------------------
    async def run(self) -> SegmentResult:
        with logcontext.bound(agent_id=self.agent.id, run_id=self.run_id):
            return await self._run()

    async def _run(self) -> SegmentResult:
        # The lease taken, the run read (and started, if queued) by one statement; the calls to carry
        # out read (the first marked executing) in the same trip to the database thread.
        # A run just created with its lease is driven as it is (nothing to read: it just started).
        async with RunLease(
            self.run_id, self.lease_owner, drive=True, then=store.calls_to_carry_out, taken=self.created
        ) as lease:
            self.lease = lease
            run = lease.loaded
            calls, marked = lease.read or ([], None)
            self.waited = run.status == Run.Status.SUSPENDED
            self.log = ChunkLog(run.id, run.next_seq, self.sinks, owner=lease.owner)
            if run.segment_open:
                # Taken over: the previous driver died mid-segment (its lease lapsed). Close its segment
                # first, so every reader of the log sees exactly one finish per segment (docs/api.md#chunks).
                logger.warning("run %s: closing the segment of a driver that died", run.id)
                self.emit("finish", TAKEOVER_FINISH, hold=True)
                await self._flush()
            if self.only_if_needed and not store.needs_driving(run, calls):
                self.result.finish_reason = _finish_reason_for(run.status)
                await self.publisher.aclose()
                return self.result
            self.emit("start", {"runId": run.id, "agentId": run.agent_id, "threadId": run.thread_id})
            try:
                reason = await self._drive(run, starting=run.started_now, records=calls, marked=marked)
            except (*INFRASTRUCTURE_ERRORS, LeaseLost) as exc:  # type: ignore[misc]  # a tuple of classes
                # Not the run's fault (a database or Redis restart, a dropped connection, a stall past
                # the lease): the run is not failed. The lease is kept (or is another's); the run is
                # continued from its last committed state by dispatch.continue_run's retry or by a
                # sweep once the lease lapses (an approved call still ``executing`` re-runs with the
                # same id; docs/operations.md "Outages").
                logger.warning("run %s stopped (%s: %s); it will be continued", self.run_id, type(exc).__name__, exc)
                raise
            except Exception as exc:  # a bug or a crash in a tool wrapper: record it, never swallow it
                logger.exception("run %s failed", self.run_id)
                reason = "error"
                if not self.finished:  # else what failed came after the segment's end was logged
                    error = {"code": "server_error", "message": f"{type(exc).__name__}: {exc}"}
                    self.emit("error", {"error": error}, hold=True)
                    self._emit_finish(reason)
                    await self._write(store.fail_run_sync, run, error, self.log)
            if not self.finished:  # nothing this segment wrote ended it (a cancelled run, say)
                self._emit_finish(reason)
                await self._flush()
            await self.publisher.aclose()
        return self.result

    async def _drive(self, run: Run, *, starting: bool, records: list[SuspendedToolCall], marked: int | None) -> str:
        """``starting``: the lease's statement started the run just now (it was queued): it has no calls
        or steps yet, and its status was just read. ``records`` / ``marked``: ``store.calls_to_carry_out``."""
        if run.is_final:
            return _finish_reason_for(run.status)
        if not starting:
            open_calls, steps_done = await self._apply_decisions(run, records, marked)
            if run.is_final:
                return _finish_reason_for(run.status)
            if open_calls:
                return "suspended"
            # The step of the calls just carried out completed with its last output; otherwise (a run
            # taken over, say) look for a step left in progress.
            step = None if steps_done else await db(store.pending_tool_step)(run.id)
            if step is not None:
                if store.step_outputs_complete(step):
                    await db(store.complete_tool_step)(step.id)
                else:
                    # Calls its driver never carried out (it stopped before their results: a crash,
                    # an outage): they run now, with the same ids; those that need people wait.
                    calls = [ModelToolCall(c["id"], c["name"], c["args"]) for c in store.calls_without_output(step)]
                    granted = await db(store.approved_call_ids)(run.id, [c.id for c in calls])
                    opens = await self._run_tool_calls(
                        run, step, calls, positions=store.positions(step), approved=granted
                    )
                    if opens:
                        return await self._suspend(run, step.id, opens, usage=usage_dict(0, 0))
        if self.directive:
            await db(store.add_message)(run, role="system", content=self.directive)
        return await self._model_loop(run, status_known=starting)

    # --- decided calls --------------------------------------------------------------------------
    async def _apply_decisions(
        self, run: Run, read: list[SuspendedToolCall] | None, marked: int | None
    ) -> tuple[bool, bool]:
        """Carry out the decided calls, and those decided meanwhile. Returns (calls are still open,
        calls were carried out and every step they belong to is complete). ``read``: the call records
        read with the lease, ``marked``: the one of them marked executing then."""
        steps: dict[str, RunStep] = {}  # one copy per step: each call of a step writes its own output
        while True:
            calls = read if read is not None else await db(store.waiting_calls)(run.id)
            read = None
            decided = [c for c in calls if c.status != SuspendedToolCall.Status.OPEN]
            if not decided:
                done = bool(steps) and all(s.status == RunStep.Status.COMPLETED for s in steps.values())
                return bool(calls), done
            # Calls decided while these ran can only be calls open now: with none, there is nothing to
            # read again afterwards (one query less per continuation, docs/performance.md).
            read_again = len(decided) < len(calls)
            for call in decided:
                # Loaded with the batch: a call that no longer waits (its run was cancelled while an
                # earlier one ran) is not carried out, and what is left is read again.
                if call.pk != marked and not await db(store.mark_executing)(call):
                    read_again = True
                    break
                marked = None
                if await self._apply_decision(run, call, steps.setdefault(call.step_id, call.step)):
                    read_again = True  # it suspended again: open, and decidable, from now on
            if not read_again:
                done = all(s.status == RunStep.Status.COMPLETED for s in steps.values())
                return False, done

    async def _apply_decision(self, run: Run, call: SuspendedToolCall, step: RunStep) -> bool:
        """Carry out one decided call; True when it suspended again (it waits once more)."""
        decision = call.decision
        assert decision is not None  # waiting_calls() loads decided calls only here
        metrics.continuation_started(agent_id=run.agent_id, decided_at=decision.decided_at)
        payload_call = {"id": call.tool_call_id, "name": call.tool_name}
        args = args_to_run(call, decision)
        if decision.kind == Decision.Kind.DECLINE and not call.inner_run_id and not call.requires_approval:
            # A question the person declined to answer (docs/dashboard.md#cards): the tool is not asked
            # again; the model reads a clear refusal.
            said = f": {decision.reason}" if decision.reason else " (no reason given)"
            outcome = Outcome("denied", output=f"{DECLINED_QUESTION}{said}")
        elif decision.kind == Decision.Kind.DECLINE and not call.inner_run_id:
            reason = decision.reason or DEFAULT_DECLINE_REASON
            outcome = Outcome("denied", output=reason)
        elif call.inner_run_id:
            outcome = await self._decide_inner(call, decision)
        else:
            tool = self.agent.tools[call.tool_name]
            ctx = self._context(run, call.tool_call_id)
            if decision.kind == Decision.Kind.RESUME:
                ctx.resume_data = decision.resume_data
            outcome = await self._execute(tool, args, ctx)
        if outcome.status == "suspended":
            assert outcome.waiting is not None
            opened = OpenCall.of(
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                args=call.args,
                position=call.position,
                risk=call.risk,  # type: ignore[arg-type]  # a SuspendedToolCall.Risk value
                waiting=outcome.waiting,
            )
            self._emit_open(opened)
            self.waited = True
            await self._write(
                store.record_suspension,
                run,
                call.step_id,
                self.log,
                opens=[opened],
                ttl=store.suspended_run_ttl(self.agent.suspended_run_ttl),
            )
            return True
        await self._record(run, step, payload_call, args, outcome, decision=decision)
        return False

    async def _decide_inner(self, call, decision: Decision) -> Outcome:
        """A surfaced sub-agent call was decided: its inner call carries out the same decision."""
        inner_agent = get_agent(call.inner_agent_id)
        await db(carry_to_inner_run)(
            inner_run_id=call.inner_run_id,
            inner_tool_call_id=call.inner_tool_call_id,
            decision=decision,
            pending_args=call.pending_args,
        )
        await Segment(inner_agent, call.inner_run_id).run()
        return await inner_outcome(inner_agent, call.inner_run_id)

    # --- the model loop -------------------------------------------------------------------------
    async def _model_loop(self, run: Run, *, status_known: bool = False) -> str:
        """``status_known``: the run's status was read just now (no need to ask whether it was cancelled)."""
        max_steps = run.options.get("max_steps") or self.agent.max_steps
        while True:
            # The run's last fenced write says whether it was cancelled meanwhile (its UPDATE returns the
            # status): no query of its own, unless nothing was written since the segment began.
            if not status_known:
                status = self.log.status_written
                if status is None and await db(store.is_cancelled)(run.id) or status == Run.Status.CANCELLED:
                    return "cancelled"
            status_known = False
            self.log.status_written = None
            if run.step_count >= max_steps:
                self._emit_finish("length")
                await self._write_last(store.complete_run, run, self.log, snapshot=self.waited)
                return "length"
            started_at = timezone.now()
            message_id = new_id("msg")
            self.emit("step-start", {"messageId": message_id})
            text_parts: list[str] = []
            calls: list[ModelToolCall] = []
            usage = usage_dict(0, 0)
            # Make what subscribers have seen so far durable before a model call that may take long:
            # if this process dies during the call, the run is taken over from the log, and a client
            # resuming with the last seq it saw must find that seq logged, not re-used by the takeover.
            # The model's history is read in the same trip to the database thread.
            history = await self._write(store.flush_and_load_history, self.log, run, self.agent.instructions)
            try:
                async for event in self.agent.model.stream(history, list(self.agent.tools.values())):
                    if isinstance(event, TextDelta):
                        if not text_parts:
                            self.emit("text-start", {"id": message_id})
                        text_parts.append(event.text)
                        self.emit("text-delta", {"id": message_id, "text": event.text})
                        if self.log.full:
                            await self._flush()
                    elif isinstance(event, ModelToolCall):
                        calls.append(event)
                    elif isinstance(event, ModelFinish):
                        usage = event.usage
            except ModelError as exc:
                if text_parts:
                    self.emit("text-end", {"id": message_id})
                error = {"code": exc.code, "message": exc.message}
                self.emit("error", {"error": error}, hold=True)
                self.emit("step-finish", {"finishReason": "error", "usage": usage}, hold=True)
                self._emit_finish("error")
                await self._write(
                    store.record_model_failure, run, self.log, code=exc.code, message=exc.message, started_at=started_at
                )
                return "error"
            text = "".join(text_parts)
            if text_parts:
                self.emit("text-end", {"id": message_id})
            self.result.usage = store.add_usage(self.result.usage, usage)
            call_dicts = [{"id": c.id, "name": c.name, "args": _parsed_args(c.args)} for c in calls]
            # The stream's aggregates cover the whole turn (every model call of this segment), as in
            # Mastra: a run that calls tools and then answers reports that answer as its text.
            self.result.first_text += text
            self.result.tool_calls.extend(call_dicts)
            if not call_dicts:
                # The answer, its step-finish and the segment's finish commit together.
                self.emit("step-finish", {"finishReason": "stop", "usage": usage}, hold=True)
                self._emit_finish("stop")
                await self._write_last(
                    store.record_answer,
                    run,
                    self.log,
                    message_id=message_id,
                    text=text,
                    usage=usage,
                    started_at=started_at,
                    snapshot=self.waited,
                )
                return "stop"
            tool_step = await self._write(
                store.record_model_step,
                run,
                self.log,
                message_id=message_id,
                text=text,
                calls=call_dicts,
                usage=usage,
                started_at=started_at,
            )
            opens = await self._run_tool_calls(run, tool_step, calls)
            if opens:
                return await self._suspend(run, tool_step.id, opens, usage=usage)
            # Every call has its result: the step completed with the last one (record_tool_result).
            self.emit("step-finish", {"finishReason": "tool-calls", "usage": usage})

    async def _suspend(self, run: Run, step_id: str, opens: list[OpenCall], *, usage: dict) -> str:
        """The step's calls that wait for people are recorded together; the segment ends with them."""
        for opened in opens:
            self._emit_open(opened)
        self.emit("step-finish", {"finishReason": "suspended", "usage": usage}, hold=True)
        self._emit_finish("suspended")
        self.waited = True
        await self._write_last(
            store.record_suspension,
            run,
            step_id,
            self.log,
            opens=opens,
            ttl=store.suspended_run_ttl(self.agent.suspended_run_ttl),
            new_calls=True,
        )
        return "suspended"

    async def _run_tool_calls(
        self,
        run: Run,
        step: RunStep,
        calls: list[ModelToolCall],
        positions: dict[str, int] | None = None,
        approved: frozenset[str] | set[str] = frozenset(),
    ) -> list[OpenCall]:
        """Run what can run now; return the calls that wait for people (recorded together by the caller).
        ``positions``: each call's place in its step, when ``calls`` are not all of them; ``approved``:
        calls a standing grant approved already (before their driver stopped)."""
        opens: list[OpenCall] = []
        force_approval = bool(run.options.get("require_tool_approval"))
        for index, call in enumerate(calls):
            position = positions[call.id] if positions else index
            payload_call = {"id": call.id, "name": call.name}
            self.emit("tool-call", {"toolCallId": call.id, "toolName": call.name, "args": _parsed_args(call.args)})
            if self.log.full:  # a step of many calls: the log keeps up with what readers were shown
                await self._flush()
            tool = self.agent.tools.get(call.name)
            if tool is None:
                outcome = Outcome("error", output=f"Unknown tool {call.name!r}")
                await self._record(run, step, payload_call, call.args, outcome)
                continue
            try:
                args = tool.validate_args(call.args)
            except AgentRunError as exc:
                outcome = Outcome("error", output=f"{exc.message}: {exc.details}" if exc.details else exc.message)
                await self._record(run, step, payload_call, call.args, outcome)
                continue
            ctx = self._context(run, call.id)
            granted = call.id in approved
            if not granted and (force_approval or await tool.needs_approval(ctx, args)):
                # A standing grant approves it here and now (a decision via "policy"); else it waits.
                risk = tool.call_risk(requires_approval=True)
                approvals_required = tool.approvals_required or self.agent.approvals_required
                granted = await db(approve_by_grant)(
                    run,
                    tool_call_id=call.id,
                    tool_name=call.name,
                    args=args,
                    risk=risk,
                    approvals_required=approvals_required,
                )
                if not granted:
                    policy = tool.timeout_policy
                    opens.append(
                        OpenCall.of(
                            tool_call_id=call.id,
                            tool_name=call.name,
                            args=args,
                            position=position,
                            risk=risk,
                            waiting=Waiting(requires_approval=True, resume_schema=tool.resume_schema),
                            approvals_required=approvals_required,
                            **(policy.deadlines(timezone.now()) if policy else {}),
                        )
                    )
                    continue
            outcome = await self._execute(tool, args, ctx)
            if outcome.status == "suspended":
                assert outcome.waiting is not None
                opens.append(
                    OpenCall.of(
                        tool_call_id=call.id,
                        tool_name=call.name,
                        args=args,
                        position=position,
                        risk=tool.call_risk(requires_approval=False),
                        waiting=outcome.waiting,
                        # A call a standing grant approved that then suspends: its first suspension
                        # is 1 (suspension 0 is the grant's decision).
                        first_suspension=1 if granted else 0,
                    )
                )
            else:
                await self._record(run, step, payload_call, args, outcome)
        return opens

    # --- tools ----------------------------------------------------------------------------------
    def _context(self, run: Run, tool_call_id: str) -> ToolContext:
        return ToolContext(
            run_id=run.id,
            tool_call_id=tool_call_id,
            agent_id=run.agent_id,
            thread_id=run.thread_id,
            resource_id=run.resource_id,
            metadata=dict(run.metadata or {}),
        )

    async def _execute(self, tool: Tool, args: dict, ctx: ToolContext) -> Outcome:
        if tool.background is not None:
            row = await db(background.create)(
                run_id=ctx.run_id,
                agent_id=ctx.agent_id,
                thread_id=ctx.thread_id or "",
                tool=tool,
                tool_call_id=ctx.tool_call_id,
                args=args,
            )
            await background.run_background_task.aenqueue(row.id)
            text = background.placeholder(row)
            return Outcome("ok", output=text, result=text, background_task_id=row.id)
        try:
            with (
                logcontext.bound(tool_call_id=ctx.tool_call_id),
                tracing.span("agentrun.tool_call", tool=tool.id, tool_call_id=ctx.tool_call_id, run_id=ctx.run_id),
            ):
                result = await tool.execute(args, ctx)
        except INFRASTRUCTURE_ERRORS:
            # The database or Redis failed under the tool (its effect ledger, say): not the tool's
            # result. The call stays approved and not carried out; it runs again with the same id.
            raise
        except ToolSuspended as signal:
            waiting = Waiting(requires_approval=False, suspend_payload=signal.payload, resume_schema=tool.resume_schema)
            return Outcome("suspended", waiting=waiting)
        except InnerRunSuspended as signal:
            return Outcome("suspended", waiting=signal.waiting)
        except Exception as exc:  # a tool's failure is a result the model sees, not a crash
            logger.info("tool %s failed: %s", tool.id, exc)
            return Outcome("error", output=str(exc) or type(exc).__name__)
        return Outcome("ok", output=store.output_text(result), result=result)

    async def _record(
        self, run: Run, step: RunStep, call: dict, args: Any, outcome: Outcome, decision: Decision | None = None
    ) -> None:
        # The chunks announcing the result are logged in its transaction (shown once it committed).
        base = {"toolCallId": call["id"], "toolName": call["name"], "args": args}
        if outcome.status == "ok":
            self.emit("tool-result", {**base, "result": outcome.result}, hold=True)
            if outcome.background_task_id:
                self.emit(
                    "background-task-started",
                    {
                        "taskId": outcome.background_task_id,
                        "toolName": call["name"],
                        "toolCallId": call["id"],
                        "agentId": run.agent_id,
                        "runId": run.id,
                    },
                    hold=True,
                )
        elif outcome.status == "denied":
            approval = {"id": decision.id if decision else None, "approved": False, "reason": outcome.output}
            self.emit("tool-output-denied", {**base, "approval": approval}, hold=True)
        else:
            self.emit("tool-error", {**base, "error": {"message": outcome.output}}, hold=True)
        await self._write(
            store.record_tool_result,
            run,
            step,
            self.log,
            call=call,
            output=outcome.output,
            status=outcome.status,
            decided=decision is not None,
        )
        faults.point("tool-result-committed")

    def _emit_open(self, opened: OpenCall) -> None:
        """Held: the calls' opening is announced with the suspension that records it."""
        waiting = opened.waiting
        payload: dict[str, Any] = {
            "toolCallId": opened.tool_call_id,
            "toolName": opened.tool_name,
            "args": opened.args,
            "resumeSchema": waiting.resume_schema,
        }
        if waiting.inner is not None:
            payload |= {
                "innerAgentId": waiting.inner.agent_id,
                "innerRunId": waiting.inner.run_id,
                "innerToolCallId": waiting.inner.tool_call_id,
                "innerToolName": waiting.inner.tool_name,
                "innerArgs": waiting.inner.args,
            }
        if waiting.requires_approval:
            self.emit("tool-call-approval", payload, hold=True)
        else:
            self.emit("tool-call-suspended", {**payload, "suspendPayload": waiting.suspend_payload}, hold=True)


def _parsed_args(args: Any) -> Any:
    """Providers stream arguments as a JSON string: chunks and aggregates carry the object (as in Mastra).
    A string that is not JSON stays as it is; the tool's validation turns it into a tool-error."""
    return decode_model_args(args) if isinstance(args, str) else args


def _finish_reason_for(status: str) -> str:
    reasons: dict[str, str] = {
        Run.Status.SUSPENDED: "suspended",
        Run.Status.FAILED: "error",
        Run.Status.CANCELLED: "cancelled",
        Run.Status.EXPIRED: "cancelled",
    }
    return reasons.get(status, "stop")


async def inner_outcome(inner_agent: AgentSpec, inner_run_id: str) -> Outcome:
    """What a sub-agent's run means for the outer call: its answer, its failure, or its open call."""
    run = await db(store.load_run)(inner_run_id)
    if run.status == Run.Status.COMPLETED:
        # The answer is read from the run, not from this segment: a segment that found the inner run
        # already completed (decided by the sub-agent itself, or a retried continuation) made no model call.
        text = await db(store.final_answer)(inner_run_id)
        return Outcome("ok", output=store.output_text({"text": text}), result={"text": text})
    if run.status == Run.Status.SUSPENDED:
        inner = await db(store.first_open_call)(inner_run_id)
        assert inner is not None  # a suspended run waits on an open call
        waiting = Waiting(
            requires_approval=inner.requires_approval,
            suspend_payload=inner.suspend_payload,
            resume_schema=inner.resume_schema,
            risk=inner.risk,
            approvals_required=inner.approvals_required,
            inner=InnerCall(
                agent_id=inner_agent.id,
                run_id=inner_run_id,
                tool_call_id=inner.tool_call_id,
                tool_name=inner.tool_name,
                args=inner.args,
            ),
        )
        return Outcome("suspended", waiting=waiting)
    message = (run.last_error or {}).get("message") or f"sub-agent run ended {run.status}"
    return Outcome("error", output=message)

"""The agent loop. One ``Segment`` drives a run from where it rests until it rests again.

A run is made of segments: ``stream()`` starts the first, every approve/decline/resume starts another.
A segment holds the run's lease (one driver at a time, across processes), applies decided tool calls,
then calls the model and runs tools until the run completes, fails, or waits for people again.
Chunks are numbered by the segment's ``ChunkLog`` and end with exactly one ``finish``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from agentrun.core import logcontext, metrics, tracing
from agentrun.core.errors import AgentRunError
from agentrun.core.fanout import RunPublisher
from agentrun.core.ids import new_id
from agentrun.core.models import Decision, Run, RunStep, SuspendedToolCall
from agentrun.engine import background, store
from agentrun.engine.chunklog import ChunkLog
from agentrun.engine.decisions import approve_by_grant, carry_to_inner_run
from agentrun.engine.inputs import decode_model_args
from agentrun.engine.lease import DATABASE_UNAVAILABLE, RunLease
from agentrun.engine.providers import ModelError, ModelFinish, ModelToolCall, TextDelta, usage_dict
from agentrun.engine.registry import get_agent
from agentrun.engine.runtime import db
from agentrun.engine.tools import InnerRunSuspended, Tool, ToolContext, ToolSuspended

if TYPE_CHECKING:
    from agentrun.engine.agents import Agent

logger = logging.getLogger("agentrun.engine")

DEFAULT_DECLINE_REASON = "Tool call was not approved by the user"
# The finish a segment's taker writes for the segment its dead predecessor left open (README
# "Production"): the run is not failed, it goes on in the taker's segment right after.
TAKEOVER_FINISH = {
    "finishReason": "error",
    "usage": usage_dict(0, 0),
    "error": {
        "code": "driver_lost",
        "message": "The process driving this segment stopped; another process continues the run.",
    },
}


@dataclass
class Outcome:
    """How one tool call ended: ``ok``, ``error``, ``denied`` (with an output), or ``suspended``."""

    status: str
    output: str = ""
    result: Any = None
    open_call: dict | None = None
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
        agent: Agent,
        run_id: str,
        sinks: list | None = None,
        *,
        directive: str | None = None,
        only_if_needed: bool = False,
    ) -> None:
        self.agent = agent
        self.only_if_needed = only_if_needed
        self.run_id = run_id
        self.publisher = RunPublisher(run_id)
        self.sinks = [*(sinks or []), self.publisher]
        # A continuation turn after background tasks starts with a system message naming them.
        self.directive = directive
        self.result = SegmentResult(finish_reason="stop")

    def emit(self, type_: str, payload: dict) -> dict:
        return self.log.emit(type_, payload)

    # --- the segment ----------------------------------------------------------------------------
    async def run(self) -> SegmentResult:
        with logcontext.bound(agent_id=self.agent.id, run_id=self.run_id):
            return await self._run()

    async def _run(self) -> SegmentResult:
        async with RunLease(self.run_id):
            run = await db(store.load_run_to_drive)(self.run_id)
            self.log = ChunkLog(run.id, run.next_seq, self.sinks)
            if run.segment_open:
                # Taken over: the previous driver died mid-segment (its lease lapsed). Close its segment
                # first, so every reader of the log sees exactly one finish per segment (docs/api.md#chunks).
                logger.warning("run %s: closing the segment of a driver that died", run.id)
                self.emit("finish", TAKEOVER_FINISH)
                await db(self.log.flush_sync)()
            if self.only_if_needed and not await db(store.needs_driving)(run):
                self.result.finish_reason = _finish_reason_for(run.status)
                await self.publisher.aclose()
                return self.result
            self.emit("start", {"runId": run.id, "agentId": run.agent_id, "threadId": run.thread_id})
            try:
                self.result.finish_reason = await self._drive(run)
            except DATABASE_UNAVAILABLE:
                # Not the run's fault (a database restart, a dropped connection): the run is not
                # failed. The lease is kept and expires; a sweep then continues the run from its last
                # committed state (an approved call still ``executing`` re-runs with the same id).
                logger.warning("run %s: database unavailable; it will be continued", self.run_id, exc_info=True)
                raise
            except Exception as exc:  # a bug or a crash in a tool wrapper: record it, never swallow it
                logger.exception("run %s failed", self.run_id)
                error = {"code": "server_error", "message": f"{type(exc).__name__}: {exc}"}
                await db(store.fail_run_sync)(run, error)
                self.emit("error", {"error": error})
                self.result.finish_reason = "error"
            self.emit("finish", {"finishReason": self.result.finish_reason, "usage": self.result.usage})
            await db(self.log.flush_sync)()
            await self.publisher.aclose()
        return self.result

    async def _drive(self, run: Run) -> str:
        if run.is_final:
            return _finish_reason_for(run.status)
        # A run that has just started has no calls or steps yet, and its status was just read.
        starting = run.status == Run.Status.QUEUED
        if starting:
            await db(store.mark_started)(run)
            if run.is_final:
                return _finish_reason_for(run.status)
        else:
            open_calls, steps_done = await self._apply_decisions(run)
            if run.is_final:
                return _finish_reason_for(run.status)
            if open_calls:
                return "suspended"
            # The step of the calls just carried out completed with its last output; otherwise (a run
            # taken over, say) look for a step left in progress.
            step = None if steps_done else await db(store.pending_tool_step)(run.id)
            if step is not None:
                if not store.step_outputs_complete(step):
                    return "suspended"
                await db(store.complete_tool_step)(step.id)
        if self.directive:
            await db(store.add_message)(run, role="system", content=self.directive)
        return await self._model_loop(run, status_known=starting)

    # --- decided calls --------------------------------------------------------------------------
    async def _apply_decisions(self, run: Run) -> tuple[bool, bool]:
        """Carry out the decided calls, and those decided meanwhile. Returns (calls are still open,
        calls were carried out and every step they belong to is complete)."""
        steps: dict[str, RunStep] = {}  # one copy per step: each call of a step writes its own output
        while True:
            calls = await db(store.waiting_calls)(run.id)
            decided = [c for c in calls if c.status != SuspendedToolCall.Status.OPEN]
            if not decided:
                done = bool(steps) and all(s.status == RunStep.Status.COMPLETED for s in steps.values())
                return bool(calls), done
            for call in decided:
                # Loaded with the batch: a call that no longer waits (its run was cancelled while an
                # earlier one ran) is not carried out, and what is left is read again.
                if not await db(store.mark_executing)(call):
                    break
                await self._apply_decision(run, call, steps.setdefault(call.step_id, call.step))

    async def _apply_decision(self, run: Run, call: SuspendedToolCall, step: RunStep) -> None:
        decision: Decision = call.decision
        metrics.continuation_started(agent_id=run.agent_id, decided_at=decision.decided_at)
        payload_call = {"id": call.tool_call_id, "name": call.tool_name}
        args = decision.edited_args if decision.edited_args is not None else call.args
        if decision.kind == Decision.Kind.DECLINE and not call.inner_run_id:
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
            opened = dict(
                {"risk": call.risk},
                **(outcome.open_call or {}),
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                args=call.args,
                position=call.position,
            )
            await db(store.record_suspension)(
                run,
                call.step_id,
                self.log,
                opens=[opened],
                ttl=store.suspended_run_ttl(self.agent.suspended_run_ttl),
            )
            self._emit_open(opened)
        else:
            await self._record(run, step, payload_call, args, outcome, decision=decision)

    async def _decide_inner(self, call, decision: Decision) -> Outcome:
        """A surfaced sub-agent call was decided: its inner call carries out the same decision."""
        inner_agent = get_agent(call.inner_agent_id)
        await db(carry_to_inner_run)(
            inner_run_id=call.inner_run_id, inner_tool_call_id=call.inner_tool_call_id, decision=decision
        )
        await Segment(inner_agent, call.inner_run_id).run()
        return await inner_outcome(inner_agent, call.inner_run_id)

    # --- the model loop -------------------------------------------------------------------------
    async def _model_loop(self, run: Run, *, status_known: bool = False) -> str:
        """``status_known``: the run's status was read just now (no need to ask whether it was cancelled)."""
        max_steps = run.options.get("max_steps") or self.agent.max_steps
        while True:
            if not status_known and await db(store.is_cancelled)(run.id):
                return "cancelled"
            status_known = False
            if run.step_count >= max_steps:
                await db(store.complete_run)(run, self.log)
                return "length"
            history = await db(store.load_history)(run, self.agent.instructions)
            started_at = timezone.now()
            message_id = new_id("msg")
            self.emit("step-start", {"messageId": message_id})
            text_parts: list[str] = []
            calls: list[ModelToolCall] = []
            usage = usage_dict(0, 0)
            # Make what subscribers have seen so far durable before a model call that may take long:
            # if this process dies during the call, the run is taken over from the log, and a client
            # resuming with the last seq it saw must find that seq logged, not re-used by the takeover.
            await db(self.log.flush_sync)()
            try:
                async for event in self.agent.model.stream(history, list(self.agent.tools.values())):
                    if isinstance(event, TextDelta):
                        if not text_parts:
                            self.emit("text-start", {"id": message_id})
                        text_parts.append(event.text)
                        self.emit("text-delta", {"id": message_id, "text": event.text})
                        if self.log.full:
                            await db(self.log.flush_sync)()
                    elif isinstance(event, ModelToolCall):
                        calls.append(event)
                    elif isinstance(event, ModelFinish):
                        usage = event.usage
            except ModelError as exc:
                if text_parts:
                    self.emit("text-end", {"id": message_id})
                error = {"code": exc.code, "message": exc.message}
                await db(store.record_model_failure)(
                    run, self.log, code=exc.code, message=exc.message, started_at=started_at
                )
                self.emit("error", {"error": error})
                self.emit("step-finish", {"finishReason": "error", "usage": usage})
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
                self.emit("step-finish", {"finishReason": "stop", "usage": usage})
                await db(store.record_answer)(
                    run, self.log, message_id=message_id, text=text, usage=usage, started_at=started_at
                )
                return "stop"
            tool_step = await db(store.record_model_step)(
                run, self.log, message_id=message_id, text=text, calls=call_dicts, usage=usage, started_at=started_at
            )
            opens = await self._run_tool_calls(run, tool_step, calls)
            if opens:
                await db(store.record_suspension)(
                    run,
                    tool_step.id,
                    self.log,
                    opens=opens,
                    ttl=store.suspended_run_ttl(self.agent.suspended_run_ttl),
                    new_calls=True,
                )
                for opened in opens:
                    self._emit_open(opened)
                self.emit("step-finish", {"finishReason": "suspended", "usage": usage})
                return "suspended"
            # Every call has its result: the step completed with the last one (record_tool_result).
            self.emit("step-finish", {"finishReason": "tool-calls", "usage": usage})

    async def _run_tool_calls(self, run: Run, step: RunStep, calls: list[ModelToolCall]) -> list[dict]:
        """Run what can run now; return the calls that wait for people (recorded together by the caller)."""
        opens: list[dict] = []
        force_approval = bool(run.options.get("require_tool_approval"))
        for position, call in enumerate(calls):
            payload_call = {"id": call.id, "name": call.name}
            self.emit("tool-call", {"toolCallId": call.id, "toolName": call.name, "args": _parsed_args(call.args)})
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
            granted = False
            if force_approval or await tool.needs_approval(ctx, args):
                # A standing grant approves it here and now (a decision via "policy"); else it waits.
                risk = tool.call_risk(requires_approval=True)
                granted = await db(approve_by_grant)(
                    run, tool_call_id=call.id, tool_name=call.name, args=args, risk=risk
                )
                if not granted:
                    policy = tool.timeout_policy
                    opens.append(
                        {
                            "tool_call_id": call.id,
                            "tool_name": call.name,
                            "args": args,
                            "requires_approval": True,
                            "risk": risk,
                            "resume_schema": tool.resume_schema,
                            "position": position,
                            **(policy.deadlines(timezone.now()) if policy else {}),
                        }
                    )
                    continue
            outcome = await self._execute(tool, args, ctx)
            if outcome.status == "suspended":
                opens.append(
                    dict(
                        {"risk": tool.call_risk(requires_approval=False), "suspension": 1 if granted else 0},
                        **(outcome.open_call or {}),
                        tool_call_id=call.id,
                        tool_name=call.name,
                        args=args,
                        position=position,
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
        except ToolSuspended as signal:
            return Outcome(
                "suspended",
                open_call={
                    "requires_approval": False,
                    "suspend_payload": signal.payload,
                    "resume_schema": tool.resume_schema,
                },
            )
        except InnerRunSuspended as signal:
            return Outcome("suspended", open_call=signal.open_call)
        except Exception as exc:  # a tool's failure is a result the model sees, not a crash
            logger.info("tool %s failed: %s", tool.id, exc)
            return Outcome("error", output=str(exc) or type(exc).__name__)
        return Outcome("ok", output=store.output_text(result), result=result)

    async def _record(
        self, run: Run, step: RunStep, call: dict, args: Any, outcome: Outcome, decision: Decision | None = None
    ) -> None:
        await db(store.record_tool_result)(
            run, step, self.log, call=call, output=outcome.output, status=outcome.status, decided=decision is not None
        )
        base = {"toolCallId": call["id"], "toolName": call["name"], "args": args}
        if outcome.status == "ok":
            self.emit("tool-result", {**base, "result": outcome.result})
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
                )
        elif outcome.status == "denied":
            approval = {"id": decision.id if decision else None, "approved": False, "reason": outcome.output}
            self.emit("tool-output-denied", {**base, "approval": approval})
        else:
            self.emit("tool-error", {**base, "error": {"message": outcome.output}})

    def _emit_open(self, opened: dict) -> None:
        payload = {
            "toolCallId": opened["tool_call_id"],
            "toolName": opened["tool_name"],
            "args": opened["args"],
            "resumeSchema": opened.get("resume_schema"),
        }
        for key, name in (
            ("inner_agent_id", "innerAgentId"),
            ("inner_run_id", "innerRunId"),
            ("inner_tool_call_id", "innerToolCallId"),
        ):
            if opened.get(key):
                payload[name] = opened[key]
        if opened.get("inner_tool_name"):
            payload["innerToolName"] = opened["inner_tool_name"]
            payload["innerArgs"] = opened.get("inner_args")
        if opened["requires_approval"]:
            self.emit("tool-call-approval", payload)
        else:
            self.emit("tool-call-suspended", {**payload, "suspendPayload": opened.get("suspend_payload")})


def _parsed_args(args: Any) -> Any:
    """Providers stream arguments as a JSON string: chunks and aggregates carry the object (as in Mastra).
    A string that is not JSON stays as it is; the tool's validation turns it into a tool-error."""
    return decode_model_args(args) if isinstance(args, str) else args


def _finish_reason_for(status: str) -> str:
    return {
        Run.Status.SUSPENDED: "suspended",
        Run.Status.FAILED: "error",
        Run.Status.CANCELLED: "cancelled",
        Run.Status.EXPIRED: "cancelled",
    }.get(status, "stop")


async def inner_outcome(inner_agent: Agent, inner_run_id: str) -> Outcome:
    """What a sub-agent's run means for the outer call: its answer, its failure, or its open call."""
    run = await db(store.load_run)(inner_run_id)
    if run.status == Run.Status.COMPLETED:
        # The answer is read from the run, not from this segment: a segment that found the inner run
        # already completed (decided by the sub-agent itself, or a retried continuation) made no model call.
        text = await db(store.final_answer)(inner_run_id)
        return Outcome("ok", output=store.output_text({"text": text}), result={"text": text})
    if run.status == Run.Status.SUSPENDED:
        inner = await db(store.first_open_call)(inner_run_id)
        return Outcome(
            "suspended",
            open_call={
                "requires_approval": inner.requires_approval,
                "risk": inner.risk,
                "suspend_payload": inner.suspend_payload,
                "resume_schema": inner.resume_schema,
                "inner_agent_id": inner_agent.id,
                "inner_run_id": inner_run_id,
                "inner_tool_call_id": inner.tool_call_id,
                "inner_tool_name": inner.tool_name,
                "inner_args": inner.args,
            },
        )
    message = (run.last_error or {}).get("message") or f"sub-agent run ended {run.status}"
    return Outcome("error", output=message)

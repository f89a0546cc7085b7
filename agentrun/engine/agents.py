"""``Agent``: the Python API (docs/runs.md#the-python-api) — the façade over the engine's layers.

Agents register themselves by id (``agentrun.engine.registry``). Decisions go through the one decision
service (``agentrun.engine.service``) and return a stream that follows the continuation through the
run's chunk log, as every other surface does.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Iterable
from datetime import datetime
from typing import Any, cast

from django.conf import settings

from agentrun.core.fanout import subscribe
from agentrun.core.models import Run
from agentrun.core.selectors import SuspendedRunsPage, list_suspended_runs
from agentrun.engine import background, dispatch, registry, store
from agentrun.engine.inputs import (
    normalize_max_steps,
    normalize_memory,
    normalize_messages,
    normalize_until_idle,
    validate_metadata,
)
from agentrun.engine.lease import create_run_to_drive
from agentrun.engine.loop import Segment
from agentrun.engine.providers import CONTINUATION_PREFIX, LanguageModel, get_model
from agentrun.engine.registry import register_agent
from agentrun.engine.runtime import db
from agentrun.engine.service import DecisionOutcome, decide
from agentrun.engine.stream import RunStream, TurnSummary
from agentrun.engine.subagents import SubAgentTool
from agentrun.engine.tools import Tool, check_approvals_required
from agentrun.engine.types import PYTHON, Decider, DecisionCommand

__all__ = ["Agent", "all_agents", "follow", "generate_result", "get_agent", "register_agent"]

IDLE_POLL_SECONDS = 0.1


class Agent:
    def __init__(
        self,
        id: str,  # noqa: A002 - the contract's name
        *,
        instructions: str = "",
        model: str | LanguageModel | None = None,
        tools: Iterable[Tool] = (),
        agents: Iterable[Agent] = (),
        name: str | None = None,
        description: str = "",
        suspended_run_ttl: float | None = None,
        max_steps: int | None = None,
        background_concurrency: int | None = None,
        approvals_required: int = 1,
        register: bool = True,
    ) -> None:
        self.id = id
        self.name = name or id
        self.description = description
        self.instructions = instructions
        self._model_spec = model
        self._model: LanguageModel | None = None
        self.sub_agents = list(agents)
        self.tools: dict[str, Tool] = {}
        for t in [*tools, *(SubAgentTool(a) for a in self.sub_agents)]:
            if not isinstance(t, Tool):
                raise TypeError(f"{t!r} is not a tool: decorate it with @tool")
            self.tools[t.id] = t
        self.suspended_run_ttl = suspended_run_ttl
        self.background_concurrency = background_concurrency
        # The tools' default for how many distinct people approve a call (a tool may say otherwise).
        self.approvals_required = check_approvals_required(approvals_required) or 1
        self._max_steps = max_steps
        if register:
            register_agent(self)

    @property
    def model(self) -> LanguageModel:
        if self._model is None:
            self._model = get_model(self._model_spec)
        return self._model

    @property
    def max_steps(self) -> int:
        return self._max_steps or settings.AGENTRUN_MAX_STEPS

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "name": self.name,
            "description": self.description,
            "tools": [t.describe() for t in self.tools.values()],
            "agents": [a.id for a in self.sub_agents],
        }

    def __repr__(self) -> str:
        return f"<Agent {self.id}>"

    # --- runs -----------------------------------------------------------------------------------
    async def stream(
        self,
        messages: Any,
        *,
        memory: dict | None = None,
        until_idle: bool | dict | None = False,
        require_tool_approval: bool | None = None,
        max_steps: int | None = None,
        metadata: dict | None = None,
        dispatch: bool = False,
        started_by: Any = None,
    ) -> RunStream:
        """Start a run; chunks arrive on ``full_stream``. ``stream.run_id`` is known at once.

        ``started_by``: the person a door started it for (REST, a websocket); None from Python code.

        ``dispatch=True`` runs it through the Tasks framework (a worker, in production) and relays its
        chunks from the fan-out; by default this process drives it. ``until_idle`` streams stay here.
        """
        normalized = normalize_messages(messages)
        thread_id, resource_id = normalize_memory(memory)
        idle = normalize_until_idle(until_idle)  # refused when malformed, with memory or without
        if not thread_id:
            idle = None  # without memory there is no thread to write results back to (docs/runs.md#until-idle)
        options: dict[str, Any] = {
            "max_steps": normalize_max_steps(max_steps),
            "require_tool_approval": bool(require_tool_approval),
            "until_idle": idle,
        }
        dispatched = dispatch and not idle
        # Driven here: created started, with this process's lease (one statement, not two).
        run = await db(store.create_run if dispatched else create_run_to_drive)(
            agent_id=self.id,
            messages=normalized,
            thread_id=thread_id,
            resource_id=resource_id,
            metadata=validate_metadata(metadata),
            options={k: v for k, v in options.items() if v},
            started_by=started_by if getattr(started_by, "pk", None) else None,
        )
        if dispatched:
            return await _dispatched(self.id, run.id, after=0)
        return self._drive(run, until_idle=idle)

    async def stream_until_idle(self, messages: Any, *, max_idle_ms: int | None = None, **options: Any) -> RunStream:
        """Deprecated: use ``stream(..., until_idle=True)`` (or ``{"max_idle_ms": …}``)."""
        warnings.warn(
            "stream_until_idle() is deprecated; use stream(..., until_idle=True)", DeprecationWarning, stacklevel=2
        )
        return await self.stream(messages, until_idle={"max_idle_ms": max_idle_ms} if max_idle_ms else True, **options)

    async def generate(self, messages: Any, **options: Any) -> dict:
        """Run until the run rests, and return ``{runId, status, text, toolCalls, finishReason, usage, suspended}``."""
        stream = await self.stream(messages, **options)
        await stream.collect()
        return await generate_result(stream)

    def _drive(self, run: Run, until_idle: dict | None = None) -> RunStream:
        """Drive a run just created with this process's lease (``create_run_to_drive``)."""
        run_id = run.id
        stream = RunStream(run_id)
        last_seq = [0]

        def sink(chunk: dict) -> None:
            last_seq[0] = chunk["seq"]
            stream.sink(chunk)

        async def produce(s: RunStream) -> None:
            result = await Segment(self, run_id, sinks=[sink], created=run).run()
            s.first_turn_done(result)
            if until_idle:
                await self._until_idle(run_id, sink, last_seq[0], until_idle["max_idle_ms"])

        return stream.start(produce)

    async def _until_idle(self, run_id: str, sink: Any, after: int, max_idle_ms: float) -> None:
        """Keep the stream open while the run's background tasks work (docs/runs.md#until-idle).

        Each batch of finished tasks starts a continuation turn (a segment) naming their calls; the
        turns' chunks, and the ``background-task-*`` chunks, reach this stream through the fan-out.
        Closes when nothing runs and nothing is queued, or after ``max_idle_ms`` idle between turns.
        """

        async def forward() -> None:
            async for chunk in subscribe(run_id, after, until="final"):
                sink(chunk)

        forwarder = asyncio.create_task(forward())
        idle_since = time.monotonic()
        try:
            while True:
                run = await db(store.load_run)(run_id)
                if run.status != run.Status.IN_PROGRESS:
                    break  # suspended for a person, or finished: the run rests
                finished, busy = await db(background.idle_state)(run_id)
                if finished:
                    await db(background.mark_continued)(finished)
                    directive = f"{CONTINUATION_PREFIX} {' '.join(finished)}"
                    await Segment(self, run_id, directive=directive).run()
                    idle_since = time.monotonic()
                elif not busy or (time.monotonic() - idle_since) * 1000 >= max_idle_ms:
                    break
                else:
                    await asyncio.sleep(IDLE_POLL_SECONDS)
        finally:
            await db(store.finish_idle_run)(run_id, self.id)
            try:
                await asyncio.wait_for(forwarder, timeout=10)
            except TimeoutError:
                forwarder.cancel()

    # --- the listing contract -------------------------------------------------------------------
    async def list_suspended_runs(
        self,
        *,
        thread_id: str | None = None,
        resource_id: str | None = None,
        from_date: datetime | str | None = None,
        to_date: datetime | str | None = None,
        per_page: int | None = None,
        page: int | None = None,
    ) -> SuspendedRunsPage:
        return await db(list_suspended_runs)(
            agent_id=self.id,
            thread_id=thread_id,
            resource_id=resource_id,
            from_date=from_date,
            to_date=to_date,
            per_page=per_page,
            page=page,
        )

    # --- decisions ------------------------------------------------------------------------------
    # ``decided_by``: who decides (engine/types.py ``Decider``). None: this program itself, trusted
    # in-process code (``via`` python); ``Decider.person(user, via=…)`` to decide on a person's behalf,
    # with their permissions checked.
    async def _decide(self, decided_by: Decider | None, **request: Any) -> RunStream:
        command = DecisionCommand.one(agent_id=self.id, decider=decided_by or PYTHON, **request)
        outcome = await db(decide)(command)
        return follow(outcome)

    async def approve_tool_call(
        self,
        *,
        run_id: str,
        tool_call_id: str | None = None,
        args: dict | None = None,
        reason: str | None = None,
        args_fingerprint: str | None = None,
        decided_by: Decider | None = None,
    ) -> RunStream:
        return await self._decide(
            decided_by,
            kind="approve",
            run_id=run_id,
            tool_call_id=tool_call_id,
            args=args,
            reason=reason,
            args_fingerprint=args_fingerprint,
        )

    async def decline_tool_call(
        self,
        *,
        run_id: str,
        tool_call_id: str | None = None,
        reason: str | None = None,
        args_fingerprint: str | None = None,
        decided_by: Decider | None = None,
    ) -> RunStream:
        return await self._decide(
            decided_by,
            kind="decline",
            run_id=run_id,
            tool_call_id=tool_call_id,
            reason=reason,
            args_fingerprint=args_fingerprint,
        )

    async def resume_stream(
        self,
        resume_data: Any,
        *,
        run_id: str,
        tool_call_id: str | None = None,
        args_fingerprint: str | None = None,
        decided_by: Decider | None = None,
    ) -> RunStream:
        return await self._decide(
            decided_by,
            kind="resume",
            run_id=run_id,
            tool_call_id=tool_call_id,
            resume_data=resume_data,
            args_fingerprint=args_fingerprint,
        )


def get_agent(agent_id: str) -> Agent:
    """The registered agent (only ``Agent`` registers itself), or ``AgentRunError(AGENT_NOT_FOUND)``."""
    return cast(Agent, registry.get_agent(agent_id))


def all_agents() -> list[Agent]:
    return cast(list[Agent], registry.all_agents())


def follow(outcome: DecisionOutcome) -> RunStream:
    """The continuation of a decision, followed through the run's chunk log up to its ``finish``. An
    approval that does not complete its call's quorum continues nothing: the stream ends at once (the
    call still waits, ``finish_reason`` "suspended")."""
    if outcome.continue_run_id:
        stream = _relay(outcome.run_id, after=outcome.after_seq)
    else:
        stream = RunStream(outcome.run_id).start(_still_waiting)
    stream.decision = outcome
    return stream


async def _still_waiting(stream: RunStream) -> None:
    """No chunk: nothing ran. The turn's summary says the run still waits."""
    stream.first_turn_done(TurnSummary.of([{"type": "finish", "payload": {"finishReason": "suspended"}}]))


def _relay(run_id: str, *, after: int) -> RunStream:
    # The segment may not have started yet (it waits for the task runner): the relay waits for its
    # finish, not for the run to look at rest.
    return RunStream(run_id).relay(subscribe(run_id, after, until="rest", after_a_finish=True))


async def _dispatched(agent_id: str, run_id: str, *, after: int) -> RunStream:
    stream = _relay(run_id, after=after)
    await dispatch.continue_run.aenqueue(agent_id, run_id)
    return stream


async def generate_result(stream: RunStream) -> dict:
    run = await Run.objects.aget(pk=stream.run_id)
    page = await db(list_suspended_runs)(agent_id=run.agent_id, thread_id=run.thread_id)
    suspended = next((r for r in page.runs if r.run_id == run.id), None)
    return {
        "runId": run.id,
        "status": run.status,
        "text": await stream.text,
        "toolCalls": await stream.tool_calls,
        "finishReason": await stream.finish_reason,
        "usage": await stream.usage,
        "suspended": [c.to_dict() for c in suspended.tool_calls] if suspended else [],
    }

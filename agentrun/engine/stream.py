"""``RunStream``: what ``stream()`` and the decisions return. Chunks arrive on ``full_stream``.

The run is driven by a producer task, not by the consumer: a consumer that stops reading (or never
reads) does not stop the run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from agentrun.core import outages
from agentrun.core.fanout import SubscriberInterrupted

_producers: set[asyncio.Task] = set()  # strong references: a running producer is never collected

_END = object()


@dataclass
class TurnSummary:
    """What a turn's chunks say: the aggregates of a relayed stream."""

    first_text: str
    tool_calls: list[dict]
    finish_reason: str
    usage: dict

    @classmethod
    def of(cls, chunks: list[dict]) -> TurnSummary:
        finish = chunks[-1]["payload"]
        return cls(
            first_text="".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta"),
            tool_calls=[
                {"id": c["payload"]["toolCallId"], "name": c["payload"]["toolName"], "args": c["payload"]["args"]}
                for c in chunks
                if c["type"] == "tool-call"
            ],
            finish_reason=finish.get("finishReason", "stop"),
            usage=finish.get("usage") or {},
        )


class RunStream:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.decision: Any = None  # the DecisionOutcome, for streams returned by a decision
        self._queue: asyncio.Queue = asyncio.Queue()
        self._first_turn: asyncio.Future = asyncio.get_running_loop().create_future()
        self._done: asyncio.Future = asyncio.get_running_loop().create_future()
        self._consumed = False

    # --- producer side --------------------------------------------------------------------------
    def sink(self, chunk: dict) -> None:
        self._queue.put_nowait(chunk)

    def start(self, produce: Callable[[RunStream], Awaitable[None]]) -> RunStream:
        async def runner() -> None:
            try:
                await produce(self)
            except BaseException as exc:
                if not self._first_turn.done():
                    self._first_turn.set_exception(exc)
                    self._first_turn.exception()  # retrieved: the consumer gets it (or never asked)
                self._queue.put_nowait(exc)
                if not isinstance(exc, Exception):  # cancelled, or the process is exiting
                    raise
                # The consumer gets the error from the queue: it is not the task's to report too
                # ("Task exception was never retrieved").
            finally:
                self._queue.put_nowait(_END)
                if not self._done.done():
                    self._done.set_result(None)

        task = asyncio.get_running_loop().create_task(runner())
        _producers.add(task)
        task.add_done_callback(_producers.discard)
        return self

    def relay(self, chunks: AsyncIterator[dict]) -> RunStream:
        """Carry one segment produced elsewhere (a worker), up to its ``finish``; the aggregates come
        from its chunks. Stopping at the finish matters: the run may move on (a decision) right after."""

        async def produce(s: RunStream) -> None:
            turn: list[dict] = []
            # An async generator (fanout.subscribe): closed when the segment ends, whatever happens.
            async with contextlib.aclosing(cast(AsyncGenerator[dict], chunks)) as source:
                try:
                    async for chunk in source:
                        s.sink(chunk)
                        turn.append(chunk)
                        if chunk["type"] == "finish":
                            s.first_turn_done(TurnSummary.of(turn))
                            return
                except SubscriberInterrupted as exc:
                    # The database stayed away: the run goes on server-side; say where to pick it up.
                    raise outages.unavailable(exc, runId=s.run_id, resumeAfter=exc.resume_after) from exc
            # The run ended without this segment (cancelled before a worker took it up).
            s.first_turn_done(TurnSummary.of([*turn, {"type": "finish", "payload": {"finishReason": "cancelled"}}]))

        return self.start(produce)

    def first_turn_done(self, result: Any) -> None:
        if not self._first_turn.done():
            self._first_turn.set_result(result)

    # --- consumer side --------------------------------------------------------------------------
    @property
    def full_stream(self) -> AsyncIterator[dict]:
        if self._consumed:
            raise RuntimeError("full_stream can be consumed once")
        self._consumed = True
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict]:
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def _first(self, name: str) -> Any:
        result = await asyncio.shield(self._first_turn)
        return getattr(result, name)

    # Aggregates describe the first turn only (docs/runs.md#the-python-api); ``await stream.text``.
    @property
    def text(self) -> Awaitable[str]:
        return self._first("first_text")

    @property
    def tool_calls(self) -> Awaitable[list[dict]]:
        return self._first("tool_calls")

    @property
    def finish_reason(self) -> Awaitable[str]:
        return self._first("finish_reason")

    @property
    def usage(self) -> Awaitable[dict]:
        return self._first("usage")

    async def wait(self) -> None:
        """Wait until the run has produced everything this stream will carry."""
        await asyncio.shield(self._done)

    async def collect(self) -> list[dict]:
        return [chunk async for chunk in self.full_stream]

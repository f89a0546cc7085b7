"""A subscriber that was shown chunks a dead driver published but never logged: when the taker writes
other chunks under those seqs, ``ws/runs`` closes with 4009 and the seq to resume from, and SSE ends
with a ``reset`` event carrying that seq as its id (README "Production")."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from agentrun.core.fanout import RunPublisher, SubscriberReset, subscribe
from agentrun.engine.agents import get_agent
from agentrun.engine.chunklog import ChunkLog
from agentrun.engine.loop import TAKEOVER_FINISH
from tests.helpers.asgi import communicator, receive_until
from tests.helpers.runs import EMAIL_LINE as EMAIL
from tests.helpers.users import reviewer_token

pytestmark = pytest.mark.django_db(transaction=True)


async def dead_driver_then_taker(run_id: str, next_seq: int) -> int:
    """The dead driver logs its ``start``, publishes two chunks it never logs, and dies; the taker
    closes the open segment under the next seq. Returns the last seq both agree on."""
    publisher = RunPublisher(run_id)
    dead = ChunkLog(run_id, next_seq, [publisher])
    dead.emit("start", {"runId": run_id})
    await sync_to_async(dead.flush_sync)()
    dead.emit("step-start", {"messageId": "msg_dead"})
    dead.emit("text-start", {"id": "msg_dead"})
    await publisher.aclose()
    return next_seq


async def taker(run_id: str, seq: int) -> None:
    publisher = RunPublisher(run_id)
    log = ChunkLog(run_id, seq, [publisher])
    log.emit("finish", TAKEOVER_FINISH)
    await sync_to_async(log.flush_sync)()
    await publisher.aclose()


async def suspended_run() -> tuple[str, int]:
    stream = await get_agent("support-agent").stream(EMAIL, memory={"thread": "takeover"})
    chunks = await stream.collect()
    return stream.run_id, chunks[-1]["seq"]


async def test_the_run_socket_closes_4009_with_the_seq_to_resume_from_after_a_takeover():
    token = await reviewer_token("tk-ws")
    run_id, last = await suspended_run()
    comm = communicator(f"/ws/runs/{run_id}/?after=0", token)
    assert (await comm.connect())[0]
    await receive_until(comm, lambda f: f["type"] == "finish")
    agreed = await dead_driver_then_taker(run_id, last + 1)
    seen = await receive_until(comm, lambda f: f["type"] == "text-start")
    assert [c["seq"] for c in seen] == [agreed, agreed + 1, agreed + 2]
    await taker(run_id, agreed + 1)
    closed = await comm.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": 4009, "reason": f"resume after={agreed}"}

    # Resuming there gives the log's version: the dead segment closed by the taker's finish.
    again = communicator(f"/ws/runs/{run_id}/?after={agreed}", token)
    assert (await again.connect())[0]
    [finish] = await receive_until(again, lambda f: f["type"] == "finish")
    assert (finish["seq"], finish["payload"]["error"]["code"]) == (agreed + 1, "driver_lost")
    await comm.disconnect()
    await again.disconnect()


class Reader:
    """A subscriber read in the background: what it was given, and the reset that ended it, if any."""

    def __init__(self, chunks) -> None:
        self.got: list[dict] = []
        self.reset: SubscriberReset | None = None
        self.changed = asyncio.Event()
        self.task = asyncio.ensure_future(self._read(chunks))

    async def _read(self, chunks) -> None:
        try:
            async for chunk in chunks:
                self.got.append(chunk)
                self.changed.set()
        except SubscriberReset as reset:
            self.reset = reset
        finally:
            self.changed.set()

    async def given(self, count: int) -> list[dict]:
        """Wait until it was given ``count`` chunks (or ended)."""
        async with asyncio.timeout(10):
            while len(self.got) < count and not self.task.done():
                self.changed.clear()
                await self.changed.wait()
        return self.got

    async def ended(self) -> SubscriberReset | None:
        await asyncio.wait_for(self.task, 10)
        return self.reset

    def seen(self) -> list[tuple[int, str]]:
        return [(c["seq"], c["type"]) for c in self.got]


async def joined(run_id: str, last: int, **options) -> Reader:
    """A subscriber from the run's last logged chunk: once it was given that one (read from the log,
    after joining the run's group), whatever the run publishes reaches it live."""
    reader = Reader(subscribe(run_id, last - 1, until="final", **options))
    await reader.given(1)
    return reader


async def test_subscribe_tells_a_resyncing_reader_and_leaves_others_as_they_were():
    run_id, last = await suspended_run()
    resyncing, plain = await joined(run_id, last, resync=True), await joined(run_id, last)
    agreed = await dead_driver_then_taker(run_id, last + 1)
    for reader in (resyncing, plain):
        assert [c["type"] for c in (await reader.given(4))[1:]] == ["start", "step-start", "text-start"]
    await taker(run_id, agreed + 1)
    assert (await resyncing.ended()).resume_after == agreed
    # Without resync the taker's finish (a seq it was given) is skipped as seen.
    assert plain.reset is None and not plain.task.done()
    plain.task.cancel()


async def test_the_run_event_stream_ends_with_a_reset_event_whose_id_is_the_seq_to_resume_from():
    from datetime import timedelta

    from django.utils import timezone

    from agentrun.core.models import Run
    from tests.helpers.asgi import AsgiClient, parse

    token = await reviewer_token("tk-sse")
    run_id, last = await suspended_run()
    # Someone drives the run (a live lease): the stream stays open, live.
    await Run.objects.filter(pk=run_id).aupdate(
        lease_owner="host:1:dead", lease_expires_at=timezone.now() + timedelta(seconds=60)
    )
    response = await AsgiClient({"Authorization": f"Token {token}"}).get(f"/api/runs/{run_id}/stream?after={last - 1}")
    parts = response.parts()
    events = parse(await anext(parts))  # the log's last chunk: the stream has joined the run's group
    agreed = await dead_driver_then_taker(run_id, last + 1)
    while len(events) < 4:
        events += parse(await anext(parts))
    await taker(run_id, agreed + 1)
    async for part in parts:
        events += parse(part)
    assert [e["event"] for e in events] == ["chunk", "chunk", "chunk", "chunk", "reset"]
    assert events[-1] == {"id": str(agreed), "event": "reset", "data": f'{{"resumeAfter": {agreed}}}'}
    await Run.objects.filter(pk=run_id).aupdate(lease_owner=None, lease_expires_at=None)  # the staged driver goes


# --- issue 25 E: the log decides, whatever reaches the subscriber when --------------------------------
async def taker_unheard(run_id: str, seq: int) -> None:
    """The taker closes the dead segment, runs its own to the end and completes the run, but none of
    its chunks reaches the subscriber live (pub/sub is at-most-once; a publish can fail; a busy web
    process reads the log before its queue)."""
    from agentrun.core.models import Run

    log = ChunkLog(run_id, seq, [])
    log.emit("finish", TAKEOVER_FINISH)
    log.emit("start", {"runId": run_id})
    log.emit("step-start", {"messageId": "msg_taker"})
    log.emit("finish", {"finishReason": "stop"})
    await sync_to_async(log.flush_sync)(status=Run.Status.COMPLETED, lease_owner=None, lease_expires_at=None)


async def test_a_subscriber_that_reads_the_takers_chunks_from_the_log_is_reset():
    run_id, last = await suspended_run()
    reader = await joined(run_id, last, resync=True)
    agreed = await dead_driver_then_taker(run_id, last + 1)
    await reader.given(4)  # the dead driver's start, step-start, text-start, live
    await taker_unheard(run_id, agreed + 1)
    reset = await reader.ended()
    assert reset is not None, f"diverged silently from the log: {reader.seen()}"
    assert reset.resume_after == agreed


async def test_a_subscriber_resuming_after_chunks_a_taker_replaced_is_reset():
    run_id, last = await suspended_run()
    first = await joined(run_id, last, resync=True)
    agreed = await dead_driver_then_taker(run_id, last + 1)
    await first.given(4)
    first.task.cancel()  # the socket dropped (its web process drained: 1001); the client holds agreed + 2
    await taker_unheard(run_id, agreed + 1)
    again = Reader(subscribe(run_id, agreed + 2, until="final", resync=True))
    assert (await again.ended()).resume_after == agreed, again.seen()
    # Resuming there: the log's version, and no reset again.
    resumed = Reader(subscribe(run_id, agreed, until="final", resync=True))
    assert await resumed.ended() is None
    assert resumed.got[0]["payload"]["error"]["code"] == "driver_lost"


async def test_a_subscriber_resuming_before_the_takeover_happens_is_reset_once_it_is_logged(monkeypatch):
    import threading

    from agentrun.core import fanout

    run_id, last = await suspended_run()
    first = await joined(run_id, last, resync=True)
    agreed = await dead_driver_then_taker(run_id, last + 1)
    await first.given(4)
    first.task.cancel()
    # The client resumes after agreed + 2 while the log holds nothing after agreed yet.
    waiting = threading.Event()
    real_state = fanout._run_state

    def run_state(run_id: str):
        waiting.set()  # it read the log and the run's state: it waits for more
        return real_state(run_id)

    monkeypatch.setattr(fanout, "_run_state", run_state)
    again = Reader(subscribe(run_id, agreed + 2, until="final", resync=True))
    assert await asyncio.to_thread(waiting.wait, 10)
    await taker_unheard(run_id, agreed + 1)
    assert (await again.ended()).resume_after == agreed, again.seen()

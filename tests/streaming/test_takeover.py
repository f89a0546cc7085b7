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
from tests.streaming.test_websockets import EMAIL, communicator, receive_until, reviewer_token

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


async def test_subscribe_tells_a_resyncing_reader_and_leaves_others_as_they_were():
    run_id, last = await suspended_run()
    resyncing = subscribe(run_id, last, until="final", resync=True)
    plain = subscribe(run_id, last, until="final")
    # Both join the run's group and wait, live, before the dead driver publishes.
    firsts = [asyncio.ensure_future(anext(chunks)) for chunks in (resyncing, plain)]
    await asyncio.sleep(0.3)
    agreed = await dead_driver_then_taker(run_id, last + 1)
    for first, chunks in zip(firsts, (resyncing, plain), strict=True):
        rest = [(await anext(chunks))["type"] for _ in range(2)]
        assert [(await first)["type"], *rest] == ["start", "step-start", "text-start"]
    await taker(run_id, agreed + 1)
    with pytest.raises(SubscriberReset) as reset:
        await anext(resyncing)
    assert reset.value.resume_after == agreed
    await plain.aclose()


async def test_the_run_event_stream_ends_with_a_reset_event_whose_id_is_the_seq_to_resume_from():
    from datetime import timedelta

    from django.utils import timezone

    from agentrun.core.models import Run
    from tests.api.asgi_client import AsgiClient
    from tests.api.test_sse import parse

    token = await reviewer_token("tk-sse")
    run_id, last = await suspended_run()
    # Someone drives the run (a live lease): the stream stays open, live.
    await Run.objects.filter(pk=run_id).aupdate(
        lease_owner="host:1:dead", lease_expires_at=timezone.now() + timedelta(seconds=60)
    )
    response = await AsgiClient({"Authorization": f"Token {token}"}).get(f"/api/runs/{run_id}/stream?after={last}")
    parts = response.parts()
    reader = asyncio.ensure_future(anext(parts))
    await asyncio.sleep(0.3)
    agreed = await dead_driver_then_taker(run_id, last + 1)
    events = parse(await reader)
    while len(events) < 3:
        events += parse(await anext(parts))
    await taker(run_id, agreed + 1)
    async for part in parts:
        events += parse(part)
    assert [e["event"] for e in events] == ["chunk", "chunk", "chunk", "reset"]
    assert events[-1] == {"id": str(agreed), "event": "reset", "data": f'{{"resumeAfter": {agreed}}}'}

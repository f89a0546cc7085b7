"""Several real processes on PostgreSQL + Redis: fan-out across servers, and a driver killed mid-run."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
import websockets
from asgiref.sync import sync_to_async

from agentrun.core.models import Decision, Run, RunChunk, ToolEffect
from tests.helpers.runs import EMAIL_LINE as EMAIL
from tests.helpers.users import reviewer_token
from tests.helpers.waiting import async_wait_until

pytestmark = [pytest.mark.system, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@sync_to_async
def worker_listens() -> bool:
    """A session of the test database waits on ``LISTEN agentrun_tasks`` (its last statement)."""
    from django.db import connection

    from agentrun.management.commands.agentrun_worker import WAKEUP_CHANNEL

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
            [f"LISTEN {WAKEUP_CHANNEL}"],
        )
        return cursor.fetchone()[0] > 0


def ws_url(port: int, path: str, token: str) -> str:
    sep = "&" if "?" in path else "?"
    return f"ws://127.0.0.1:{port}{path}{sep}token={token}"


async def frames_until_finish(ws, timeout: float = 20) -> list[dict]:
    frames = []
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        assert frame.get("type") != "error", frame
        frames.append(frame)
        if frame["type"] == "finish":
            return frames


async def test_a_run_approved_through_one_server_streams_to_a_watcher_on_the_other(processes):
    token = await reviewer_token("sysrev")
    _, port_a = processes.daphne("daphne-a")
    _, port_b = processes.daphne("daphne-b")
    processes.worker("worker")  # a run started over a socket goes through the Tasks framework
    origin = {"origin": "http://localhost"}

    async with websockets.connect(ws_url(port_b, "/ws/agents/support-agent/", token), additional_headers=origin) as b:
        await b.send(json.dumps({"action": "stream", "messages": EMAIL, "memory": {"thread": "sys-1"}}))
        first = await frames_until_finish(b)
        run_id = first[0]["runId"]
        assert first[-1]["payload"]["finishReason"] == "suspended"

        async with websockets.connect(
            ws_url(port_a, f"/ws/runs/{run_id}/?after=0", token), additional_headers=origin
        ) as a:
            replay = await frames_until_finish(a)
            assert replay == first
            await b.send(json.dumps({"action": "approve", "runId": run_id}))
            decided = await frames_until_finish(b)
            watched = await frames_until_finish(a)
            assert watched == decided, "every continuation chunk reached the other server's watcher"
            with pytest.raises(websockets.ConnectionClosedOK):
                await asyncio.wait_for(a.recv(), 10)
            assert a.close_code == 1000

    seqs = [c["seq"] for c in first + decided]
    assert seqs == list(range(1, len(seqs) + 1))
    logged = [s async for s in RunChunk.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True)]
    assert logged == seqs


async def test_killing_the_process_running_a_continuation_does_not_lose_or_repeat_it(processes):
    from tests.system.slow_agents import slow_agent

    token = await reviewer_token("sysrev")
    _, port = processes.daphne("daphne")
    workers = {w.pid: w for w in (processes.worker("worker-1"), processes.worker("worker-2"))}

    # The run suspends (driven by this test process), waiting for approval of the slow tool.
    stream = await slow_agent.stream(
        '/tool slow-send {"to": "ada@example.com", "seconds": 3}', memory={"thread": "sys-2"}
    )
    await stream.collect()
    run_id = stream.run_id

    origin = {"origin": "http://localhost"}
    async with websockets.connect(ws_url(port, "/ws/agents/slow-agent/", token), additional_headers=origin) as ws:
        await ws.send(json.dumps({"action": "approve", "runId": run_id}))
        start = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert start["type"] == "start"
        # The decision queued its continuation: a worker takes it up. Wait until that worker holds the
        # lease and the approved tool is executing, then kill it.
        for _ in range(100):
            run = await Run.objects.aget(pk=run_id)
            if run.lease_owner and await ToolEffect.objects.filter(run_id=run_id).aexists():
                break
            await asyncio.sleep(0.05)
        driver = int(run.lease_owner.split(":")[1])
        assert driver in workers, "a worker drives the continuation, not the web process"
        os.kill(driver, signal.SIGKILL)

    # The other worker's sweep sees the lease expire and continues the run; the tool re-runs with the same id.
    for _ in range(300):
        run = await Run.objects.aget(pk=run_id)
        if run.status == Run.Status.COMPLETED and run.lease_owner is None:
            break
        await asyncio.sleep(0.1)
    assert run.status == Run.Status.COMPLETED, run.status
    assert run.lease_owner is None
    assert await ToolEffect.objects.filter(run_id=run_id).acount() == 1, "the side effect happened once"
    assert await Decision.objects.filter(run_id=run_id).acount() == 1
    texts = [c.payload["text"] async for c in RunChunk.objects.filter(run_id=run_id, type="text-delta").order_by("seq")]
    assert "".join(texts).startswith("slow-send:")


async def test_an_idle_worker_is_woken_by_a_decision_not_by_its_poll(processes):
    """Workers LISTEN for enqueued tasks (PostgreSQL NOTIFY): a decision's continuation starts at once even
    though the only worker polls once a minute and the sweeper's fallback would wait a minute too."""
    from agentrun.core.models import WorkerHeartbeat
    from agentrun.engine.agents import get_agent

    slow_fallbacks = {"AGENTRUN_LEASE_SECONDS": "60"}
    token = await reviewer_token("sysrev")
    _, port = processes.daphne("daphne", env=slow_fallbacks)
    processes.worker("worker", interval=60, env=slow_fallbacks)
    stream = await get_agent("support-agent").stream(EMAIL, memory={"thread": "sys-wake"})
    assert (await stream.collect())[-1]["payload"]["finishReason"] == "suspended"
    # The worker is up (its first sweep) and past its first poll: idle, listening.
    await async_wait_until(
        lambda: WorkerHeartbeat.objects.filter(role="worker").aexists(), 60, "the worker's first heartbeat"
    )
    await async_wait_until(worker_listens, 60, "the worker to LISTEN for enqueued tasks")

    origin = {"origin": "http://localhost"}
    async with websockets.connect(ws_url(port, "/ws/agents/support-agent/", token), additional_headers=origin) as ws:
        await ws.send(json.dumps({"action": "approve", "runId": stream.run_id}))
        chunks = await frames_until_finish(ws, timeout=20)
    assert chunks[-1]["payload"]["finishReason"] == "stop"
    assert (await Run.objects.aget(pk=stream.run_id)).status == Run.Status.COMPLETED

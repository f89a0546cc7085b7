"""Background tasks and until_idle: placeholder, completion in memory, continuation turns, idle close."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrun.core.models import BackgroundTask, Message, Run
from agentrun.engine.agents import Agent, get_agent
from agentrun.engine.background import PLACEHOLDER, cancel
from agentrun.engine.tools import tool
from tests.helpers.waiting import async_wait_until

pytestmark = pytest.mark.django_db(transaction=True)

TWO_RESEARCH = (
    '/tool research {"topic": "solana", "seconds": 0.3}\n/tool research {"topic": "ethereum", "seconds": 0.8}'
)


def texts(chunks: list[dict]) -> str:
    return "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")


async def test_until_idle_streams_first_turn_completions_and_a_continuation_per_finished_call():
    agent = get_agent("support-agent")
    stream = await agent.stream(TWO_RESEARCH, memory={"thread": "bg-1", "resource": "u1"}, until_idle=True)
    chunks = await asyncio.wait_for(stream.collect(), timeout=20)
    types = [c["type"] for c in chunks]
    seqs = [c["seq"] for c in chunks]
    assert seqs == list(range(1, len(chunks) + 1)), "one contiguous sequence across turns"

    started = [c for c in chunks if c["type"] == "background-task-started"]
    completed = [c for c in chunks if c["type"] == "background-task-completed"]
    assert len(started) == 2 and len(completed) == 2
    assert [c["payload"]["result"]["topic"] for c in completed] == ["solana", "ethereum"]
    # The first turn saw placeholders; aggregates describe the first turn only.
    first_text = await stream.text
    task_ids = [c["payload"]["taskId"] for c in started]
    assert PLACEHOLDER.format(id=task_ids[0], name="research") in first_text
    assert await stream.finish_reason == "stop"

    # One finish per turn: the first turn and one continuation turn per completion.
    assert types.count("finish") == types.count("start") == 3
    continuation_text = texts(chunks[types.index("finish") + 1 :])
    for c in completed:
        assert json.dumps(c["payload"]["result"]) in continuation_text
    assert chunks[-1]["type"] == "finish"

    run = await Run.objects.aget(pk=stream.run_id)
    assert run.status == Run.Status.COMPLETED
    # The placeholders in memory were replaced by the real results.
    contents = [m.content async for m in Message.objects.filter(thread_id="bg-1", role="tool")]
    assert all("Background task started" not in c for c in contents)
    assert {json.loads(c)["topic"] for c in contents} == {"solana", "ethereum"}


async def test_max_idle_closes_the_stream_but_the_task_completes_and_lands_in_memory():
    agent = get_agent("support-agent")
    stream = await agent.stream(
        '/tool research {"topic": "slow", "seconds": 1.5}',
        memory={"thread": "bg-2", "resource": "u1"},
        until_idle={"max_idle_ms": 300},
    )
    chunks = await asyncio.wait_for(stream.collect(), timeout=10)
    types = [c["type"] for c in chunks]
    assert "background-task-completed" not in types and types.count("finish") == 1
    row = await BackgroundTask.objects.aget(run_id=stream.run_id)
    for _ in range(60):
        await asyncio.sleep(0.1)
        await row.arefresh_from_db()
        if row.status == BackgroundTask.Status.COMPLETED:
            break
    assert row.status == BackgroundTask.Status.COMPLETED
    message = await Message.objects.aget(thread_id="bg-2", role="tool", tool_call_id=row.tool_call_id)
    assert json.loads(message.content) == {"topic": "slow", "summary": "A short summary of slow."}


async def test_plain_stream_without_until_idle_returns_after_the_first_turn():
    agent = get_agent("support-agent")
    stream = await agent.stream('/tool research {"topic": "x", "seconds": 0.2}', memory={"thread": "bg-3"})
    chunks = await asyncio.wait_for(stream.collect(), timeout=10)
    assert [c["type"] for c in chunks].count("finish") == 1
    assert (await Run.objects.aget(pk=stream.run_id)).status == Run.Status.COMPLETED
    # The task goes on after the stream ended, on this test's event loop: it lands before the test ends.
    completed = BackgroundTask.objects.filter(run_id=stream.run_id, status=BackgroundTask.Status.COMPLETED)
    await async_wait_until(completed.aexists, 10, "the background task to complete")
    released = Run.objects.filter(pk=stream.run_id, lease_owner__isnull=True)
    await async_wait_until(released.aexists, 30, "the run's driver to let it go")


flaky_calls: dict[str, int] = {}


@tool(id="flaky", background={"max_retries": 2, "timeout_ms": 2000})
async def flaky(key: str) -> dict:
    flaky_calls[key] = flaky_calls.get(key, 0) + 1
    if flaky_calls[key] < 3:
        raise RuntimeError(f"attempt {flaky_calls[key]} failed")
    return {"ok": key}


@tool(id="stuck", background={"timeout_ms": 200})
async def stuck(seconds: float) -> dict:
    await asyncio.sleep(seconds)
    return {"never": True}


@tool(id="sleepy", background=True)
async def sleepy(seconds: float) -> dict:
    await asyncio.sleep(seconds)
    return {"slept": seconds}


bg_agent = Agent(id="bg-test-agent", tools=[flaky, stuck, sleepy], background_concurrency=1, register=True)


async def test_retries_timeouts_and_failure_text():
    stream = await bg_agent.stream(
        '/tool flaky {"key": "k1"}\n/tool stuck {"seconds": 5}', memory={"thread": "bg-4"}, until_idle=True
    )
    chunks = await asyncio.wait_for(stream.collect(), timeout=20)
    failed = [c for c in chunks if c["type"] == "background-task-failed"]
    completed = [c for c in chunks if c["type"] == "background-task-completed"]
    assert completed and completed[0]["payload"]["result"] == {"ok": "k1"}
    assert flaky_calls["k1"] == 3, "two retries, then success"
    assert failed and failed[0]["payload"]["status"] == "timed_out"
    assert "stuck: error: Background task failed: timed out" in texts(chunks)


async def test_per_agent_limit_queues_tasks_and_cancel_of_a_queued_task():
    stream = await bg_agent.stream(
        '/tool sleepy {"seconds": 0.6}\n/tool sleepy {"seconds": 0.1}\n/tool sleepy {"seconds": 0.1}',
        memory={"thread": "bg-5"},
        until_idle=True,
    )

    async def first_one_running() -> list[BackgroundTask] | None:
        rows = [r async for r in BackgroundTask.objects.filter(run_id=stream.run_id).order_by("created_at")]
        return rows if len(rows) == 3 and rows[0].status == "running" else None

    rows = await async_wait_until(first_one_running, 10, "the first of the three tasks to run")
    assert [r.status for r in rows] == ["running", "pending", "pending"], "limit 1: the others wait"
    await cancel(rows[2].id)
    chunks = await asyncio.wait_for(stream.collect(), timeout=20)
    statuses = {r.id: r.status async for r in BackgroundTask.objects.filter(run_id=stream.run_id)}
    assert statuses == {rows[0].id: "completed", rows[1].id: "completed", rows[2].id: "cancelled"}
    assert any(c["type"] == "background-task-cancelled" for c in chunks)

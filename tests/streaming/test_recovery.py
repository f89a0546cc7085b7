"""The sweep takes over runs whose driver died and tasks whose worker died."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from agentrun.core.models import BackgroundTask, Decision, Run, SuspendedToolCall, ToolEffect
from agentrun.engine.agents import get_agent
from agentrun.engine.loop import Segment, SegmentResult
from agentrun.engine.sweeper import sweep_once
from agentrun.engine.types import Decider
from tests.helpers.decisions import record_decision as decide

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL = '/tool send-email {"to": "ada@example.com", "subject": "Hi", "body": "Hello"}'


async def wait_for_status(run_id: str, status: str, seconds: float = 10) -> Run:
    for _ in range(int(seconds * 20)):
        run = await Run.objects.aget(pk=run_id)
        if run.status == status and run.lease_owner is None:  # the driver is done with it too
            return run
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} is {run.status}, expected {status}")


async def suspended_email_run(thread: str) -> str:
    stream = await get_agent("support-agent").stream(EMAIL, memory={"thread": thread})
    await stream.collect()
    return stream.run_id


async def test_a_run_whose_driver_died_mid_execution_is_continued_and_the_tool_runs_once(settings):
    settings.AGENTRUN_LEASE_SECONDS = 0.5
    run_id = await suspended_email_run("rec-1")
    await sync_to_async(decide)(agent_id="support-agent", run_id=run_id, kind="approve", decider=Decider.system("ops"))
    # The driver claimed the run, marked the call executing, applied the side effect, then died.
    call = await SuspendedToolCall.objects.aget(run_id=run_id)
    await SuspendedToolCall.objects.filter(pk=call.pk).aupdate(status=SuspendedToolCall.Status.EXECUTING)
    await ToolEffect.objects.acreate(tool_call_id=call.tool_call_id, run_id=run_id, tool_name="send-email")
    await Run.objects.filter(pk=run_id).aupdate(
        lease_owner="deadhost:1:x", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    report = await sweep_once()
    assert report["stalled"] == 1
    run = await wait_for_status(run_id, Run.Status.COMPLETED)
    assert run.lease_owner is None
    assert await ToolEffect.objects.filter(tool_call_id=call.tool_call_id).acount() == 1
    assert await Decision.objects.filter(run_id=run_id).acount() == 1


async def test_a_decision_whose_continuation_was_never_dispatched_is_continued(settings, clock):
    settings.AGENTRUN_LEASE_SECONDS = 30
    run_id = await suspended_email_run("rec-2")
    await sync_to_async(decide)(agent_id="support-agent", run_id=run_id, kind="approve", decider=Decider.system("ops"))
    assert (await sweep_once())["stalled"] == 0, "within the grace period nothing is taken over"
    clock.advance(31)  # past the grace period (one lease period)
    assert (await sweep_once())["stalled"] == 1
    await wait_for_status(run_id, Run.Status.COMPLETED)
    assert await ToolEffect.objects.filter(run_id=run_id).acount() == 1


async def test_a_background_task_left_running_by_a_dead_process_is_recovered(settings):
    settings.AGENTRUN_LEASE_SECONDS = 0.2
    settings.AGENTRUN_BACKGROUND_CONCURRENCY = 0  # nothing starts by itself: we stage the dead worker
    stream = await get_agent("support-agent").stream(
        '/tool research {"topic": "lost", "seconds": 0.1}', memory={"thread": "rec-3"}
    )
    await stream.collect()
    row = await BackgroundTask.objects.aget(run_id=stream.run_id)
    await BackgroundTask.objects.filter(pk=row.pk).aupdate(
        status=BackgroundTask.Status.RUNNING, attempts=1, heartbeat_at=timezone.now() - timedelta(seconds=5)
    )
    settings.AGENTRUN_BACKGROUND_CONCURRENCY = 8
    report = await sweep_once()
    assert report["recovered"] == 1
    for _ in range(100):
        await row.arefresh_from_db()
        if row.status == BackgroundTask.Status.COMPLETED:
            break
        await asyncio.sleep(0.05)
    assert row.status == BackgroundTask.Status.COMPLETED and row.attempts == 2


async def test_a_run_whose_driver_died_before_its_first_chunk_is_continued(settings, monkeypatch):
    """stream() creates the run with its driver's lease: a driver that dies before writing anything
    leaves a run a sweep takes over once that lease lapses (a run left queued without one was never
    taken over)."""
    settings.AGENTRUN_LEASE_SECONDS = 0.5
    run_segment, died = Segment.run, []

    async def dies_at_once(self: Segment) -> SegmentResult:
        if not died:  # the first driver: its process is gone before its first statement
            died.append(self.run_id)
            return SegmentResult(finish_reason="error")
        return await run_segment(self)

    monkeypatch.setattr(Segment, "run", dies_at_once)
    stream = await get_agent("support-agent").stream("Where is my order?", memory={"thread": "rec-died-early"})
    await stream.collect()
    assert died == [stream.run_id]
    assert (await sweep_once())["stalled"] == 0, "its driver's lease still holds"
    await asyncio.sleep(0.6)
    assert (await sweep_once())["stalled"] == 1
    run = await wait_for_status(stream.run_id, Run.Status.COMPLETED)
    assert run.started_at is not None

"""Runs dispatched through the Tasks framework: the caller relays the fan-out, chunks and aggregates alike."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from agentrun.core.models import Run, RunChunk
from agentrun.engine.agents import follow, get_agent
from tests.helpers.decisions import decide_call

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL = '/tool send-email {"to": "ada@example.com", "subject": "Hi", "body": "Hello"}'


async def logged(run_id: str) -> list[dict]:
    return [c.to_chunk() async for c in RunChunk.objects.filter(run_id=run_id).order_by("seq")]


async def test_a_dispatched_run_streams_what_the_worker_produces():
    agent = get_agent("support-agent")
    stream = await agent.stream("hello dispatched world", memory={"thread": "dsp-1"}, dispatch=True)
    chunks = await stream.collect()
    assert chunks == await logged(stream.run_id)
    assert [c["seq"] for c in chunks] == list(range(1, len(chunks) + 1))
    assert await stream.text == "Echo: hello dispatched world"
    assert await stream.finish_reason == "stop"
    assert (await stream.usage)["completionTokens"] == 4


async def test_a_decision_made_by_the_service_is_followed_through_the_chunk_log():
    agent = get_agent("support-agent")
    first = await agent.stream(EMAIL, memory={"thread": "dsp-2"}, dispatch=True)
    opening = await first.collect()
    assert opening[-1]["payload"]["finishReason"] == "suspended"
    assert [c["name"] for c in await first.tool_calls] == ["send-email"]

    # Any door (here the service itself, as a REST view calls it): the continuation is queued with the
    # decision and runs in the task runner; the caller only follows the log.
    outcome = await sync_to_async(decide_call)(agent_id=agent.id, run_id=first.run_id, kind="approve")
    assert outcome.after_seq == opening[-1]["seq"]
    cont = follow(outcome)
    chunks = await cont.collect()
    assert chunks[0]["type"] == "start" and chunks[0]["seq"] == opening[-1]["seq"] + 1
    assert chunks[-1]["type"] == "finish" and chunks[-1]["payload"]["finishReason"] == "stop"
    assert (await cont.text).startswith("send-email:")
    assert (await Run.objects.aget(pk=first.run_id)).status == Run.Status.COMPLETED


async def test_a_run_cancelled_before_a_worker_took_it_up_ends_its_relayed_stream(monkeypatch):
    from agentrun.engine import dispatch
    from agentrun.engine.decisions import cancel_run

    class NoWorker:  # the task is queued, and no worker takes it up
        async def aenqueue(self, *args, **kwargs):
            return None

    monkeypatch.setattr(dispatch, "continue_run", NoWorker())
    stream = await get_agent("support-agent").stream("nobody runs me", memory={"thread": "dsp-3"}, dispatch=True)
    await sync_to_async(cancel_run)(run_id=stream.run_id)
    assert await stream.collect() == []
    assert await stream.finish_reason == "cancelled"

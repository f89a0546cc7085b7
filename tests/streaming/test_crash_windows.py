"""Issue 25 B: the chunk log is complete whatever dies when. A process dying right after a state change
commits has logged the chunks announcing it (they are written in that transaction); a write that fails
leaves no gap; a driver that stalled past its lease writes nothing over its taker's; and a run whose
driver died after it was cancelled still gets its segment closed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from agentrun.core.models import Run, RunChunk, SuspendedToolCall, ToolEffect
from agentrun.engine import lease, store
from agentrun.engine.agents import get_agent
from agentrun.engine.chunklog import ChunkLog, LeaseLost
from agentrun.engine.decisions import cancel_run
from agentrun.engine.dispatch import continue_run
from agentrun.engine.loop import Segment
from agentrun.engine.types import Decider
from tests.helpers.decisions import record_decision as decide

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL = '/tool send-email {"to": "ada@example.com", "subject": "Hi", "body": "Hello"}'


class Died(BaseException):
    """The process stops here (SIGKILL): nothing after this point of the driver runs."""


async def approved_run(thread: str, kind: str = "approve") -> str:
    stream = await get_agent("support-agent").stream(EMAIL, memory={"thread": thread})
    await stream.collect()
    await sync_to_async(decide)(
        agent_id="support-agent", run_id=stream.run_id, kind=kind, decider=Decider.system("ops")
    )
    return stream.run_id


async def logged(run_id: str) -> list[RunChunk]:
    return [c async for c in RunChunk.objects.filter(run_id=run_id).order_by("seq")]


def well_formed(chunks: list[RunChunk]) -> list[str]:
    """The log's types, after checking what every log must be: contiguous seqs, one finish per start."""
    types = [c.type for c in chunks]
    assert [c.seq for c in chunks] == list(range(1, len(chunks) + 1)), types
    starts = [i for i, t in enumerate(types) if t == "start"]
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(types)
        assert types[start:end].count("finish") == 1 and types[end - 1] == "finish", types
    return types


@pytest.mark.parametrize(
    ("write", "kind", "announced"),
    [
        ("record_tool_result", "approve", "tool-result"),
        ("record_tool_result", "decline", "tool-output-denied"),
        ("record_answer", "approve", "tool-result"),
    ],
)
async def test_a_driver_dying_right_after_a_commit_leaves_its_announcement_logged(monkeypatch, write, kind, announced):
    run_id = await approved_run(f"die-{write}-{kind}", kind=kind)
    agent = get_agent("support-agent")
    real = getattr(store, write)

    def committed_then_died(*args, **kwargs):
        real(*args, **kwargs)
        raise Died(write)

    with monkeypatch.context() as m:
        m.setattr(store, write, committed_then_died)
        with pytest.raises(Died):
            await Segment(agent, run_id).run()
    await Segment(agent, run_id, only_if_needed=True).run()  # the sweep's continuation, as a taker

    chunks = await logged(run_id)
    types = well_formed(chunks)
    assert types.count(announced) == 1, types
    finishes = [c.payload for c in chunks if c.type == "finish"]
    assert finishes[-1]["finishReason"] == "stop", types  # the answer's own finish, not a takeover's
    assert (await Run.objects.aget(pk=run_id)).status == "completed"


@pytest.mark.parametrize("write", ["record_tool_result", "record_answer"])
async def test_a_write_that_fails_leaves_no_gap_in_the_log_and_one_finish(monkeypatch, write):
    run_id = await approved_run(f"gap-{write}")

    def fails(run, *args, **kwargs):
        log = next(a for a in (*args, *kwargs.values()) if isinstance(a, ChunkLog))
        with transaction.atomic():
            log.flush_sync()  # the batch is taken, then the transaction fails
            raise ValueError("a bug in a write")

    monkeypatch.setattr(store, write, fails)
    await Segment(get_agent("support-agent"), run_id).run()
    chunks = await logged(run_id)
    types = well_formed(chunks)
    assert types.count("start") == 2 and types[-2:] == ["error", "finish"], types
    # What the failed write would have announced never reached the log.
    assert ("tool-result" in types) == (write == "record_answer"), types
    assert chunks[-1].payload["finishReason"] == "error"
    assert (await Run.objects.aget(pk=run_id)).status == "failed"


async def test_a_driver_that_lost_its_lease_writes_nothing_and_fails_nothing(monkeypatch):
    run_id = await approved_run("lease-lost")
    real = store.record_tool_result

    def taken_over_meanwhile(*args, **kwargs):
        # The driver stalled past its lease while the approved tool ran: a sweep handed the run on.
        Run.objects.filter(pk=run_id).update(lease_owner="dispatch:taker", lease_expires_at=timezone.now())
        return real(*args, **kwargs)

    before = await logged(run_id)
    monkeypatch.setattr(store, "record_tool_result", taken_over_meanwhile)
    with pytest.raises(LeaseLost):
        await Segment(get_agent("support-agent"), run_id).run()
    run = await Run.objects.aget(pk=run_id)
    assert run.status == "in_progress" and run.last_error is None
    assert [c.seq for c in await logged(run_id)] == [c.seq for c in before]  # nothing over the taker's seqs
    call = await SuspendedToolCall.objects.aget(run_id=run_id)
    assert call.status == SuspendedToolCall.Status.EXECUTING  # approved, to be carried out by the taker

    monkeypatch.undo()
    await Segment(get_agent("support-agent"), run_id, only_if_needed=True).run()
    types = well_formed(await logged(run_id))
    assert types.count("tool-result") == 1
    assert await ToolEffect.objects.filter(run_id=run_id).acount() == 1  # the effect ledger: once
    assert (await Run.objects.aget(pk=run_id)).status == "completed"


async def test_a_run_cancelled_after_its_driver_died_gets_its_segment_closed():
    stream = await get_agent("support-agent").stream(EMAIL, memory={"thread": "cancel-dead"})
    await stream.collect()
    run_id = stream.run_id
    # A driver starts a segment, logs its start and dies; the run is cancelled meanwhile.
    run = await Run.objects.aget(pk=run_id)
    dead = ChunkLog(run_id, run.next_seq, [])
    dead.emit("start", {"runId": run_id})
    await sync_to_async(dead.flush_sync)(
        lease_owner="host:1:dead", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    await sync_to_async(cancel_run)(run_id=run_id)

    claimed = await sync_to_async(lease.claim_stalled_runs)()
    assert claimed == [("support-agent", run_id)]
    await continue_run.acall("support-agent", run_id)
    chunks = await logged(run_id)
    types = well_formed(chunks)
    assert chunks[-1].payload["error"]["code"] == "driver_lost", types
    assert (await Run.objects.aget(pk=run_id)).status == "cancelled"


@pytest.mark.parametrize("write", ["record_model_step", "record_tool_result"])
async def test_calls_a_driver_never_carried_out_run_when_the_run_is_taken_over(monkeypatch, write):
    """The model asked for two tools that need nobody; the driver stopped after the step was recorded
    (or after the first result): the taker runs what has no result yet, with the same ids."""
    agent = get_agent("support-agent")
    lines = '/tool lookup-order {"orderId": "A-1"}\n/tool echo {"value": 2}'
    real = getattr(store, write)

    def committed_then_died(*args, **kwargs):
        result = real(*args, **kwargs)
        if kwargs.get("calls") or kwargs.get("call"):  # the model step with calls, or a tool result
            raise Died(write)
        return result

    run = await sync_to_async(store.create_run)(
        agent_id=agent.id,
        messages=[{"role": "user", "content": lines}],
        thread_id=f"never-{write}",
        resource_id=None,
        metadata={},
        options={},
    )
    run_id = run.id
    with monkeypatch.context() as m:
        m.setattr(store, write, committed_then_died)
        with pytest.raises(Died):
            await Segment(agent, run_id).run()
    await Segment(agent, run_id, only_if_needed=True).run()  # the sweep's continuation, as a taker

    chunks = await logged(run_id)
    types = well_formed(chunks)
    results = [c.payload for c in chunks if c.type == "tool-result"]
    assert sorted(r["toolName"] for r in results) == ["echo", "lookup-order"], types
    assert chunks[-1].payload["finishReason"] == "stop", types
    run = await Run.objects.aget(pk=run_id)
    assert run.status == "completed"
    calls = [e["function"] for e in (await store_step(run_id)).step_details["toolCalls"]]
    assert all(c["output"] for c in calls)


async def store_step(run_id: str):
    from agentrun.core.models import RunStep

    return await RunStep.objects.filter(run_id=run_id, type=RunStep.Type.TOOL_CALLS).aget()

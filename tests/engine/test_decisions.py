"""Approve / decline / resume (docs/runs.md#decisions, docs/runs.md#exactly-once) through the Python API."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from agentrun import AgentRunError, get_agent, get_run
from agentrun.core.models import Decision, Snapshot, SuspendedToolCall, ToolEffect
from tests.helpers.runs import (
    EMAIL,
    chunk_rows,
    collect,
    final_answer,
    of_type,
    snapshot_exists,
    start,
    suspended_email_run,
    tool_line,
)

pytestmark = pytest.mark.django_db(transaction=True)

DEFAULT_DECLINE = "Tool call was not approved by the user"


@pytest.fixture
def agent():
    return get_agent("support-agent")


@sync_to_async
def decisions_of(run_id: str) -> list[Decision]:
    return list(Decision.objects.filter(run_id=run_id).order_by("decided_at", "id"))


@sync_to_async
def effects_of(run_id: str) -> list[ToolEffect]:
    return list(ToolEffect.objects.filter(run_id=run_id))


async def _expect_error(code: str, coro) -> AgentRunError:
    with pytest.raises(AgentRunError) as err:
        await coro
    assert err.value.code == code, err.value
    return err.value


async def _still_waiting(agent, run_id: str, open_calls: int = 1) -> None:
    """Nothing changed: the run is still suspended, listed with its open calls, and undecided."""
    assert (await get_run(run_id)).status == "suspended"
    page = await agent.list_suspended_runs()
    [run] = [r for r in page.runs if r.run_id == run_id]
    assert len(run.tool_calls) == open_calls


# --- approve -----------------------------------------------------------------------------------
async def test_approve_runs_the_tool_and_the_model_answers_with_its_result(agent):
    run_id = await suspended_email_run()
    stream, chunks = await collect(agent.approve_tool_call(run_id=run_id, reason="looks fine"))
    assert stream.run_id == run_id
    [result] = of_type(chunks, "tool-result")
    assert result["payload"]["result"] == {"sent": True, "to": EMAIL["to"]}
    assert await final_answer(run_id) == 'send-email: {"sent": true, "to": "ann@example.com"}'
    [decision] = await decisions_of(run_id)
    assert (decision.kind, decision.args, decision.edited_args, decision.reason, decision.via) == (
        "approve",
        EMAIL,
        None,
        "looks fine",
        "python",
    )
    [effect] = await effects_of(run_id)
    assert effect.payload == EMAIL


async def test_approve_with_edited_args_runs_the_tool_with_them(agent):
    run_id = await suspended_email_run()
    edited = {"to": "bob@example.com", "subject": "Fixed", "body": "Edited by a reviewer."}
    _, chunks = await collect(agent.approve_tool_call(run_id=run_id, args=edited))
    [effect] = await effects_of(run_id)
    assert effect.payload == edited
    assert of_type(chunks, "tool-result")[0]["payload"]["result"] == {"sent": True, "to": "bob@example.com"}
    assert await final_answer(run_id) == 'send-email: {"sent": true, "to": "bob@example.com"}'
    [decision] = await decisions_of(run_id)
    assert decision.args == EMAIL and decision.edited_args == edited  # both kept for the audit trail


@pytest.mark.parametrize(
    "bad_args",
    [
        {"to": "bob@example.com"},  # missing fields
        {**EMAIL, "cc": "eve@example.com"},  # unknown field
        {**EMAIL, "subject": ["not", "a", "string"]},
        "not an object",
    ],
)
async def test_approve_with_invalid_edited_args_changes_nothing(agent, bad_args):
    run_id = await suspended_email_run()
    await _expect_error("ARGS_INVALID", agent.approve_tool_call(run_id=run_id, args=bad_args))
    await _still_waiting(agent, run_id)
    assert await decisions_of(run_id) == []
    assert await effects_of(run_id) == []
    # ...and the call can still be approved properly afterwards.
    _, chunks = await collect(agent.approve_tool_call(run_id=run_id))
    assert chunks[-1]["payload"]["finishReason"] == "stop"


# --- decline -----------------------------------------------------------------------------------
async def test_decline_without_reason_sends_the_default_text_to_the_model(agent):
    run_id = await suspended_email_run()
    _, chunks = await collect(agent.decline_tool_call(run_id=run_id))
    [denied] = of_type(chunks, "tool-output-denied")
    assert denied["payload"]["approval"]["approved"] is False
    assert denied["payload"]["approval"]["reason"] == DEFAULT_DECLINE
    assert denied["payload"]["toolName"] == "send-email"
    assert await final_answer(run_id) == f"send-email: denied: {DEFAULT_DECLINE}"
    assert await effects_of(run_id) == []  # the tool did not run
    [decision] = await decisions_of(run_id)
    assert decision.kind == "decline" and decision.reason is None
    assert denied["payload"]["approval"]["id"] == decision.id


async def test_decline_reason_reaches_the_model_and_the_chunk(agent):
    run_id = await suspended_email_run()
    reason = "Customer asked us not to email them"
    _, chunks = await collect(agent.decline_tool_call(run_id=run_id, reason=reason))
    assert of_type(chunks, "tool-output-denied")[0]["payload"]["approval"]["reason"] == reason
    assert await final_answer(run_id) == f"send-email: denied: {reason}"
    assert (await decisions_of(run_id))[0].reason == reason
    assert await effects_of(run_id) == []
    assert (await get_run(run_id)).status == "completed"


# --- resume ------------------------------------------------------------------------------------
async def _ask_user_run(agent) -> tuple[str, list[dict]]:
    stream, chunks = await start("support-agent", tool_line("ask-user", {"question": "Which city?"}))
    return stream.run_id, chunks


async def test_resume_reruns_the_tool_with_the_resume_data(agent):
    run_id, chunks = await _ask_user_run(agent)
    [suspended] = of_type(chunks, "tool-call-suspended")
    assert suspended["payload"]["suspendPayload"] == {"question": "Which city?"}
    assert suspended["payload"]["resumeSchema"]["properties"]["answer"]["type"] == "string"
    [listed] = (await agent.list_suspended_runs()).runs
    assert listed.tool_calls[0].requires_approval is False
    assert listed.tool_calls[0].suspend_payload == {"question": "Which city?"}

    _, chunks = await collect(agent.resume_stream({"answer": "San Francisco"}, run_id=run_id))
    assert of_type(chunks, "tool-result")[0]["payload"]["result"] == {"answer": "San Francisco"}
    assert await final_answer(run_id) == 'ask-user: {"answer": "San Francisco"}'
    [decision] = await decisions_of(run_id)
    assert decision.kind == "resume" and decision.resume_data == {"answer": "San Francisco"}


@pytest.mark.parametrize("data", [{"answer": ""}, {}, {"answer": 3}, "San Francisco", None])
async def test_resume_data_is_validated_against_the_resume_schema(agent, data):
    run_id, _ = await _ask_user_run(agent)
    await _expect_error("RESUME_DATA_INVALID", agent.resume_stream(data, run_id=run_id))
    await _still_waiting(agent, run_id)
    assert await decisions_of(run_id) == []


async def test_wrong_decision_kind_both_ways(agent):
    ask_run, _ = await _ask_user_run(agent)
    await _expect_error("WRONG_DECISION_KIND", agent.approve_tool_call(run_id=ask_run))
    await _expect_error("WRONG_DECISION_KIND", agent.decline_tool_call(run_id=ask_run))
    email_run = await suspended_email_run(thread="t-2")
    await _expect_error("WRONG_DECISION_KIND", agent.resume_stream({"answer": "x"}, run_id=email_run))
    await _still_waiting(agent, ask_run)
    await _still_waiting(agent, email_run)
    assert await decisions_of(ask_run) == [] and await decisions_of(email_run) == []


async def test_unknown_tool_call_id_is_not_suspended(agent):
    run_id = await suspended_email_run()
    await _expect_error("TOOL_CALL_NOT_SUSPENDED", agent.approve_tool_call(run_id=run_id, tool_call_id="call_nope"))
    await _still_waiting(agent, run_id)


async def test_unknown_run_is_not_found(agent):
    await _expect_error("RUN_NOT_FOUND", agent.approve_tool_call(run_id="run_does_not_exist"))


async def test_deciding_twice_is_already_decided(agent):
    run_id = await suspended_email_run()
    [call_id] = [c.tool_call_id for r in (await agent.list_suspended_runs()).runs for c in r.tool_calls]
    await collect(agent.approve_tool_call(run_id=run_id, tool_call_id=call_id))
    err = await _expect_error("TOOL_CALL_ALREADY_DECIDED", agent.decline_tool_call(run_id=run_id, tool_call_id=call_id))
    assert err.details["decision"] == "approve"
    assert len(await decisions_of(run_id)) == 1
    assert len(await effects_of(run_id)) == 1


async def test_deciding_twice_before_the_continuation_ran_is_already_decided(agent):
    run_id = await suspended_email_run()
    first = await agent.approve_tool_call(run_id=run_id)
    await _expect_error("TOOL_CALL_ALREADY_DECIDED", agent.approve_tool_call(run_id=run_id))
    await first.collect()
    assert len(await decisions_of(run_id)) == 1 and len(await effects_of(run_id)) == 1


async def test_another_agent_can_neither_see_nor_decide_the_run(agent):
    run_id = await suspended_email_run()
    billing = get_agent("billing-agent")
    await _expect_error("RUN_NOT_FOUND", billing.approve_tool_call(run_id=run_id))
    await _expect_error("RUN_NOT_FOUND", billing.decline_tool_call(run_id=run_id))
    await _expect_error("RUN_NOT_FOUND", billing.resume_stream({"answer": "x"}, run_id=run_id))
    await _still_waiting(agent, run_id)
    assert await decisions_of(run_id) == []


# --- several calls in one step (docs/runs.md#decisions) ------------------------------------------
TWO_EMAILS = "\n".join(
    [
        tool_line("send-email", EMAIL),
        tool_line("send-email", {**EMAIL, "to": "bob@example.com"}),
    ]
)


@pytest.mark.parametrize("order", ["first-then-second", "second-then-first"])
async def test_two_approval_calls_in_one_step_are_listed_together_and_decided_in_either_order(
    agent, order, monkeypatch
):
    stream, chunks = await start("support-agent", TWO_EMAILS)
    run_id = stream.run_id
    approvals = of_type(chunks, "tool-call-approval")
    assert [c["payload"]["args"]["to"] for c in approvals] == ["ann@example.com", "bob@example.com"]
    # A tool-call chunk precedes the tool-call-approval of the same call.
    for approval in approvals:
        call_id = approval["payload"]["toolCallId"]
        [tool_call] = [c for c in chunks if c["type"] == "tool-call" and c["payload"]["toolCallId"] == call_id]
        assert tool_call["seq"] < approval["seq"]

    [listed] = (await agent.list_suspended_runs()).runs
    ids = [c.tool_call_id for c in listed.tool_calls]
    assert ids == [a["payload"]["toolCallId"] for a in approvals]
    first, second = ids if order == "first-then-second" else ids[::-1]

    # Count model calls from here on: the model is called again only once both calls have results.
    model = agent.model
    calls = []
    original = type(model).stream

    def counting(self, messages, tools):
        calls.append(len(messages))
        return original(self, messages, tools)

    monkeypatch.setattr(type(model), "stream", counting)

    # Without a toolCallId the choice is ambiguous.
    err = await _expect_error("AMBIGUOUS_TOOL_CALL", agent.approve_tool_call(run_id=run_id))
    assert sorted(err.details["toolCallIds"]) == sorted(ids)

    _, seg2 = await collect(agent.approve_tool_call(run_id=run_id, tool_call_id=first))
    assert calls == []
    assert seg2[-1]["payload"]["finishReason"] == "suspended"
    assert [c["payload"]["toolCallId"] for c in of_type(seg2, "tool-result")] == [first]
    assert (await get_run(run_id)).status == "suspended"
    [listed] = (await agent.list_suspended_runs()).runs
    assert [c.tool_call_id for c in listed.tool_calls] == [second]
    await _expect_error("TOOL_CALL_ALREADY_DECIDED", agent.approve_tool_call(run_id=run_id, tool_call_id=first))

    _, seg3 = await collect(agent.decline_tool_call(run_id=run_id, tool_call_id=second, reason="not bob"))
    assert len(calls) == 1
    assert seg3[-1]["payload"]["finishReason"] == "stop"
    assert (await agent.list_suspended_runs()).total == 0
    # One answer line per call, in the order the model made them, whatever the order of decisions.
    to_of = {ids[0]: "ann@example.com", ids[1]: "bob@example.com"}
    expected = {first: f'send-email: {{"sent": true, "to": "{to_of[first]}"}}', second: "send-email: denied: not bob"}
    assert (await final_answer(run_id)).splitlines() == [expected[ids[0]], expected[ids[1]]]

    # Every segment ends with exactly one finish; seq starts at 1 and is contiguous across segments.
    all_chunks = chunks + seg2 + seg3
    for segment in (chunks, seg2, seg3):
        assert [c["type"] for c in segment].count("finish") == 1 and segment[-1]["type"] == "finish"
    assert [c["seq"] for c in all_chunks] == list(range(1, len(all_chunks) + 1))
    rows = await chunk_rows(run_id)
    assert [(r.seq, r.type) for r in rows] == [(c["seq"], c["type"]) for c in all_chunks]
    assert {c["runId"] for c in all_chunks} == {run_id} and {c["from"] for c in all_chunks} == {"AGENT"}


async def test_snapshot_and_open_calls_are_gone_once_the_run_completes(agent):
    run_id = await suspended_email_run()
    await collect(agent.approve_tool_call(run_id=run_id))

    @sync_to_async
    def leftovers():
        return Snapshot.objects.filter(run_id=run_id).count(), SuspendedToolCall.objects.filter(run_id=run_id).count()

    assert await leftovers() == (0, 0)
    assert len(await decisions_of(run_id)) == 1  # decisions outlive snapshots


async def test_two_reviewers_deciding_both_calls_at_once_get_one_model_answer(agent):
    import asyncio
    import threading

    from django.db import connection

    from agentrun.engine.loop import Segment
    from tests.helpers.decisions import record_decision as decide
    from tests.helpers.runs import steps_of

    stream, _ = await start("support-agent", TWO_EMAILS)
    run_id = stream.run_id
    [listed] = (await agent.list_suspended_runs()).runs
    ids = [c.tool_call_id for c in listed.tool_calls]
    barrier = threading.Barrier(2, timeout=10)

    def reviewer(call_id: str, kind: str):
        try:
            barrier.wait()
            return decide(agent_id="support-agent", run_id=run_id, tool_call_id=call_id, kind=kind)
        finally:
            connection.close()

    outcomes = await asyncio.gather(
        asyncio.to_thread(reviewer, ids[0], "approve"), asyncio.to_thread(reviewer, ids[1], "decline")
    )
    assert sorted(o.run_status for o in outcomes) == ["in_progress", "suspended"]
    await asyncio.gather(Segment(agent, run_id).run(), Segment(agent, run_id).run())
    assert (await get_run(run_id)).status == "completed"
    assert (await final_answer(run_id)).splitlines() == [
        'send-email: {"sent": true, "to": "ann@example.com"}',
        f"send-email: denied: {DEFAULT_DECLINE}",
    ]
    steps = await steps_of(run_id)
    assert [s.type for s in steps] == ["tool_calls", "message_creation"]
    assert len(await decisions_of(run_id)) == 2 and len(await effects_of(run_id)) == 1
    rows = await chunk_rows(run_id)
    assert [r.seq for r in rows] == list(range(1, len(rows) + 1))


async def test_a_run_past_its_time_to_live_is_not_listed_and_cannot_be_decided(clock):
    from agentrun.engine.agents import Agent

    demo = get_agent("support-agent")
    short = Agent(id="short-lived-agent", tools=list(demo.tools.values()), model="directive", suspended_run_ttl=60)
    stream, _ = await collect(short.stream(tool_line("send-email", EMAIL)))
    assert (await short.list_suspended_runs()).total == 1
    clock.advance(61)  # past its time to live
    assert (await short.list_suspended_runs()).total == 0  # before any sweeper ran
    err = await _expect_error("TOOL_CALL_ALREADY_DECIDED", short.approve_tool_call(run_id=stream.run_id))
    assert err.details["decision"] == "expire"
    run = await get_run(stream.run_id)
    assert run.status == "expired" and run.expired_at
    [decision] = await decisions_of(stream.run_id)
    assert (decision.kind, decision.via) == ("expire", "system")
    assert await effects_of(stream.run_id) == []
    from tests.helpers.runs import steps_of

    assert [s.status for s in await steps_of(stream.run_id)] == ["expired"]
    assert not await snapshot_exists(stream.run_id)

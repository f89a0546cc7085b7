"""Sub-agents (docs/runs.md#sub-agents): approvals inside ``billing-agent`` surface on the supervisor's outer run."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async

from agentrun import AgentRunError, get_agent, get_run
from agentrun.core.models import Decision, ToolEffect, args_fingerprint
from agentrun.engine.types import Decider
from tests.helpers.runs import collect, final_answer, of_type, start, tool_line

pytestmark = pytest.mark.django_db(transaction=True)

REFUND = {"orderId": "A-17", "amount": 25.5}


async def _supervised_refund(refund: dict | None = None) -> tuple[str, dict, list[dict]]:
    message = tool_line("agent-billing-agent", {"message": tool_line("refund", refund or REFUND)})
    stream, chunks = await start("support-supervisor", message, thread="t-sup", resource="u-sup")
    [approval] = of_type(chunks, "tool-call-approval")
    return stream.run_id, approval["payload"], chunks


@sync_to_async
def _effects() -> list[ToolEffect]:
    return list(ToolEffect.objects.all())


async def test_supervisor_sees_the_outer_run_and_the_sub_agent_only_the_inner_one():
    outer_id, payload, chunks = await _supervised_refund()
    assert chunks[-1]["payload"]["finishReason"] == "suspended"
    assert payload["toolName"] == "agent-billing-agent"
    assert payload["innerAgentId"] == "billing-agent"
    inner_id = payload["innerRunId"]
    assert inner_id and inner_id != outer_id
    assert payload["innerToolCallId"]

    supervisor, billing = get_agent("support-supervisor"), get_agent("billing-agent")
    [outer] = (await supervisor.list_suspended_runs()).runs
    assert outer.run_id == outer_id
    [outer_call] = outer.tool_calls
    assert outer_call.requires_approval is True
    assert (outer_call.inner_agent_id, outer_call.inner_run_id, outer_call.inner_tool_call_id) == (
        "billing-agent",
        inner_id,
        payload["innerToolCallId"],
    )
    assert outer_call.to_dict()["innerRunId"] == inner_id

    [inner] = (await billing.list_suspended_runs()).runs
    assert inner.run_id == inner_id
    assert inner.tool_calls[0].tool_name == "refund" and inner.tool_calls[0].args == REFUND
    assert inner.tool_calls[0].tool_call_id == payload["innerToolCallId"]
    # The inner run lives on the outer run's thread and resource.
    assert (inner.thread_id, inner.resource_id) == ("t-sup", "u-sup")
    assert (await get_run(inner_id)).parent_run_id == outer_id

    # Neither agent reaches the other's run.
    with pytest.raises(AgentRunError) as err:
        await supervisor.approve_tool_call(run_id=inner_id)
    assert err.value.code == "RUN_NOT_FOUND"
    with pytest.raises(AgentRunError) as err:
        await billing.approve_tool_call(run_id=outer_id)
    assert err.value.code == "RUN_NOT_FOUND"
    assert (await get_agent("support-agent").list_suspended_runs()).total == 0


async def test_approving_the_outer_call_resumes_the_inner_run_and_both_complete():
    outer_id, payload, _ = await _supervised_refund()
    inner_id = payload["innerRunId"]
    supervisor = get_agent("support-supervisor")
    _, chunks = await collect(supervisor.approve_tool_call(run_id=outer_id))
    assert chunks[-1]["payload"]["finishReason"] == "stop"
    assert (await get_run(outer_id)).status == "completed"
    assert (await get_run(inner_id)).status == "completed"
    assert await final_answer(inner_id) == 'refund: {"refunded": 25.5, "orderId": "A-17"}'
    answer = await final_answer(outer_id)
    assert answer.startswith("agent-billing-agent: ")
    assert json.loads(answer.removeprefix("agent-billing-agent: "))["text"] == (
        'refund: {"refunded": 25.5, "orderId": "A-17"}'
    )
    [effect] = await _effects()
    assert effect.tool_name == "refund" and effect.payload == REFUND
    assert (await supervisor.list_suspended_runs()).total == 0
    assert (await get_agent("billing-agent").list_suspended_runs()).total == 0


async def test_declining_the_outer_call_carries_the_reason_into_the_answer():
    outer_id, payload, _ = await _supervised_refund()
    supervisor = get_agent("support-supervisor")
    await collect(supervisor.decline_tool_call(run_id=outer_id, reason="refund limit reached"))
    assert (await get_run(outer_id)).status == "completed"
    assert (await get_run(payload["innerRunId"])).status == "completed"
    assert "refund: denied: refund limit reached" in await final_answer(outer_id)
    assert await _effects() == []

    @sync_to_async
    def trail():
        return list(Decision.objects.values_list("agent_id", "kind", "reason"))

    # One click, one record: the inner call carried out the supervisor's decision, it made none of its own.
    assert await trail() == [("support-supervisor", "decline", "refund limit reached")]


async def test_approving_the_outer_call_with_edited_args_validates_them_against_the_inner_tool():
    outer_id, _, _ = await _supervised_refund()
    supervisor = get_agent("support-supervisor")
    with pytest.raises(AgentRunError) as err:
        await supervisor.approve_tool_call(run_id=outer_id, args={"orderId": "A-17", "amount": -1})
    assert err.value.code == "ARGS_INVALID"
    assert (await supervisor.list_suspended_runs()).total == 1
    await collect(supervisor.approve_tool_call(run_id=outer_id, args={"orderId": "A-17", "amount": 10}))
    [effect] = await _effects()
    assert effect.payload == {"orderId": "A-17", "amount": 10.0}
    assert '\\"refunded\\": 10.0' in await final_answer(outer_id)


async def test_deciding_the_sub_agents_call_directly_decides_the_supervisors_call():
    """The sub-agent's door leads to the same decision: the supervisor's call that surfaces the inner call
    is decided (one record), and both runs go on — the supervisor does not ask again."""
    outer_id, payload, _ = await _supervised_refund()
    inner_id = payload["innerRunId"]
    stream, chunks = await collect(get_agent("billing-agent").approve_tool_call(run_id=inner_id, reason="ok"))
    # The caller addressed the inner run: the answer and the followed chunks are the inner run's.
    assert stream.decision.to_dict() == {
        "runId": inner_id,
        "toolCallId": payload["innerToolCallId"],
        "decision": "approve",
        "status": "in_progress",
    }
    assert [c["type"] for c in chunks][:2] == ["start", "tool-result"]
    assert chunks[-1]["type"] == "finish" and {c["runId"] for c in chunks} == {inner_id}
    supervisor = get_agent("support-supervisor")
    for _ in range(100):
        if (await get_run(outer_id)).status == "completed":
            break
        await asyncio.sleep(0.05)
    assert (await get_run(outer_id)).status == "completed"
    assert (await get_run(inner_id)).status == "completed"
    answer = json.loads((await final_answer(outer_id)).removeprefix("agent-billing-agent: "))
    assert answer["text"] == 'refund: {"refunded": 25.5, "orderId": "A-17"}'
    assert len(await _effects()) == 1

    @sync_to_async
    def trail():
        return list(Decision.objects.values_list("run_id", "tool_call_id", "kind", "reason"))

    [(run_id, tool_call_id, kind, reason)] = await trail()
    assert (run_id, kind, reason) == (outer_id, "approve", "ok")
    assert tool_call_id == payload["toolCallId"]
    # The supervisor's call is decided: a second click, on either door, learns who decided.
    for agent_id, run in (("support-supervisor", outer_id), ("billing-agent", inner_id)):
        with pytest.raises(AgentRunError) as err:
            await get_agent(agent_id).approve_tool_call(run_id=run)
        assert err.value.code in {"TOOL_CALL_ALREADY_DECIDED", "RUN_NOT_FOUND"}
    assert (await supervisor.list_suspended_runs()).total == 0


async def test_a_signed_in_reviewer_deciding_the_outer_call_is_recorded_once():
    from django.contrib.auth.models import Group, User

    from agentrun.core.access import REVIEWERS, ensure_groups

    rita = await User.objects.acreate(username="rita")
    await sync_to_async(ensure_groups)()
    await rita.groups.aadd(await Group.objects.aget(name=REVIEWERS))  # a signed-in decider needs the permission
    outer_id, payload, _ = await _supervised_refund()
    await collect(
        get_agent("support-supervisor").approve_tool_call(
            run_id=outer_id,
            args_fingerprint=args_fingerprint(payload["innerArgs"]),  # refund is high risk: what rita saw
            decided_by=Decider.person(rita, via="dashboard"),
        )
    )
    assert (await get_run(outer_id)).status == "completed"

    @sync_to_async
    def trail():
        return sorted(Decision.objects.values_list("run_id", "decided_by_id", "decided_by_username", "via"))

    assert await trail() == [(outer_id, rita.pk, "rita", "dashboard")]


async def test_the_surfaced_call_carries_the_inner_tools_risk_and_binds_to_what_would_run():
    from agentrun.core.models import args_fingerprint

    outer_id, payload, _ = await _supervised_refund()
    supervisor = get_agent("support-supervisor")
    [outer] = (await supervisor.list_suspended_runs()).runs
    [call] = outer.tool_calls
    assert call.risk == "high"  # refund is a high-risk tool, whoever surfaces it
    with pytest.raises(AgentRunError) as err:
        await supervisor.approve_tool_call(run_id=outer_id, args_fingerprint=args_fingerprint({**REFUND, "amount": 99}))
    assert err.value.code == "ARGS_CHANGED"
    assert (await supervisor.list_suspended_runs()).total == 1
    # The arguments that would run (the inner call's, as the dashboard shows them) are accepted.
    await collect(supervisor.approve_tool_call(run_id=outer_id, args_fingerprint=args_fingerprint(REFUND)))
    assert (await get_run(outer_id)).status == "completed"


def _desk_with_two_risks():
    """A supervisor whose sub-agent asks approval for a high-risk and a low-risk tool."""
    from agentrun.engine.agents import Agent
    from agentrun.engine.tools import tool

    @tool(id="wire-money", requires_approval=True, risk="high")
    async def wire_money(amount: float) -> dict:
        return {"wired": amount}

    @tool(id="tag-customer", requires_approval=True, risk="low")
    async def tag_customer(tag: str) -> dict:
        return {"tagged": tag}

    payments = Agent(id="payments-agent", tools=[wire_money, tag_customer], model="directive")
    return Agent(id="payments-desk", tools=[], agents=[payments], model="directive")


@sync_to_async
def _decision_risks() -> list[tuple[str, str, str]]:
    return sorted(Decision.objects.values_list("tool_name", "via", "risk"))


async def test_a_sub_agents_call_decided_through_its_supervisor_keeps_the_inner_calls_risk():
    """The audit trail records the risk the reviewer saw on the surfaced call: the inner call's own, not
    the riskiest tool the sub-agent has, whichever door decided it."""
    desk = _desk_with_two_risks()
    high = tool_line("agent-payments-agent", {"message": tool_line("wire-money", {"amount": 900})})
    low = tool_line("agent-payments-agent", {"message": tool_line("tag-customer", {"tag": "vip"})})
    wire_run, wire_chunks = await collect(desk.stream(high, memory={"thread": "t-wire", "resource": "u"}))
    [wire] = of_type(wire_chunks, "tool-call-approval")
    _, tag_chunks = await collect(desk.stream(low, memory={"thread": "t-tag", "resource": "u"}))
    [surfaced] = of_type(tag_chunks, "tool-call-approval")

    # The high-risk call on the supervisor's door, the low-risk one on the sub-agent's.
    await collect(
        desk.approve_tool_call(
            run_id=wire_run.run_id,
            args_fingerprint=args_fingerprint(wire["payload"]["innerArgs"]),
            decided_by=Decider.system(via="dashboard"),
        )
    )
    await collect(
        get_agent("payments-agent").decline_tool_call(
            run_id=surfaced["payload"]["innerRunId"], decided_by=Decider.system(via="api")
        )
    )
    assert await _decision_risks() == [
        ("agent-payments-agent", "api", "low"),
        ("agent-payments-agent", "dashboard", "high"),
    ]
    assert (await get_run(wire_run.run_id)).status == "completed"

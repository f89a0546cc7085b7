"""A waiting run outlives the process: listing and deciding read the database, never memory."""

from __future__ import annotations

import importlib

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

import agentrun.demo
from agentrun import get_agent, get_run
from agentrun.engine import registry
from agentrun.engine.agents import Agent
from tests.helpers.runs import EMAIL, collect, final_answer, of_type, start, suspended_email_run, tool_line

pytestmark = pytest.mark.django_db(transaction=True)


async def _restart() -> None:
    """What a new process has: fresh database connections and agents rebuilt from code."""
    await sync_to_async(connections.close_all)()
    connections.close_all()
    registry.restore({})
    importlib.reload(agentrun.demo)


async def test_runs_are_listed_and_decided_after_a_restart():
    before = get_agent("support-agent")
    email_run = await suspended_email_run(thread="t-restart", resource="u-restart")
    ask_stream, _ = await start(
        "support-agent", tool_line("ask-user", {"question": "Which city?"}), thread="t-restart", resource="u-restart"
    )
    outer_stream, outer_chunks = await start(
        "support-supervisor",
        tool_line("agent-billing-agent", {"message": tool_line("refund", {"orderId": "B-2", "amount": 3})}),
        thread="t-restart",
        resource="u-restart",
    )

    await _restart()

    agent = get_agent("support-agent")
    assert agent is not before
    page = await agent.list_suspended_runs(thread_id="t-restart")
    assert page.total == 2
    assert {r.run_id for r in page.runs} == {email_run, ask_stream.run_id}

    _, chunks = await collect(agent.approve_tool_call(run_id=email_run))
    assert of_type(chunks, "tool-result")[0]["payload"]["result"] == {"sent": True, "to": EMAIL["to"]}
    _, chunks = await collect(agent.resume_stream({"answer": "Paris"}, run_id=ask_stream.run_id))
    assert await final_answer(ask_stream.run_id) == 'ask-user: {"answer": "Paris"}'

    supervisor = get_agent("support-supervisor")
    [outer] = (await supervisor.list_suspended_runs()).runs
    assert outer.run_id == outer_stream.run_id
    assert outer.tool_calls[0].inner_run_id == of_type(outer_chunks, "tool-call-approval")[0]["payload"]["innerRunId"]
    await collect(supervisor.approve_tool_call(run_id=outer.run_id))
    assert "refunded" in await final_answer(outer.run_id)

    for run_id in (email_run, ask_stream.run_id, outer_stream.run_id, outer.tool_calls[0].inner_run_id):
        assert (await get_run(run_id)).status == "completed"
    # The chunk sequence continued where the first process left it.
    assert chunks[0]["type"] == "start" and chunks[0]["seq"] > 1


async def test_a_freshly_built_agent_with_the_same_id_decides_an_old_run():
    run_id = await suspended_email_run()
    await sync_to_async(connections.close_all)()
    old = get_agent("support-agent")
    fresh = Agent(id="support-agent", instructions=old.instructions, tools=list(old.tools.values()), model="directive")
    assert get_agent("support-agent") is fresh
    [listed] = (await fresh.list_suspended_runs()).runs
    assert listed.run_id == run_id
    _, chunks = await collect(fresh.decline_tool_call(run_id=run_id, reason="after restart"))
    assert await final_answer(run_id) == "send-email: denied: after restart"

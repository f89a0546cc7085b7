"""The agent loop as a user sees it: steps, usage, errors, options, memory, the directive model."""

from __future__ import annotations

import warnings

import pytest

from agentrun import AgentRunError, get_agent, get_run
from agentrun.engine.agents import Agent
from agentrun.engine.store import load_history
from agentrun.engine.tools import ToolContext, tool
from tests.helpers.runs import (
    EMAIL,
    RecordingModel,
    collect,
    final_answer,
    load_run,
    of_type,
    start,
    steps_of,
    suspended_email_run,
    text_of,
    tool_line,
)

pytestmark = pytest.mark.django_db(transaction=True)


# --- the directive model --------------------------------------------------------------------------
async def test_echo_streams_one_delta_per_word_that_join_to_the_text():
    stream, chunks = await start("support-agent", "  hello   there, agent  ")
    deltas = [c["payload"]["text"] for c in of_type(chunks, "text-delta")]
    assert deltas[0] == "Echo:"
    assert "".join(deltas) == "Echo: hello   there, agent"
    assert len(deltas) == 4
    assert await stream.text == "Echo: hello   there, agent"
    assert await stream.finish_reason == "stop"
    types = [c["type"] for c in chunks]
    assert types[:3] == ["start", "step-start", "text-start"]
    assert types[-3:] == ["text-end", "step-finish", "finish"]
    assert [c["seq"] for c in chunks] == list(range(1, len(chunks) + 1))
    assert (await get_run(stream.run_id)).status == "completed"


async def test_first_turn_aggregates_include_the_answer_after_tools():
    stream, chunks = await start("support-agent", tool_line("echo", {"value": 7}))
    assert await stream.tool_calls == [
        {"id": of_type(chunks, "tool-call")[0]["payload"]["toolCallId"], "name": "echo", "args": {"value": 7}}
    ]
    assert await stream.text == 'echo: {"value": 7}'


# --- steps and usage ------------------------------------------------------------------------------
async def test_message_creation_step_with_usage():
    stream, _ = await start("support-agent", "one two three")
    [step] = await steps_of(stream.run_id)
    data = step.to_dict()
    assert data["type"] == "message_creation" and data["status"] == "completed"
    assert data["stepDetails"]["type"] == "message_creation"
    assert data["stepDetails"]["messageCreation"]["messageId"]
    # Directive usage: words of the prompt in, words of the answer out.
    assert data["usage"] == {"promptTokens": 3, "completionTokens": 4, "totalTokens": 7}
    assert data["completedAt"] and data["lastError"] is None
    run = await get_run(stream.run_id)
    assert run.usage == {"promptTokens": 3, "completionTokens": 4, "totalTokens": 7}
    assert run.to_dict()["usage"] == run.usage


async def test_tool_calls_step_waits_in_progress_without_usage_then_completes_with_it():
    run_id = await suspended_email_run()
    [step] = await steps_of(run_id)
    data = step.to_dict()
    assert data["type"] == "tool_calls" and data["status"] == "in_progress"
    assert data["usage"] is None and data["completedAt"] is None
    [call] = data["stepDetails"]["toolCalls"]
    assert call["type"] == "function" and call["function"]["name"] == "send-email"
    assert call["function"]["output"] is None
    import json

    assert json.loads(call["function"]["arguments"]) == EMAIL
    assert (await get_run(run_id)).status == "suspended"

    await collect(get_agent("support-agent").approve_tool_call(run_id=run_id))
    tool_step, answer_step = await steps_of(run_id)
    data = tool_step.to_dict()
    assert data["status"] == "completed" and data["completedAt"]
    prompt_words = len(tool_line("send-email", EMAIL).split())
    assert data["usage"] == {
        "promptTokens": prompt_words,
        "completionTokens": prompt_words,
        "totalTokens": 2 * prompt_words,
    }
    assert json.loads(data["stepDetails"]["toolCalls"][0]["function"]["output"]) == {"sent": True, "to": EMAIL["to"]}
    assert answer_step.type == "message_creation" and answer_step.status == "completed"
    answer_words = len((await final_answer(run_id)).split())
    assert answer_step.usage == {
        "promptTokens": prompt_words,
        "completionTokens": answer_words,
        "totalTokens": prompt_words + answer_words,
    }
    run = await get_run(run_id)
    assert run.usage["promptTokens"] == 2 * prompt_words
    assert run.usage["completionTokens"] == prompt_words + answer_words
    assert run.usage["totalTokens"] == run.usage["promptTokens"] + run.usage["completionTokens"]


@pytest.mark.parametrize("code", ["rate_limit_exceeded", "server_error"])
async def test_a_model_error_fails_the_run_with_last_error(code):
    stream, chunks = await start("support-agent", f"/fail {code}")
    run = await get_run(stream.run_id)
    assert run.status == "failed" and run.to_dict()["failedAt"]
    assert run.last_error["code"] == code and run.last_error["message"]
    [step] = await steps_of(stream.run_id)
    assert step.status == "failed"
    assert step.to_dict()["lastError"] == run.last_error
    finish = chunks[-1]
    assert finish["type"] == "finish" and finish["payload"]["finishReason"] == "error"
    assert [c["type"] for c in chunks].count("finish") == 1
    assert of_type(chunks, "error")[0]["payload"]["error"]["code"] == code
    assert (await get_agent("support-agent").list_suspended_runs()).total == 0


# --- options --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "metadata",
    [
        {f"k{i}": "v" for i in range(17)},
        {"k" * 65: "v"},
        {"k": "v" * 513},
        {"k": 1},
        {"k": None},
        {"k": {"nested": "x"}},
        ["not", "a", "dict"],
    ],
)
async def test_metadata_limits(metadata):
    with pytest.raises(AgentRunError) as err:
        await get_agent("support-agent").stream("hi", metadata=metadata)
    assert err.value.code == "INVALID_METADATA"


async def test_metadata_at_the_limits_is_kept():
    metadata = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    stream, _ = await start("support-agent", "hi", metadata=metadata)
    assert (await get_run(stream.run_id)).to_dict()["metadata"] == metadata


async def test_max_steps_is_honoured():
    message = tool_line("echo", {"value": 1})
    stream, chunks = await start("support-agent", message, max_steps=1)
    run = await load_run(stream.run_id)
    assert run.step_count == 1
    assert chunks[-1]["payload"]["finishReason"] == "length"
    assert of_type(chunks, "tool-result")  # the step ran its tools
    assert await final_answer(stream.run_id) == ""  # ...but the model was not called again
    stream, chunks = await start("support-agent", message, thread="t-2", max_steps=2)
    assert chunks[-1]["payload"]["finishReason"] == "stop"
    assert (await load_run(stream.run_id)).step_count == 2


async def test_invalid_max_steps():
    for bad in (0, -1, "3", True):
        with pytest.raises(AgentRunError) as err:
            await get_agent("support-agent").stream("hi", max_steps=bad)
        assert err.value.code == "INVALID_REQUEST"


async def test_require_tool_approval_makes_even_echo_wait():
    stream, chunks = await start("support-agent", tool_line("echo", {"value": "x"}), require_tool_approval=True)
    assert chunks[-1]["payload"]["finishReason"] == "suspended"
    assert of_type(chunks, "tool-call-approval")[0]["payload"]["toolName"] == "echo"
    assert not of_type(chunks, "tool-result")
    agent = get_agent("support-agent")
    [run] = (await agent.list_suspended_runs()).runs
    assert run.tool_calls[0].requires_approval is True
    _, chunks = await collect(agent.approve_tool_call(run_id=stream.run_id))
    assert of_type(chunks, "tool-result")[0]["payload"]["result"] == {"value": "x"}


async def test_a_failing_approval_policy_requires_approval():
    def policy(ctx: ToolContext, args: dict) -> bool:
        raise RuntimeError("policy service is down")

    async def async_policy(ctx: ToolContext, args: dict) -> bool:
        return args["amount"] > 100

    @tool(id="pay", requires_approval=policy)
    async def pay(amount: float) -> dict:
        return {"paid": amount}

    @tool(id="transfer", requires_approval=async_policy)
    async def transfer(amount: float) -> dict:
        return {"moved": amount}

    agent = Agent(id="policy-agent", tools=[pay, transfer], model="directive")
    stream, chunks = await collect(
        agent.stream(
            "\n".join(
                [
                    tool_line("pay", {"amount": 1}),
                    tool_line("transfer", {"amount": 5}),
                    tool_line("transfer", {"amount": 500}),
                ]
            ),
        )
    )
    assert [c["payload"]["toolName"] for c in of_type(chunks, "tool-call-approval")] == ["pay", "transfer"]
    assert [c["payload"]["result"] for c in of_type(chunks, "tool-result")] == [{"moved": 5.0}]
    assert agent.to_dict()["tools"][0]["requiresApproval"] is True


async def test_stream_until_idle_warns_and_behaves_like_stream():
    agent = get_agent("support-agent")
    with pytest.warns(DeprecationWarning):
        stream = await agent.stream_until_idle("hello world", memory={"thread": "t-idle", "resource": "u"})
    chunks = await stream.collect()
    assert text_of(chunks) == "Echo: hello world"
    assert chunks[-1]["payload"]["finishReason"] == "stop"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, plain = await collect(agent.stream("hello world", until_idle=True))
    assert [c["type"] for c in plain] == [c["type"] for c in chunks]


# --- tools ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "tool_name"),
    [
        (tool_line("refund", {"orderId": "A-1", "amount": 0}), "refund"),  # amount must be > 0
        (tool_line("lookup-order", {"order": "A-1"}), "lookup-order"),
        ("/tool lookup-order {not json", "lookup-order"),
        (tool_line("no-such-tool", {}), "no-such-tool"),
    ],
)
async def test_invalid_tool_args_from_the_model_become_a_tool_error_the_model_sees(line, tool_name):
    agent_id = "billing-agent" if tool_name == "refund" else "support-agent"
    stream, chunks = await start(agent_id, line)
    [error] = of_type(chunks, "tool-error")
    assert error["payload"]["toolName"] == tool_name and error["payload"]["error"]["message"]
    assert not of_type(chunks, "tool-call-approval")
    assert chunks[-1]["payload"]["finishReason"] == "stop"
    assert (await get_run(stream.run_id)).status == "completed"
    assert (await final_answer(stream.run_id)).startswith(f"{tool_name}: error: ")


async def test_a_tool_that_raises_is_a_tool_error_not_a_crash():
    @tool(id="boom")
    async def boom() -> dict:
        raise ValueError("kaput")

    agent = Agent(id="boom-agent", tools=[boom], model="directive")
    stream, chunks = await collect(agent.stream(tool_line("boom", {})))
    assert of_type(chunks, "tool-error")[0]["payload"]["error"]["message"] == "kaput"
    assert (await get_run(stream.run_id)).status == "completed"
    assert await final_answer(stream.run_id) == "boom: error: kaput"


async def test_tool_schemas_come_from_type_hints():
    refund = get_agent("billing-agent").tools["refund"]
    schema = refund.parameters_schema
    assert set(schema["required"]) == {"orderId", "amount"}
    assert schema["properties"]["amount"]["exclusiveMinimum"] == 0
    assert "ctx" not in schema["properties"]


# --- thread memory --------------------------------------------------------------------------------
async def test_a_second_run_on_the_thread_gets_the_earlier_messages():
    model = RecordingModel()
    agent = Agent(id="memory-agent", instructions="Be brief.", model=model)
    memory = {"thread": "t-memory", "resource": "u-memory"}
    await collect(agent.stream("my name is Ada", memory=memory))
    await collect(agent.stream("what is my name?", memory=memory))
    second = model.calls[-1]
    assert [(m["role"], m["content"]) for m in second] == [
        ("system", "Be brief."),
        ("user", "my name is Ada"),
        ("assistant", "Echo: my name is Ada"),
        ("user", "what is my name?"),
    ]
    # Another thread starts empty.
    await collect(agent.stream("hello", memory={"thread": "t-other", "resource": "u-memory"}))
    assert [(m["role"], m["content"]) for m in model.calls[-1]] == [("system", "Be brief."), ("user", "hello")]


async def test_thread_memory_includes_tool_results_of_earlier_runs():
    memory = {"thread": "t-mem-tools", "resource": "u"}
    first, _ = await collect(
        get_agent("support-agent").stream(tool_line("lookup-order", {"orderId": "Z9"}), memory=memory)
    )
    second, _ = await collect(get_agent("support-agent").stream("thanks", memory=memory))
    run = await load_run(second.run_id)
    from asgiref.sync import sync_to_async

    history = await sync_to_async(load_history)(run, "")
    tool_messages = [m for m in history if m["role"] == "tool"]
    assert tool_messages and tool_messages[0]["tool_name"] == "lookup-order"
    assert '"status": "shipped"' in tool_messages[0]["content"]
    users = [m["content"] for m in history if m["role"] == "user"]
    assert users == [tool_line("lookup-order", {"orderId": "Z9"}), "thanks"]
    assert history.index(tool_messages[0]) < [m["content"] for m in history].index("thanks")


async def test_runs_without_memory_get_their_own_thread():
    agent = get_agent("support-agent")
    a, _ = await collect(agent.stream("one"))
    b, _ = await collect(agent.stream("two"))
    run_a, run_b = await get_run(a.run_id), await get_run(b.run_id)
    assert run_a.thread_id != run_b.thread_id


async def test_runs_waiting_on_one_thread_each_answer_their_own_calls_when_decided_in_any_order():
    """Thread memory never splits a run's tool calls from their results with another run's messages."""
    agent = get_agent("support-agent")
    email_run = await suspended_email_run(thread="t-shared")
    ask, _ = await start("support-agent", tool_line("ask-user", {"question": "City?"}), thread="t-shared")
    third, _ = await start("support-agent", "just chatting", thread="t-shared")
    await collect(agent.resume_stream({"answer": "Oslo"}, run_id=ask.run_id))
    await collect(agent.approve_tool_call(run_id=email_run))
    assert await final_answer(ask.run_id) == 'ask-user: {"answer": "Oslo"}'
    assert await final_answer(email_run) == 'send-email: {"sent": true, "to": "ann@example.com"}'
    assert await final_answer(third.run_id) == "Echo: just chatting"
    # A later run on the thread sees all of it, in order.
    model = RecordingModel()
    later = Agent(id="support-agent-reader", model=model, register=False)
    await collect(later.stream("and now?", memory={"thread": "t-shared", "resource": "user-1"}))
    contents = [m["content"] for m in model.calls[-1]]
    assert contents[-1] == "and now?"
    assert 'ask-user: {"answer": "Oslo"}' in contents and "Echo: just chatting" in contents


async def test_entry_points_raise_contract_errors_for_unknown_ids():
    with pytest.raises(AgentRunError) as err:
        get_agent("no-such-agent")
    assert err.value.code == "AGENT_NOT_FOUND" and err.value.http_status == 404
    with pytest.raises(AgentRunError) as err:
        await get_run("run_nope")
    assert err.value.code == "RUN_NOT_FOUND"
    for bad in (42, [{"role": "tool", "content": "x"}], [{"content": 3}]):
        with pytest.raises(AgentRunError) as err:
            await get_agent("support-agent").stream(bad)
        assert err.value.code == "INVALID_REQUEST"

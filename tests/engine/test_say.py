"""The offline model's ``/say`` (docs/runs.md#the-offline-model): the agent's own words before its tool
calls, as a real model explains what it is about to do; without calls, they are its answer."""

from __future__ import annotations

import pytest

from agentrun.core.models import Message
from tests.factories import EMAIL, of_type, start, text_of, tool_line

pytestmark = pytest.mark.django_db(transaction=True)


async def test_say_comes_before_the_tool_calls_of_the_same_step():
    message = "/say I will email Ann that her order shipped.\n/say Then I stop.\n" + tool_line("send-email", EMAIL)
    stream, chunks = await start("support-agent", message, thread="say-1")
    types = [c["type"] for c in chunks]
    assert types.index("text-start") < types.index("text-end") < types.index("tool-call")
    assert text_of(chunks) == "I will email Ann that her order shipped.\nThen I stop."
    assert of_type(chunks, "tool-call-approval")[0]["payload"]["toolName"] == "send-email"
    assert of_type(chunks, "finish")[-1]["payload"]["finishReason"] == "suspended"
    # The step's assistant message holds both: what the reviewer's card shows as the agent's words.
    said = await Message.objects.filter(run_id=stream.run_id, role="assistant").alast()
    assert said.content == "I will email Ann that her order shipped.\nThen I stop."
    assert [c["name"] for c in said.tool_calls] == ["send-email"]
    usage = of_type(chunks, "step-finish")[0]["payload"]["usage"]
    assert usage["completionTokens"] == len(said.content.split()) + len(tool_line("send-email", EMAIL).split())


async def test_say_alone_is_the_answer_and_without_say_nothing_changes():
    _, chunks = await start("support-agent", "/say Nothing to do here.", thread="say-2")
    assert text_of(chunks) == "Nothing to do here."
    _, chunks = await start("support-agent", tool_line("lookup-order", {"orderId": "o-1"}), thread="say-3")
    first_step = chunks[: [c["type"] for c in chunks].index("tool-call")]
    assert not of_type(first_step, "text-delta")  # no /say: the calls come without words, as before
    assert text_of(chunks) == 'lookup-order: {"orderId": "o-1", "status": "shipped"}'

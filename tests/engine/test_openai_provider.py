"""``OpenAIChatModel`` against an OpenAI-compatible server this test runs on localhost (recorded SSE)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentrun import get_run
from agentrun.demo import echo, lookup_order
from agentrun.engine.agents import Agent
from agentrun.engine.providers import OpenAIChatModel
from tests.helpers.runs import collect, final_answer, of_type, steps_of, text_of

pytestmark = pytest.mark.django_db(transaction=True)


def _sse(*events: dict) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def _chunk(delta: dict | None = None, finish_reason: str | None = None, usage: dict | None = None) -> dict:
    event = {
        "id": "chatcmpl-rec",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-test",
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    if usage is not None:
        event["usage"] = usage
    return event


# Recorded responses of /v1/chat/completions with stream=true and stream_options.include_usage.
TOOL_CALLS_RESPONSE = _sse(
    _chunk(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_rec_1",
                    "type": "function",
                    "function": {"name": "lookup-order", "arguments": ""},
                },
            ],
        }
    ),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"order'}}]}),
    _chunk(
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "call_rec_2",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"val'},
                },
            ]
        }
    ),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'Id": "A1"}'}}]}),
    _chunk({"tool_calls": [{"index": 1, "function": {"arguments": 'ue": [1, 2]}'}}]}),
    _chunk({}, finish_reason="tool_calls"),
    _chunk(None, usage={"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62}),
)
TEXT_RESPONSE = _sse(
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": "Order A1"}),
    _chunk({"content": " has "}),
    _chunk({"content": "shipped."}),
    _chunk({}, finish_reason="stop"),
    _chunk(None, usage={"prompt_tokens": 80, "completion_tokens": 5, "total_tokens": 85}),
)


class RecordedServer:
    def __init__(self) -> None:
        self.responses: list[tuple[int, bytes]] = []
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.requests.append(
                    {"path": self.path, "auth": self.headers.get("Authorization"), "json": json.loads(body)}
                )
                status, payload = server.responses.pop(0)
                self.send_response(status)
                if status == 200:
                    self.send_header("Content-Type", "text/event-stream")
                else:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> RecordedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def server():
    with RecordedServer() as s:
        yield s


@pytest.fixture
def agent(server):
    model = OpenAIChatModel("gpt-test", base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x")
    return Agent(id="openai-agent", instructions="You track orders.", model=model, tools=[lookup_order, echo])


async def test_streamed_tool_calls_run_with_parsed_args_then_text_and_usage_are_recorded(server, agent):
    server.responses = [(200, TOOL_CALLS_RESPONSE), (200, TEXT_RESPONSE)]
    stream, chunks = await collect(agent.stream("Where is order A1?", memory={"thread": "t-oa", "resource": "u"}))

    assert chunks[-1]["payload"]["finishReason"] == "stop"
    calls = [c["payload"] for c in of_type(chunks, "tool-call")]
    assert [(c["toolCallId"], c["toolName"], c["args"]) for c in calls] == [
        ("call_rec_1", "lookup-order", {"orderId": "A1"}),
        ("call_rec_2", "echo", {"value": [1, 2]}),
    ]
    assert await stream.tool_calls == [
        {"id": "call_rec_1", "name": "lookup-order", "args": {"orderId": "A1"}},
        {"id": "call_rec_2", "name": "echo", "args": {"value": [1, 2]}},
    ]
    results = {c["payload"]["toolCallId"]: c["payload"] for c in of_type(chunks, "tool-result")}
    assert results["call_rec_1"]["args"] == {"orderId": "A1"}
    assert results["call_rec_1"]["result"] == {"orderId": "A1", "status": "shipped"}
    assert results["call_rec_2"]["result"] == {"value": [1, 2]}
    assert text_of(chunks) == "Order A1 has shipped."
    assert await final_answer(stream.run_id) == "Order A1 has shipped."
    assert await stream.text == "Order A1 has shipped."

    tool_step, answer_step = await steps_of(stream.run_id)
    assert tool_step.to_dict()["usage"] == {"promptTokens": 50, "completionTokens": 12, "totalTokens": 62}
    assert [json.loads(c["function"]["arguments"]) for c in tool_step.step_details["toolCalls"]] == [
        {"orderId": "A1"},
        {"value": [1, 2]},
    ]
    assert answer_step.to_dict()["usage"] == {"promptTokens": 80, "completionTokens": 5, "totalTokens": 85}
    run = await get_run(stream.run_id)
    assert run.status == "completed"
    assert run.usage == {"promptTokens": 130, "completionTokens": 17, "totalTokens": 147}

    # What the server was sent: the tools, then the tool results answering the calls.
    first, second = server.requests
    assert first["path"] == "/v1/chat/completions" and first["auth"] == "Bearer x"
    assert first["json"]["model"] == "gpt-test" and first["json"]["stream"] is True
    assert {t["function"]["name"] for t in first["json"]["tools"]} == {"lookup-order", "echo"}
    assert first["json"]["messages"] == [
        {"role": "system", "content": "You track orders."},
        {"role": "user", "content": "Where is order A1?"},
    ]
    sent = second["json"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool"]
    assert [c["id"] for c in sent[2]["tool_calls"]] == ["call_rec_1", "call_rec_2"]
    assert json.loads(sent[3]["content"]) == {"orderId": "A1", "status": "shipped"}
    assert sent[3]["tool_call_id"] == "call_rec_1"


async def test_a_rate_limited_call_fails_the_run_with_that_code(server, agent):
    error = {"error": {"message": "Rate limit reached", "type": "rate_limit_exceeded", "code": "rate_limit_exceeded"}}
    server.responses = [(429, json.dumps(error).encode())]
    stream, chunks = await collect(agent.stream("hello"))
    assert chunks[-1]["payload"]["finishReason"] == "error"
    run = await get_run(stream.run_id)
    assert run.status == "failed" and run.last_error["code"] == "rate_limit_exceeded"
    [step] = await steps_of(stream.run_id)
    assert step.last_error["code"] == "rate_limit_exceeded"

"""The real, published clients against a real server (docs/api.md#compatibility-prefixes): daphne and a
worker on PostgreSQL and Redis, as in production.

- Mastra's ``@mastra/client-js`` (pinned in ``tests/compat/node/package.json``), run by Node: streams,
  lists suspended runs, approves, declines with a reason, resumes an ask-user call, observes, and decides
  without streaming, with ``apiPrefix: "/api/mastra"`` and a Bearer token. Its decisions are in the
  audit trail (the dashboard history's source) with ``via = "api"``.
- Azure's ``azure-ai-agents`` and OpenAI's ``openai`` SDKs (pinned in the ``test`` extra) read runs and
  run steps under ``/api/openai/v1``, paging automatically one step at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.system import create_reviewer

pytestmark = pytest.mark.system

# Every id the API accepts works everywhere: thread ids travel in bodies, queries and paths.
MASTRA_THREAD = "mastra thread/ü?#%"
SDK_THREAD = "sdk thread/é?#% 1"


def call(port: int, token: str, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_mastra_client_js_drives_agentrun(processes, node_client: Path):
    _, port = processes.daphne("web")
    processes.worker("worker")
    token = create_reviewer(processes, "mia")

    done = subprocess.run(
        ["node", "mastra_client.mjs"],
        cwd=node_client,
        env=dict(os.environ, BASE_URL=f"http://127.0.0.1:{port}", TOKEN=token, THREAD=MASTRA_THREAD),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    report = json.loads(done.stdout)

    assert {"support-agent", "billing-agent", "support-supervisor"} <= set(report["agents"])
    details = report["details"]
    assert (details["id"], details["tools"]["send-email"]["requireApproval"]) == ("support-agent", True)
    assert json.loads(details["tools"]["send-email"]["inputSchema"])["required"] == ["to", "subject", "body"]

    # Streams start runs that wait for people; the listing finds them, newest first, paged.
    for started, waits_with in (
        ("email", "tool-call-approval"),
        ("delete", "tool-call-approval"),
        ("ask", "tool-call-suspended"),
    ):
        assert report[started]["types"][-4:] == ["tool-call", waits_with, "step-finish", "finish"]
        assert report[started]["finishReason"] == "suspended"
    assert report["ask"]["suspendPayload"] == {"question": "Which city?"}
    assert report["listed"]["total"] == 3
    assert [r["runId"] for r in report["listed"]["runs"]] == [report[k]["runId"] for k in ("ask", "delete", "email")]
    assert {r["threadId"] for r in report["listed"]["runs"]} == {MASTRA_THREAD}
    email_call = report["listed"]["runs"][2]["toolCalls"][0]
    assert email_call["toolName"] == "send-email" and email_call["requiresApproval"] is True
    assert report["listedPage"]["total"] == 3 and len(report["listedPage"]["runs"]) == 1

    # Each decision streams the continuation: the call, then its result, then the model's answer.
    approved, declined, resumed = report["approved"], report["declined"], report["resumed"]
    assert approved["types"][:3] == ["start", "tool-call", "tool-result"]
    assert approved["results"] == [{"sent": True, "to": "ann@example.com"}]
    assert approved["text"] == 'send-email: {"sent": true, "to": "ann@example.com"}'
    assert approved["finishReason"] == "stop"
    assert declined["types"][:3] == ["start", "tool-call", "tool-output-denied"]
    assert declined["denied"][0]["reason"] == "Not this customer" and declined["denied"][0]["approved"] is False
    assert declined["text"] == "delete-record: denied: Not this customer"
    assert resumed["types"][:3] == ["start", "tool-call", "tool-result"]
    assert resumed["results"] == [{"answer": "Paris"}]
    assert report["listedAfter"] == {"runs": [], "total": 0}
    # The client parsed every stream without complaint (it insists on a tool-call before its result).
    assert report["clientErrors"] == []

    # Deciding twice: Mastra's error body, with the contract's code.
    twice = report["approveTwice"]
    assert twice["status"] == 409 and twice["body"]["code"] == "TOOL_CALL_ALREADY_DECIDED"
    assert "already decided" in twice["body"]["error"]

    assert report["streamed"]["text"] == "Echo: hello from mastra" and report["streamed"]["finishReason"] == "stop"
    assert report["untilIdle"]["text"] == "Echo: still there"
    # observe replays the first run from its first event, up to that segment's finish.
    assert report["observed"]["types"] == report["email"]["types"]
    generated = report["generated"]
    assert generated["text"] == 'send-email: {"sent": true, "to": "bob@example.com"}'
    assert generated["finishReason"] == "stop" and generated["status"] == "completed"

    # The audit trail (GET /api/decisions feeds the dashboard's history) names the person and the door.
    trail = call(port, token, "GET", f"/api/decisions?{urllib.parse.urlencode({'threadId': MASTRA_THREAD})}")
    kinds = sorted((d["kind"], d["toolName"]) for d in trail["data"])
    assert kinds == [
        ("approve", "send-email"),
        ("approve", "send-email"),
        ("decline", "delete-record"),
        ("resume", "ask-user"),
    ]
    assert {(d["via"], d["decidedBy"]) for d in trail["data"]} == {("api", "mia")}
    decline = next(d for d in trail["data"] if d["kind"] == "decline")
    assert decline["reason"] == "Not this customer"
    assert next(d for d in trail["data"] if d["kind"] == "resume")["resumeData"] == {"answer": "Paris"}


class ApiToken:
    """An ``azure.core.credentials.TokenCredential`` handing out an agentrun API token."""

    def __init__(self, token: str) -> None:
        self.token = token

    def get_token(self, *scopes: str, **kwargs: object):
        from azure.core.credentials import AccessToken

        return AccessToken(self.token, int(time.time()) + 3600)


# openai 3.x warns on every Assistants call (deprecated upstream in favour of its Responses API).
@pytest.mark.filterwarnings("ignore:The Assistants API is deprecated:DeprecationWarning")
def test_azure_ai_agents_and_openai_sdks_read_runs_and_steps(processes):
    from azure.ai.agents import AgentsClient
    from openai import OpenAI

    _, port = processes.daphne("web")
    processes.worker("worker")
    token = create_reviewer(processes, "oscar")
    memory = {"thread": SDK_THREAD, "resource": "customer-2"}
    done = call(
        port,
        token,
        "POST",
        "/api/agents/support-agent/generate",
        {"messages": '/tool lookup-order {"orderId": "o-1"}\n/tool echo {"value": 42}', "memory": memory},
    )
    waiting = call(
        port,
        token,
        "POST",
        "/api/agents/support-agent/generate",
        {"messages": '/tool send-email {"to": "a@b.c", "subject": "s", "body": "b"}', "memory": memory},
    )
    assert (done["status"], waiting["status"]) == ("completed", "suspended")
    base = f"http://127.0.0.1:{port}/api/openai/v1"

    # Azure AI Agents: plain HTTP needs the SDK's documented per-call ``enforce_https=False``.
    azure = AgentsClient(endpoint=base, credential=ApiToken(token))
    steps = list(azure.run_steps.list(SDK_THREAD, done["runId"], limit=1, order="asc", enforce_https=False))
    assert [s.type for s in steps] == ["tool_calls", "message_creation"]
    tool_step = steps[0]
    assert tool_step.agent_id == "support-agent" and tool_step.run_id == done["runId"]
    assert tool_step.status == "completed" and tool_step.completed_at is not None
    calls = tool_step.step_details.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("lookup-order", {"orderId": "o-1"}),
        ("echo", {"value": 42}),
    ]
    # azure-ai-agents 1.1.0 declares no ``output`` attribute; its models are mappings of the wire JSON.
    assert json.loads(calls[0].function["output"]) == {"orderId": "o-1", "status": "shipped"}
    assert steps[1].usage.total_tokens > 0
    one = azure.run_steps.get(SDK_THREAD, done["runId"], tool_step.id, enforce_https=False)
    assert one.id == tool_step.id and one.step_details.tool_calls[1].function.name == "echo"
    run = azure.runs.get(SDK_THREAD, waiting["runId"], enforce_https=False)
    assert run.status == "requires_action" and run.agent_id == "support-agent"
    (open_call,) = run.required_action.submit_tool_outputs.tool_calls
    assert open_call.function.name == "send-email" and json.loads(open_call.function.arguments)["to"] == "a@b.c"
    assert [r.id for r in azure.runs.list(SDK_THREAD, order="asc", enforce_https=False)] == [
        done["runId"],
        waiting["runId"],
    ]

    # OpenAI's Assistants API client, the API token as its key (sent as a Bearer token).
    openai = OpenAI(api_key=token, base_url=base, max_retries=0)
    steps = list(openai.beta.threads.runs.steps.list(done["runId"], thread_id=SDK_THREAD, limit=1))
    assert [s.type for s in steps] == ["message_creation", "tool_calls"]  # newest first by default
    assert [c.function.name for c in steps[1].step_details.tool_calls] == ["lookup-order", "echo"]
    assert steps[1].assistant_id == "support-agent" and isinstance(steps[1].created_at, int)
    run = openai.beta.threads.runs.retrieve(waiting["runId"], thread_id=SDK_THREAD)
    assert run.status == "requires_action" and run.assistant_id == "support-agent"
    assert run.required_action.submit_tool_outputs.tool_calls[0].function.name == "send-email"
    pending = openai.beta.threads.runs.steps.list(waiting["runId"], thread_id=SDK_THREAD).data
    assert pending[0].status == "in_progress" and pending[0].usage is None
    assert pending[0].step_details.tool_calls[0].function.output is None
    messages = list(openai.beta.threads.messages.list(thread_id=SDK_THREAD, order="asc", limit=2))
    assert messages[0].role == "user" and messages[0].content[0].text.value.startswith("/tool lookup-order")
    assert messages[1].role == "assistant" and messages[1].run_id == done["runId"]
    assert openai.beta.threads.retrieve(SDK_THREAD).id == SDK_THREAD

    # A thread id that, decoded, reads as another thread's run: over daphne both SDKs reach the thread.
    tricky = f"{SDK_THREAD}/runs/{done['runId']}"
    echo = {"messages": '/tool echo {"value": 1}', "memory": {**memory, "thread": tricky}}
    own = call(port, token, "POST", "/api/agents/support-agent/generate", echo)
    assert openai.beta.threads.retrieve(tricky).id == tricky
    assert [r.id for r in openai.beta.threads.runs.list(thread_id=tricky)] == [own["runId"]]
    assert [r.id for r in azure.runs.list(tricky, enforce_https=False)] == [own["runId"]]

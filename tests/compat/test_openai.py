"""``/api/openai/v1/``: the Azure AI Agents / OpenAI Assistants read API over agentrun's runs
(``tests/compat/test_real_clients.py`` reads it with the published SDKs)."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from openai._utils._path import path_template  # how the pinned SDK encodes path parameters
from rest_framework.test import APIClient

from agentrun.core.models import RunStep
from tests.helpers.asgi import AsgiClient
from tests.helpers.runs import ask_run, email_run, suspended_email_run, wait_rested

pytestmark = pytest.mark.django_db(transaction=True)

RUN_FIELDS = {
    "id",
    "object",
    "created_at",
    "assistant_id",
    "thread_id",
    "status",
    "required_action",
    "last_error",
    "started_at",
    "expires_at",
    "cancelled_at",
    "failed_at",
    "completed_at",
    "incomplete_details",
    "model",
    "instructions",
    "tools",
    "metadata",
    "usage",
    "temperature",
    "top_p",
    "max_prompt_tokens",
    "max_completion_tokens",
    "truncation_strategy",
    "tool_choice",
    "response_format",
    "parallel_tool_calls",
}
STEP_FIELDS = {
    "id",
    "object",
    "created_at",
    "assistant_id",
    "thread_id",
    "run_id",
    "type",
    "status",
    "step_details",
    "last_error",
    "expired_at",
    "cancelled_at",
    "failed_at",
    "completed_at",
    "metadata",
    "usage",
}
# Every character a thread id may hold travels percent-encoded in the path, "/" included.
THREAD = "oa thread/ü?#%"
BASE = f"/api/openai/v1/threads/{quote(THREAD, safe='')}"


def error(response) -> tuple[int, str]:
    body = response.json()["error"]
    assert body["message"] and "type" in body and "param" in body  # OpenAI's error object
    return response.status_code, body["code"]


def decided_run(api: APIClient) -> str:
    run_id = email_run(thread=THREAD)
    api.post(f"/api/agents/support-agent/runs/{run_id}/approve", {}, format="json")
    wait_rested(run_id)
    return run_id


def test_a_suspended_run_requires_action_naming_its_open_calls(api):
    run_id = email_run(thread=THREAD)
    run = api.get(f"{BASE}/runs/{run_id}").json()
    assert set(run) == RUN_FIELDS
    assert (run["object"], run["status"], run["assistant_id"], run["thread_id"]) == (
        "thread.run",
        "requires_action",
        "support-agent",
        THREAD,
    )
    (call,) = run["required_action"]["submit_tool_outputs"]["tool_calls"]
    assert run["required_action"]["type"] == "submit_tool_outputs"
    assert call["type"] == "function" and call["function"]["name"] == "send-email"
    assert json.loads(call["function"]["arguments"]) == {
        "to": "ann@example.com",
        "subject": "Your order",
        "body": "It shipped.",
    }
    assert isinstance(run["created_at"], int) and isinstance(run["started_at"], int) and run["completed_at"] is None
    email_tool = next(t for t in run["tools"] if t["function"]["name"] == "send-email")
    assert email_tool["type"] == "function" and email_tool["function"]["parameters"]["required"] == [
        "to",
        "subject",
        "body",
    ]
    assert run["model"] == "directive"

    api.post(f"/api/agents/support-agent/runs/{run_id}/approve", {}, format="json")
    wait_rested(run_id)
    run = api.get(f"{BASE}/runs/{run_id}/").json()
    assert (run["status"], run["required_action"]) == ("completed", None)
    assert run["usage"]["total_tokens"] == run["usage"]["prompt_tokens"] + run["usage"]["completion_tokens"] > 0


def test_run_steps_are_assistants_run_steps_with_cursor_pages(api):
    run_id = decided_run(api)
    steps = list(RunStep.objects.filter(run_id=run_id).order_by("created_at", "id").values_list("id", flat=True))
    body = api.get(f"{BASE}/runs/{run_id}/steps").json()
    assert set(body) == {"object", "data", "first_id", "last_id", "has_more"} and body["object"] == "list"
    assert [s["id"] for s in body["data"]] == steps[::-1]  # newest first by default
    assert (body["first_id"], body["last_id"], body["has_more"]) == (steps[-1], steps[0], False)
    tool_step, answer = body["data"][1], body["data"][0]
    assert set(tool_step) == STEP_FIELDS and tool_step["object"] == "thread.run.step"
    assert (tool_step["type"], tool_step["status"], tool_step["assistant_id"]) == (
        "tool_calls",
        "completed",
        "support-agent",
    )
    (call,) = tool_step["step_details"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "send-email"
    assert json.loads(call["function"]["arguments"])["to"] == "ann@example.com"
    assert json.loads(call["function"]["output"]) == {"sent": True, "to": "ann@example.com"}
    assert answer["step_details"]["type"] == "message_creation"
    assert answer["step_details"]["message_creation"]["message_id"].startswith("msg_")
    assert isinstance(answer["completed_at"], int) and set(answer["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
    }

    page = api.get(f"{BASE}/runs/{run_id}/steps", {"limit": 1, "order": "asc"}).json()
    assert ([s["id"] for s in page["data"]], page["has_more"]) == ([steps[0]], True)
    page = api.get(f"{BASE}/runs/{run_id}/steps", {"limit": 1, "order": "asc", "after": page["last_id"]}).json()
    assert ([s["id"] for s in page["data"]], page["has_more"]) == ([steps[1]], False)
    page = api.get(f"{BASE}/runs/{run_id}/steps", {"limit": 1, "order": "asc", "after": steps[1]}).json()
    assert (page["data"], page["last_id"], page["has_more"]) == ([], None, False)  # Azure's pager stops here
    page = api.get(f"{BASE}/runs/{run_id}/steps", {"order": "asc", "before": steps[1]}).json()
    assert [s["id"] for s in page["data"]] == [steps[0]]
    assert api.get(f"{BASE}/runs/{run_id}/steps/{steps[0]}").json()["id"] == steps[0]
    # The Azure SDK adds its api-version; unknown parameters are ignored.
    assert api.get(f"{BASE}/runs/{run_id}/steps", {"api-version": "v1", "include[]": "x"}).status_code == 200
    assert error(api.get(f"{BASE}/runs/{run_id}/steps", {"limit": 101})) == (400, "INVALID_REQUEST")


def test_a_waiting_steps_usage_and_output_are_null(api):
    run_id = ask_run(thread=THREAD)
    (step,) = api.get(f"{BASE}/runs/{run_id}/steps").json()["data"]
    assert (step["status"], step["usage"]) == ("in_progress", None)
    assert step["step_details"]["tool_calls"][0]["function"]["output"] is None


def test_threads_their_runs_and_messages(api):
    first = decided_run(api)
    second = email_run(thread=THREAD)
    thread = api.get(BASE).json()
    assert (thread["id"], thread["object"], type(thread["created_at"])) == (THREAD, "thread", int)
    runs = api.get(f"{BASE}/runs", {"order": "asc"}).json()
    assert [r["id"] for r in runs["data"]] == [first, second]
    assert [r["status"] for r in runs["data"]] == ["completed", "requires_action"]
    messages = api.get(f"{BASE}/messages", {"order": "asc"}).json()["data"]
    # What people and the agent said; tool traffic lives in the run steps.
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": {"value": 'send-email: {"sent": true, "to": "ann@example.com"}', "annotations": []}}
    ]
    assert (messages[1]["assistant_id"], messages[1]["run_id"], messages[0]["assistant_id"]) == (
        "support-agent",
        first,
        None,
    )


def test_listing_runs_costs_the_same_queries_whatever_the_page(api):
    for _ in range(3):
        email_run(thread=THREAD)

    def queries(limit: int) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert len(api.get(f"{BASE}/runs", {"limit": limit}).json()["data"]) == limit
        return len(captured)

    queries(2)  # the token and permissions are read once, then kept (docs/security.md)
    assert queries(1) == queries(3)


def test_not_found_and_authorization(api, viewer_api, settings):
    run_id = email_run(thread=THREAD)
    step_id = RunStep.objects.filter(run_id=run_id).first().id
    other = email_run(thread="oa-other")
    assert error(api.get("/api/openai/v1/threads/nope")) == (404, "NOT_FOUND")
    assert error(api.get("/api/openai/v1/threads/nope/runs")) == (404, "NOT_FOUND")
    assert error(api.get(f"{BASE}/runs/run_nope")) == (404, "RUN_NOT_FOUND")
    assert error(api.get(f"{BASE}/runs/{other}")) == (404, "RUN_NOT_FOUND")  # a run of another thread
    assert error(api.get(f"/api/openai/v1/threads/oa-other/runs/{other}/steps/{step_id}")) == (404, "NOT_FOUND")
    assert error(api.get(f"{BASE}/runs/{run_id}/steps", {"after": "step_nope"})) == (404, "NOT_FOUND")
    assert error(api.get("/api/openai/v1/assistants")) == (404, "NOT_FOUND")
    for write in (f"{BASE}/runs/{run_id}/cancel", f"{BASE}/runs/{run_id}", f"{BASE}/runs"):  # it only reads
        assert error(api.post(write)) == (405, "METHOD_NOT_ALLOWED")
    assert RunStep.objects.get(pk=step_id).status == "in_progress"
    assert error(APIClient().get(f"{BASE}/runs/{run_id}")) == (401, "NOT_AUTHENTICATED")
    assert viewer_api.get(f"{BASE}/runs/{run_id}/steps").status_code == 200  # reading is a viewer's right

    # An agent restricted to other reviewers: its runs, and a thread holding only those, do not exist.
    settings.AGENTRUN_AGENT_REVIEWERS = {"support-agent": ["Support reviewers"]}
    assert error(api.get(f"{BASE}/runs/{run_id}")) == (404, "RUN_NOT_FOUND")
    assert error(api.get(f"{BASE}/runs/{run_id}/steps")) == (404, "RUN_NOT_FOUND")
    assert error(api.get(BASE)) == (404, "NOT_FOUND")
    assert error(api.get(f"{BASE}/messages")) == (404, "NOT_FOUND")


# --- ids that read like this prefix's own routes once decoded ------------------------------------
def sdk_path(template: str, **ids: str) -> str:
    """The path as the openai SDK builds it: each id percent-encoded, "/" included."""
    return "/api/openai/v1" + path_template(template, **ids)


async def test_an_encoded_thread_id_reaches_its_thread_whatever_it_holds(auth_header):
    client = AsgiClient(auth_header)
    decoy_run = await suspended_email_run(thread="oa-a")
    threads = [
        f"oa-a/runs/{decoy_run}",  # decoded, the decoy's run: it must not answer
        "oa-a/runs/b/steps/c",
        "oa-b/runs",
        "oa-c/messages",
        "oa-d/",
        "sp ace % #frag ?q=1 & ü 🙂",  # (control characters are refused in ids: tests/security/test_inputs.py)
    ]
    runs = {thread: await suspended_email_run(thread=thread) for thread in threads}
    for thread, run_id in runs.items():
        step_id = await RunStep.objects.filter(run_id=run_id).values_list("id", flat=True).aget()
        ids = {"thread_id": thread, "run_id": run_id, "step_id": step_id}
        azure = {k: quote(v, safe="") for k, v in ids.items()}  # azure-ai-agents quotes every character
        for base in (sdk_path("/threads/{thread_id}", **ids), "/api/openai/v1/threads/{thread_id}".format(**azure)):
            got = await (await client.get(base)).json()
            assert (got["object"], got["id"]) == ("thread", thread)
            assert (await (await client.get(f"{base}/")).json())["id"] == thread  # a trailing slash too
            listed = await (await client.get(f"{base}/runs")).json()
            assert [r["id"] for r in listed["data"]] == [run_id]
            run = await (await client.get(f"{base}/runs/{run_id}")).json()
            assert (run["id"], run["thread_id"], run["status"]) == (run_id, thread, "requires_action")
            steps = await (await client.get(f"{base}/runs/{run_id}/steps")).json()
            assert [s["id"] for s in steps["data"]] == [step_id]
            step = await (await client.get(f"{base}/runs/{run_id}/steps/{step_id}")).json()
            assert (step["id"], step["thread_id"]) == (step_id, thread)
            messages = await (await client.get(f"{base}/messages")).json()
            assert [m["thread_id"] for m in messages["data"]] == [thread]
            missing = await client.get(f"{base}/runs/{decoy_run}")  # another thread's run
            assert (missing.status_code, (await missing.json())["error"]["code"]) == (404, "RUN_NOT_FOUND")

    # A client that leaves "/" unencoded still reads an unambiguous thread id (the longest reading).
    plain = await suspended_email_run(thread="oa/plain")
    listed = await (await client.get("/api/openai/v1/threads/oa/plain/runs")).json()
    assert [r["id"] for r in listed["data"]] == [plain]
    for nowhere in ("/api/openai/v1/threads/", "/api/openai/v1/threads", "/api/openai/v1/threads/x/runs/r/nope"):
        answer = await client.get(nowhere)
        assert (answer.status_code, (await answer.json())["error"]["code"]) == (404, "NOT_FOUND"), nowhere

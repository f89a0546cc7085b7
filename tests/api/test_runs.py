"""Runs, steps, messages, the decision audit trail, agents, generate, cancel and background tasks over REST."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agentrun.core.models import Decision, RunStep, args_fingerprint
from tests.helpers.runs import ask_run, email_run, refund_run, wait_rested

# A test runs in a transaction rolled back at its end; those marked transaction=True need real commits
# (a decision's continuation, a start or a cancel goes on in another thread, started on commit).
pytestmark = pytest.mark.django_db

RUN_FIELDS = {
    "id",
    "object",
    "agentId",
    "threadId",
    "resourceId",
    "parentRunId",
    "status",
    "createdAt",
    "startedAt",
    "suspendedAt",
    "completedAt",
    "failedAt",
    "cancelledAt",
    "expiredAt",
    "expiresAt",
    "lastError",
    "usage",
    "metadata",
    "startedBy",
}
STEP_FIELDS = {
    "id",
    "object",
    "type",
    "assistantId",
    "threadId",
    "runId",
    "status",
    "stepDetails",
    "lastError",
    "createdAt",
    "completedAt",
    "cancelledAt",
    "failedAt",
    "expiredAt",
    "usage",
    "metadata",
}
LIST_FIELDS = {"object", "data", "firstId", "lastId", "hasMore"}


def code(response) -> str:
    return response.json()["error"]["code"]


def test_agents_list(api):
    body = api.get("/api/agents/").json()
    assert set(body) == LIST_FIELDS and body["object"] == "list" and body["hasMore"] is False
    agents = {a["id"]: a for a in body["data"]}
    assert {"support-agent", "billing-agent", "support-supervisor"} <= set(agents)
    tools = {t["id"]: t for t in agents["support-agent"]["tools"]}
    assert tools["send-email"] == {
        "id": "send-email",
        "requiresApproval": True,
        "background": False,
        "resumeSchema": None,
        "risk": "medium",
    }
    assert tools["delete-record"]["risk"] == "high" and tools["lookup-order"]["risk"] == "low"
    assert tools["research"]["background"] is True
    assert tools["ask-user"]["resumeSchema"]["properties"]["answer"]["minLength"] == 1
    assert agents["support-supervisor"]["agents"] == ["billing-agent"]
    assert api.get("/api/agents").json() == body


@pytest.mark.django_db(transaction=True)
def test_generate(api, reviewer):
    response = api.post(
        "/api/agents/support-agent/generate",
        {"messages": "hello there", "memory": {"thread": "g-1", "resource": "u-1"}, "metadata": {"ticket": "42"}},
        format="json",
    )
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "completed" and body["text"] == "Echo: hello there"
    assert body["finishReason"] == "stop" and body["suspended"] == [] and body["toolCalls"] == []
    assert body["usage"]["totalTokens"] > 0
    run = api.get(f"/api/runs/{body['runId']}").json()
    assert run["metadata"] == {"ticket": "42"} and run["threadId"] == "g-1"


@pytest.mark.django_db(transaction=True)
def test_generate_that_suspends_lists_the_open_call(api):
    body = api.post(
        "/api/agents/support-agent/generate/",
        {
            "messages": [{"role": "user", "content": '/tool send-email {"to":"a@b.c","subject":"s","body":"b"}'}],
        },
        format="json",
    ).json()
    assert body["status"] == "suspended" and body["finishReason"] == "suspended"
    [call] = body["suspended"]
    assert call["toolName"] == "send-email" and call["requiresApproval"] is True
    listed = api.get("/api/agents/support-agent/suspended-runs").json()["runs"]
    assert [r["runId"] for r in listed] == [body["runId"]]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({}, "INVALID_REQUEST"),
        ({"messages": 5}, "INVALID_REQUEST"),
        ({"messages": "x", "maxSteps": 0}, "INVALID_REQUEST"),
        ({"messages": "x", "memory": "t"}, "INVALID_REQUEST"),
        ({"messages": "x", "memory": {"thread": "t" * 256}}, "INVALID_REQUEST"),
        ({"messages": "x", "memory": {"thread": "t"}, "untilIdle": "yes"}, "INVALID_REQUEST"),
        ({"messages": "x", "requireToolApproval": "yes"}, "INVALID_REQUEST"),
        ({"messages": "x", "metadata": {"k": 1}}, "INVALID_METADATA"),
        ({"messages": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, "INVALID_METADATA"),
        ({"messages": "x", "metadata": {"k" * 65: "v"}}, "INVALID_METADATA"),
    ],
)
def test_start_validation(api, body, error):
    for endpoint in ("generate", "stream"):
        response = api.post(f"/api/agents/support-agent/{endpoint}", body, format="json")
        assert (response.status_code, code(response)) == (400, error), response.content


def test_starting_needs_an_agent_and_the_start_permission(api, viewer_api):
    response = api.post("/api/agents/nobody/generate", {"messages": "x"}, format="json")
    assert (response.status_code, code(response)) == (404, "AGENT_NOT_FOUND")
    response = viewer_api.post("/api/agents/support-agent/generate", {"messages": "x"}, format="json")
    assert (response.status_code, code(response)) == (403, "PERMISSION_DENIED")


def test_run_object(api, viewer_api):
    run_id = email_run()
    body = viewer_api.get(f"/api/runs/{run_id}").json()
    assert set(body) == RUN_FIELDS
    assert body["object"] == "thread.run" and body["status"] == "suspended" and body["suspendedAt"]
    assert api.get(f"/api/runs/{run_id}/").json() == body
    response = api.get("/api/runs/run_nope")
    assert (response.status_code, code(response)) == (404, "RUN_NOT_FOUND")


@pytest.mark.django_db(transaction=True)
def test_steps_cursor_pagination(api):
    run_id = email_run()
    api.post(f"/api/agents/support-agent/runs/{run_id}/approve", {}, format="json")
    wait_rested(run_id)
    steps = list(RunStep.objects.filter(run_id=run_id).order_by("created_at", "id").values_list("id", flat=True))
    assert len(steps) == 2  # the tool_calls step, then the answer

    body = api.get(f"/api/runs/{run_id}/steps").json()
    assert set(body) == LIST_FIELDS and set(body["data"][0]) == STEP_FIELDS
    assert [s["id"] for s in body["data"]] == steps[::-1]  # desc by default
    assert (body["firstId"], body["lastId"], body["hasMore"]) == (steps[-1], steps[0], False)
    tool_step = body["data"][1]
    assert tool_step["type"] == "tool_calls" and tool_step["stepDetails"]["toolCalls"][0]["type"] == "function"

    page = api.get(f"/api/runs/{run_id}/steps", {"limit": 1, "order": "asc"}).json()
    assert ([s["id"] for s in page["data"]], page["hasMore"]) == ([steps[0]], True)
    page = api.get(f"/api/runs/{run_id}/steps", {"limit": 1, "order": "asc", "after": page["lastId"]}).json()
    assert ([s["id"] for s in page["data"]], page["hasMore"]) == ([steps[1]], False)
    page = api.get(f"/api/runs/{run_id}/steps", {"order": "asc", "before": steps[1]}).json()
    assert [s["id"] for s in page["data"]] == [steps[0]]
    page = api.get(f"/api/runs/{run_id}/steps", {"limit": 1, "after": steps[1]}).json()  # desc: after = older
    assert [s["id"] for s in page["data"]] == [steps[0]]

    for params in ({"limit": 0}, {"limit": 101}, {"limit": "x"}, {"order": "up"}):
        response = api.get(f"/api/runs/{run_id}/steps", params)
        assert (response.status_code, code(response)) == (400, "INVALID_REQUEST")
    response = api.get(f"/api/runs/{run_id}/steps", {"after": "step_nope"})
    assert (response.status_code, code(response)) == (404, "NOT_FOUND")
    response = api.get("/api/runs/run_nope/steps")
    assert (response.status_code, code(response)) == (404, "RUN_NOT_FOUND")


def test_one_step(api):
    run_id = email_run()
    step_id = RunStep.objects.filter(run_id=run_id).first().id
    body = api.get(f"/api/runs/{run_id}/steps/{step_id}").json()
    assert set(body) == STEP_FIELDS
    assert body["status"] == "in_progress" and body["usage"] is None  # waiting for people
    response = api.get(f"/api/runs/{run_id}/steps/step_nope")
    assert (response.status_code, code(response)) == (404, "NOT_FOUND")
    other = email_run(thread="t-other")
    response = api.get(f"/api/runs/{other}/steps/{step_id}")  # a step of another run
    assert (response.status_code, code(response)) == (404, "NOT_FOUND")


@pytest.mark.django_db(transaction=True)
def test_cancel(api, viewer_api):
    run_id = email_run()
    response = viewer_api.post(f"/api/runs/{run_id}/cancel")
    assert (response.status_code, code(response)) == (403, "PERMISSION_DENIED")
    response = api.post(f"/api/runs/{run_id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled" and response.json()["cancelledAt"]
    assert api.get("/api/agents/support-agent/suspended-runs").json()["total"] == 0
    again = api.post(f"/api/runs/{run_id}/cancel/")
    assert (again.status_code, code(again)) == (409, "RUN_NOT_SUSPENDED")
    response = api.post("/api/runs/run_nope/cancel")
    assert (response.status_code, code(response)) == (404, "RUN_NOT_FOUND")
    # A decision on a cancelled run: it has finished.
    response = api.post(f"/api/agents/support-agent/runs/{run_id}/approve", {}, format="json")
    assert response.status_code in (404, 409)


@pytest.mark.django_db(transaction=True)
def test_thread_messages(api):
    run_id = email_run(thread="t-msg")
    api.post(f"/api/agents/support-agent/runs/{run_id}/approve", {}, format="json")
    wait_rested(run_id)
    body = api.get("/api/threads/t-msg/messages", {"order": "asc"}).json()
    assert set(body) == LIST_FIELDS
    roles = [m["role"] for m in body["data"]]
    assert roles[0] == "user" and roles[-1] == "assistant" and "tool" in roles
    assert all(m["object"] == "thread.message" and m["threadId"] == "t-msg" for m in body["data"])
    newest = api.get("/api/threads/t-msg/messages/", {"limit": 1}).json()
    assert newest["data"][0]["id"] == body["data"][-1]["id"] and newest["hasMore"] is True
    response = api.get("/api/threads/nope/messages")
    assert (response.status_code, code(response)) == (404, "NOT_FOUND")


@pytest.mark.django_db(transaction=True)
def test_decisions_audit_trail_with_filters(api):
    email, ask, refund = email_run(thread="t-a", resource="u-1"), ask_run(thread="t-b"), refund_run(thread="t-c")
    api.post(f"/api/agents/support-agent/runs/{email}/decline", {"reason": "no"}, format="json")
    api.post(f"/api/agents/support-agent/runs/{ask}/resume", {"resumeData": {"answer": "Rome"}}, format="json")
    # refund is high risk: an approval proves what it saw (the fingerprint of the arguments shown).
    seen = args_fingerprint({"orderId": "o-1", "amount": 5.0})  # as validated: a float
    api.post(f"/api/agents/billing-agent/runs/{refund}/approve", {"argsFingerprint": seen}, format="json")
    for run_id in (email, ask, refund):
        wait_rested(run_id)

    body = api.get("/api/decisions").json()
    assert set(body) == LIST_FIELDS
    assert [d["runId"] for d in body["data"]] == [refund, ask, email]  # newest first
    decline = body["data"][2]
    assert set(decline) == {
        "id",
        "runId",
        "agentId",
        "threadId",
        "toolCallId",
        "toolName",
        "kind",
        "args",
        "editedArgs",
        "resumeData",
        "reason",
        "decidedBy",
        "via",
        "decidedAt",
        "argsFingerprint",
    }
    assert (decline["kind"], decline["reason"], decline["decidedBy"], decline["via"]) == (
        "decline",
        "no",
        "rita",
        "api",
    )

    def run_ids(**params):
        response = api.get("/api/decisions/", params)
        assert response.status_code == 200, response.content
        return [d["runId"] for d in response.json()["data"]]

    assert run_ids(agentId="billing-agent") == [refund]
    assert run_ids(threadId="t-b") == [ask]
    assert run_ids(runId=email) == [email]
    assert run_ids(decidedBy="rita") == [refund, ask, email]
    assert run_ids(decidedBy="nobody") == []
    middle = Decision.objects.get(run_id=ask).decided_at
    assert run_ids(fromDate=middle.isoformat()) == [refund, ask]
    assert run_ids(toDate=body["data"][1]["decidedAt"]) == [ask, email]  # a returned timestamp matches itself
    assert run_ids(fromDate=(timezone.now() + timedelta(days=1)).isoformat()) == []
    assert run_ids(order="asc", limit=2) == [email, ask]
    page = api.get("/api/decisions", {"limit": 1}).json()
    assert page["hasMore"] is True
    assert run_ids(after=page["lastId"]) == [ask, email]

    response = api.get("/api/decisions", {"fromDate": "not a date"})
    assert (response.status_code, code(response)) == (400, "INVALID_DATE")
    response = api.get("/api/decisions", {"limit": 1000})
    assert (response.status_code, code(response)) == (400, "INVALID_REQUEST")


def test_background_tasks(api, viewer_api):
    body = viewer_api.get("/api/background-tasks", {"status": "running", "agentId": "support-agent"}).json()
    assert body == {"object": "list", "data": [], "firstId": None, "lastId": None, "hasMore": False}
    response = api.get("/api/background-tasks/", {"status": "sleeping"})
    assert (response.status_code, code(response)) == (400, "INVALID_REQUEST")
    response = api.post("/api/background-tasks/task_nope/cancel")
    assert (response.status_code, code(response)) == (404, "NOT_FOUND")
    response = viewer_api.post("/api/background-tasks/task_nope/cancel")
    assert (response.status_code, code(response)) == (403, "PERMISSION_DENIED")


def test_background_tasks_are_listed_filtered_and_cancelled(api, viewer_api):
    from agentrun.core.models import BackgroundTask, RunChunk

    run_id = email_run(thread="thread-bg")
    first = BackgroundTask.objects.create(
        run_id=run_id,
        agent_id="support-agent",
        thread_id="thread-bg",
        tool_call_id="call_bg1",
        tool_name="research",
        args={"topic": "a"},
    )
    BackgroundTask.objects.create(
        run_id=run_id,
        agent_id="support-agent",
        thread_id="thread-bg",
        tool_call_id="call_bg2",
        tool_name="research",
        args={"topic": "b"},
        status="completed",
        result={"topic": "b"},
    )
    body = viewer_api.get("/api/background-tasks", {"runId": run_id, "status": "pending"}).json()
    assert [t["id"] for t in body["data"]] == [first.id]
    assert body["data"][0]["toolCallId"] == "call_bg1" and body["data"][0]["status"] == "pending"
    assert len(viewer_api.get("/api/background-tasks", {"agentId": "support-agent"}).json()["data"]) == 2
    assert viewer_api.get("/api/background-tasks", {"agentId": "billing-agent"}).json()["data"] == []

    response = api.post(f"/api/background-tasks/{first.id}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert RunChunk.objects.filter(run_id=run_id, type="background-task-cancelled").count() == 1
    response = api.post(f"/api/background-tasks/{first.id}/cancel")
    assert (response.status_code, code(response)) == (400, "INVALID_REQUEST"), "already ended"

"""``/api/mastra/``: Mastra's agent routes, bodies and event-stream framing over the native engine and
permissions, through the real ASGI application (``tests/compat/test_real_clients.py`` drives Mastra's own
client against a real server)."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from agentrun.core.models import Decision, Run
from tests.helpers.asgi import AsgiClient, AsgiResponse
from tests.helpers.runs import ask_run, email_run, open_call_ids, refund_run, tool_line, wait_rested

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = "/api/mastra/agents/support-agent"


async def mastra_events(response: AsgiResponse) -> list[dict]:
    """Mastra's framing, strictly: every event is one ``data: <JSON>`` line; the last is ``[DONE]``."""
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    frames = [f for f in (await response.read()).decode().split("\n\n") if f]
    assert all(f.startswith("data: ") and "\n" not in f for f in frames), frames
    assert frames[-1] == "data: [DONE]"
    return [json.loads(f[len("data: ") :]) for f in frames[:-1]]


async def error_of(response: AsgiResponse) -> tuple[int, str]:
    body = await response.json()
    assert isinstance(body["error"], str) and body["error"]  # Mastra's envelope: the message
    return response.status_code, body["code"]


async def rested(run_id: str) -> None:
    # Not thread-sensitive: polling must not hold the one thread the engine's own DB calls need.
    await sync_to_async(wait_rested, thread_sensitive=False)(run_id)


@pytest.fixture
def client(auth_header) -> AsgiClient:
    return AsgiClient(auth_header)


async def first_open_call(run_id: str) -> str:
    return (await open_call_ids("support-agent", run_id))[0]


async def test_stream_uses_mastra_framing_and_message_shapes(client):
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "you"}]}
        ],
        "memory": {"thread": {"id": "mastra-1"}, "resource": "u-1"},
        "requestContext": {"ignored": True},
    }
    chunks = await mastra_events(await client.post(f"{AGENT}/stream", body))
    assert chunks[0]["type"] == "start" and chunks[-1]["type"] == "finish"
    assert "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta") == "Echo: hello you"
    finish = chunks[-1]["payload"]
    assert finish["stepResult"] == {"reason": "stop"}
    assert finish["output"]["usage"]["totalTokens"] == finish["usage"]["totalTokens"] > 0
    run = await Run.objects.aget(pk=chunks[0]["runId"])
    assert (run.thread_id, run.resource_id) == ("mastra-1", "u-1")


async def test_approve_tool_call_streams_the_continuation_with_the_call_before_its_result(client, reviewer):
    run_id = await sync_to_async(email_run)()
    call = await first_open_call(run_id)
    chunks = await mastra_events(await client.post(f"{AGENT}/approve-tool-call", {"runId": run_id, "toolCallId": call}))
    types = [c["type"] for c in chunks]
    assert types[:3] == ["start", "tool-call", "tool-result"] and types[-1] == "finish"
    assert chunks[1]["payload"]["toolCallId"] == chunks[2]["payload"]["toolCallId"] == call
    assert chunks[1]["payload"]["toolName"] == "send-email" and "seq" not in chunks[1]  # announced, not logged
    assert chunks[-1]["payload"]["stepResult"]["reason"] == "stop"
    await rested(run_id)
    decision = await Decision.objects.aget(run_id=run_id)
    assert (decision.kind, decision.via, decision.decided_by_username) == ("approve", "api", reviewer.username)


async def test_approve_with_edited_arguments_as_the_native_api_allows(client):
    run_id = await sync_to_async(email_run)(thread="mastra-edit")
    body = {"runId": run_id, "toolCallId": await first_open_call(run_id)}
    invalid = await client.post(f"{AGENT}/approve-tool-call", {**body, "args": {"to": 1}})
    assert await error_of(invalid) == (400, "ARGS_INVALID")
    edited = {"to": "bob@example.com", "subject": "Hi", "body": "Edited."}
    chunks = await mastra_events(await client.post(f"{AGENT}/approve-tool-call", {**body, "args": edited}))
    assert next(c for c in chunks if c["type"] == "tool-result")["payload"]["result"]["to"] == "bob@example.com"
    decision = await Decision.objects.aget(run_id=run_id)
    assert decision.edited_args == edited
    await rested(run_id)


async def test_an_args_fingerprint_guards_a_decision_as_on_every_door(client):
    run_id = await sync_to_async(email_run)(thread="mastra-fingerprint")
    listed = await (await client.get(f"{AGENT}/suspended-runs?threadId=mastra-fingerprint")).json()
    call = listed["runs"][0]["toolCalls"][0]
    body = {"runId": run_id, "toolCallId": call["toolCallId"]}
    stale = await client.post(f"{AGENT}/decline-tool-call", {**body, "argsFingerprint": "0" * 64})
    assert await error_of(stale) == (409, "ARGS_CHANGED")
    assert await Decision.objects.filter(run_id=run_id).acount() == 0
    await mastra_events(
        await client.post(f"{AGENT}/decline-tool-call", {**body, "argsFingerprint": call["argsFingerprint"]})
    )
    assert (await Decision.objects.aget(run_id=run_id)).kind == "decline"
    await rested(run_id)


async def test_decline_with_a_reason_and_resume(client):
    run_id = await sync_to_async(email_run)(thread="mastra-decline")
    call = await first_open_call(run_id)
    response = await client.post(
        f"{AGENT}/decline-tool-call/", {"runId": run_id, "toolCallId": call, "reason": "Wrong customer"}
    )
    chunks = await mastra_events(response)
    denied = next(c for c in chunks if c["type"] == "tool-output-denied")
    assert denied["payload"]["approval"]["reason"] == "Wrong customer"
    assert [c["type"] for c in chunks][1:3] == ["tool-call", "tool-output-denied"]

    asked = await sync_to_async(ask_run)(thread="mastra-ask")
    invalid = await client.post(f"{AGENT}/resume-stream", {"runId": asked, "resumeData": {"answer": ""}})
    assert await error_of(invalid) == (400, "RESUME_DATA_INVALID")
    assert await Decision.objects.filter(run_id=asked).acount() == 0
    # toolCallId may be left out when one call waits, as in Mastra's resumeStream.
    chunks = await mastra_events(
        await client.post(f"{AGENT}/resume-stream", {"runId": asked, "resumeData": {"answer": "Lyon"}, "memory": {}})
    )
    result = next(c for c in chunks if c["type"] == "tool-result")
    assert result["payload"]["result"] == {"answer": "Lyon"}
    await rested(asked)


async def test_generate_variants_answer_json(client):
    run_id = await sync_to_async(email_run)(thread="mastra-generate")
    call = await first_open_call(run_id)
    response = await client.post(f"{AGENT}/approve-tool-call-generate", {"runId": run_id, "toolCallId": call})
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    result = await response.json()
    assert result["text"] == 'send-email: {"sent": true, "to": "ann@example.com"}'
    assert (result["finishReason"], result["status"], result["runId"]) == ("stop", "completed", run_id)
    assert [c["type"] for c in result["toolCalls"]] == ["tool-call"]
    assert result["toolResults"][0]["payload"]["result"]["sent"] is True

    run_id = await sync_to_async(email_run)(thread="mastra-generate-2")
    call = await first_open_call(run_id)
    response = await client.post(f"{AGENT}/decline-tool-call-generate", {"runId": run_id, "toolCallId": call})
    assert (await response.json())["text"] == "send-email: denied: Tool call was not approved by the user"


async def test_observe_replays_from_an_offset_to_the_segments_finish(client):
    run_id = await sync_to_async(email_run)(thread="mastra-observe")
    everything = await mastra_events(await client.post(f"{AGENT}/observe", {"runId": run_id}))
    assert [c["seq"] for c in everything] == list(range(1, len(everything) + 1))
    assert everything[-1]["payload"]["finishReason"] == "suspended"
    tail = await mastra_events(await client.post(f"{AGENT}/observe", {"runId": run_id, "offset": 3}))
    assert tail == everything[3:]


async def test_agents_are_listed_in_mastras_shape(settings, client):
    agents = await (await client.get("/api/mastra/agents")).json()
    assert {"support-agent", "billing-agent", "support-supervisor"} <= set(agents)
    supervisor = await (await client.get("/api/mastra/agents/support-supervisor/")).json()
    assert supervisor["agents"] == {"billing-agent": {"id": "billing-agent", "name": "Billing agent"}}
    tool = supervisor["tools"]["agent-billing-agent"]
    assert json.loads(tool["inputSchema"])["properties"]["message"]["type"] == "string"
    assert (supervisor["provider"], supervisor["modelId"]) == ("agentrun", "directive")
    settings.AGENTRUN_AGENT_REVIEWERS = {"billing-agent": ["Billing reviewers"]}  # the user is outside
    assert "billing-agent" not in await (await client.get("/api/mastra/agents")).json()
    assert await error_of(await client.get("/api/mastra/agents/billing-agent")) == (404, "AGENT_NOT_FOUND")


async def test_listing_is_the_listing_contract(client):
    run_id = await sync_to_async(email_run)(thread="mastra-list")
    response = await client.get(f"{AGENT}/suspended-runs?threadId=mastra-list&perPage=1&page=0")
    page = await response.json()
    assert page["total"] == 1 and page["runs"][0]["runId"] == run_id
    assert page["runs"][0]["toolCalls"][0]["toolName"] == "send-email"
    assert await error_of(await client.get(f"{AGENT}/suspended-runs?perPage=0&page=0")) == (400, "INVALID_PER_PAGE")


async def test_bad_requests_get_mastras_error_envelope_and_change_nothing(client, viewer):
    run_id = await sync_to_async(email_run)(thread="mastra-errors")
    call = await first_open_call(run_id)
    approve = f"{AGENT}/approve-tool-call"
    assert await error_of(await client.post(approve, {"toolCallId": call})) == (400, "INVALID_REQUEST")
    assert await error_of(await client.post(approve, {"runId": run_id})) == (400, "INVALID_REQUEST")
    assert await error_of(await client.post(approve, {"runId": "run_nope", "toolCallId": call})) == (
        404,
        "RUN_NOT_FOUND",
    )
    wrong_kind = await client.post(f"{AGENT}/resume-stream", {"runId": run_id, "resumeData": {"answer": "x"}})
    assert await error_of(wrong_kind) == (400, "WRONG_DECISION_KIND")
    assert await error_of(await client.post("/api/mastra/agents/nobody/stream", {"messages": "x"})) == (
        404,
        "AGENT_NOT_FOUND",
    )
    assert await error_of(await client.post(f"{AGENT}/stream", {"memory": {}})) == (400, "INVALID_REQUEST")
    assert await error_of(await client.post(f"{AGENT}/observe", {"runId": run_id, "offset": -1})) == (
        400,
        "INVALID_REQUEST",
    )
    assert await error_of(await client.get("/api/mastra/agents/support-agent/nothing-here")) == (404, "NOT_FOUND")
    # Another agent's run does not exist for this agent's routes.
    refund = await sync_to_async(refund_run)(thread="mastra-refund")
    refund_call = (await open_call_ids("billing-agent", refund))[0]
    assert await error_of(await client.post(approve, {"runId": refund, "toolCallId": refund_call})) == (
        404,
        "RUN_NOT_FOUND",
    )
    # Nobody signed in, and a viewer who may read but not decide.
    assert await error_of(await AsgiClient().post(approve, {"runId": run_id, "toolCallId": call})) == (
        401,
        "NOT_AUTHENTICATED",
    )
    viewer_client = AsgiClient({"authorization": f"Bearer {await token_for(viewer)}"})
    assert await error_of(await viewer_client.post(approve, {"runId": run_id, "toolCallId": call})) == (
        403,
        "PERMISSION_DENIED",
    )
    assert (await viewer_client.get(f"{AGENT}/suspended-runs")).status_code == 200
    assert await Decision.objects.filter(run_id=run_id).acount() == 0
    assert (await Run.objects.aget(pk=run_id)).status == "suspended"

    first = await client.post(approve, {"runId": run_id, "toolCallId": call})
    await mastra_events(first)
    assert await error_of(await client.post(approve, {"runId": run_id, "toolCallId": call})) == (
        409,
        "TOOL_CALL_ALREADY_DECIDED",
    )
    await rested(run_id)


@sync_to_async
def token_for(user) -> str:
    from rest_framework.authtoken.models import Token

    return Token.objects.get_or_create(user=user)[0].key


async def test_a_hidden_agent_is_not_found_on_every_mastra_route(settings, client):
    settings.AGENTRUN_AGENT_REVIEWERS = {"support-agent": ["Support reviewers"]}  # the client's user is outside
    run_id = await sync_to_async(email_run)(thread="mastra-hidden")
    call = await first_open_call(run_id)
    for method, route, body in (
        ("get", "suspended-runs", None),
        ("post", "stream", {"messages": tool_line("echo", {"value": 1})}),
        ("post", "observe", {"runId": run_id}),
        ("post", "approve-tool-call", {"runId": run_id, "toolCallId": call}),
        ("post", "decline-tool-call-generate", {"runId": run_id, "toolCallId": call}),
        ("post", "resume-stream", {"runId": run_id, "resumeData": {}}),
    ):
        response = await (client.get(f"{AGENT}/{route}") if method == "get" else client.post(f"{AGENT}/{route}", body))
        assert await error_of(response) == (404, "AGENT_NOT_FOUND"), route
    assert await Decision.objects.filter(run_id=run_id).acount() == 0

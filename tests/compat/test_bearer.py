"""``Authorization: Bearer <key>`` works wherever ``Token <key>`` does
(docs/api.md#authentication-and-permissions): REST, the compatibility prefixes, and websockets."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agentrun.asgi import application
from agentrun.core.models import Decision
from tests.helpers.runs import email_run, open_call_ids, wait_rested

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://localhost")


def bearer_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


@pytest.mark.parametrize(
    "path",
    [
        "/api/agents/",
        "/api/decisions",
        "/api/mastra/agents/support-agent/suspended-runs",
        "/api/openai/v1/threads/thread-1/runs",
    ],
)
def test_bearer_reads_like_token(reviewer, path):
    email_run()
    key = Token.objects.create(user=reviewer).key
    assert bearer_client(key).get(path).status_code == 200
    assert bearer_client("not-a-key").get(path).status_code == 401


def test_bearer_decides_and_the_decision_names_the_person(reviewer):
    run_id = email_run()
    key = Token.objects.create(user=reviewer).key
    response = bearer_client(key).post(f"/api/agents/support-agent/runs/{run_id}/approve", {}, format="json")
    assert response.status_code == 202
    wait_rested(run_id)
    decision = Decision.objects.get(run_id=run_id)
    assert (decision.decided_by_username, decision.via) == (reviewer.username, "api")


async def test_a_websocket_authenticates_with_a_bearer_header(reviewer):
    run_id = await sync_to_async(email_run)(thread="bearer-ws")
    key = (await Token.objects.acreate(user=reviewer)).key
    comm = WebsocketCommunicator(
        application, f"/ws/runs/{run_id}/", headers=[ORIGIN, (b"authorization", f"Bearer {key}".encode())]
    )
    assert (await comm.connect())[0]
    first = await comm.receive_json_from(timeout=5)
    assert (first["type"], first["seq"]) == ("start", 1)  # the replay, not NOT_AUTHENTICATED
    await comm.disconnect()

    decider = WebsocketCommunicator(
        application, "/ws/agents/support-agent/", headers=[ORIGIN, (b"authorization", f"Bearer {key}".encode())]
    )
    assert (await decider.connect())[0]
    call = (await open_call_ids("support-agent", run_id))[0]
    await decider.send_json_to({"action": "approve", "runId": run_id, "toolCallId": call})
    while (frame := await decider.receive_json_from(timeout=10))["type"] != "finish":
        assert frame["type"] != "error", frame
    await decider.disconnect()
    decision = await Decision.objects.aget(run_id=run_id)
    assert (decision.decided_by_username, decision.via) == (reviewer.username, "websocket")

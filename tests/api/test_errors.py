"""The error envelope: authentication, permissions, body size, malformed input, unknown paths."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from tests.helpers.runs import email_run

ENDPOINTS = [
    ("get", "/api/agents/"),
    ("post", "/api/agents/support-agent/stream"),
    ("post", "/api/agents/support-agent/generate"),
    ("get", "/api/agents/support-agent/suspended-runs"),
    ("post", "/api/agents/support-agent/runs/run_x/approve"),
    ("post", "/api/agents/support-agent/runs/run_x/decline"),
    ("post", "/api/agents/support-agent/runs/run_x/resume"),
    ("get", "/api/runs/run_x"),
    ("get", "/api/runs/run_x/steps"),
    ("get", "/api/runs/run_x/steps/step_x"),
    ("get", "/api/runs/run_x/stream"),
    ("post", "/api/runs/run_x/cancel"),
    ("get", "/api/threads/t/messages"),
    ("get", "/api/decisions"),
    ("get", "/api/background-tasks"),
    ("post", "/api/background-tasks/task_x/cancel"),
]


def envelope(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
    return body["error"]


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
@pytest.mark.parametrize("slash", ["", "/"])
def test_anonymous_is_401_with_a_challenge(method, path, slash):
    path = path.rstrip("/") + slash
    response = getattr(APIClient(), method)(path)
    assert response.status_code == 401, response.content
    assert envelope(response)["code"] == "NOT_AUTHENTICATED"
    assert response["WWW-Authenticate"] == "Token"


@pytest.mark.django_db
def test_a_bad_token_is_401():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token nope")
    response = client.get("/api/decisions")
    assert response.status_code == 401 and envelope(response)["code"] == "NOT_AUTHENTICATED"


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_a_user_without_the_groups_is_403(method, path):

    from tests.helpers.users import make_user, token_client

    client = token_client(make_user("nobody", group=None))
    response = getattr(client, method)(path, {}, format="json") if method == "post" else client.get(path)
    assert response.status_code == 403
    assert envelope(response)["code"] == "PERMISSION_DENIED"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "perm_code"),
    [
        ("/api/agents/support-agent/generate", "start"),
        ("/api/agents/support-agent/runs/run_x/approve", "decide"),
        ("/api/runs/run_x/cancel", "cancel"),
    ],
)
def test_viewers_read_but_do_not_write(viewer_api, path, perm_code):
    assert viewer_api.get("/api/decisions").status_code == 200
    response = viewer_api.post(path, {"messages": "x"}, format="json")
    assert response.status_code == 403 and envelope(response)["code"] == "PERMISSION_DENIED"


@pytest.mark.django_db
def test_session_authentication_works_with_csrf(reviewer):
    client = APIClient(enforce_csrf_checks=True)
    client.login(username="rita", password="pw")
    assert client.get("/api/decisions").status_code == 200
    response = client.post("/api/runs/run_x/cancel")  # no CSRF token: refused before anything happens
    assert response.status_code == 403 and envelope(response)["code"] == "PERMISSION_DENIED"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/api/agents/support-agent/generate",
        "/api/agents/support-agent/runs/run_x/approve",
        "/api/agents/support-agent/stream",
    ],
)
def test_bodies_over_1_mib_are_413(api, path):
    body = json.dumps({"messages": "x" * (1024 * 1024 + 10)})
    response = api.generic("POST", path, body, content_type="application/json")
    assert response.status_code == 413
    assert envelope(response)["code"] == "PAYLOAD_TOO_LARGE"


def test_the_parser_stops_reading_after_1_mib_whatever_the_declared_length():
    """A chunked body (no Content-Length) is cut off while it is read."""
    from io import BytesIO

    from agentrun.api.http import BoundedJSONParser
    from agentrun.core.errors import AgentRunError

    body = json.dumps({"messages": "x" * (1024 * 1024 + 10)}).encode()
    with pytest.raises(AgentRunError) as err:
        BoundedJSONParser().parse(BytesIO(body))
    assert err.value.code == "PAYLOAD_TOO_LARGE" and err.value.http_status == 413
    assert BoundedJSONParser().parse(BytesIO(b'{"messages": "hi"}')) == {"messages": "hi"}


@pytest.mark.django_db
def test_a_form_encoded_oversize_body_is_413_not_400(api):
    response = api.generic(
        "POST",
        "/api/runs/run_x/cancel",
        "a=" + "x" * (1024 * 1024 + 10),
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 413 and envelope(response)["code"] == "PAYLOAD_TOO_LARGE"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body", [b"{", b"nul", b"NaN", b'{"messages": NaN}', b"[" * 100000, b"\xc3\x28", b'{"messages": "\\u0000"}']
)
def test_malformed_json_is_400(api, body):
    response = api.generic("POST", "/api/agents/support-agent/generate", body, content_type="application/json")
    assert response.status_code == 400
    assert envelope(response)["code"] == "INVALID_REQUEST"


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/runs/%00/steps", "/api/decisions?agentId=%00", "/api/threads/a%00b/messages"])
def test_nul_characters_are_400(api, path):
    response = api.get(path)
    assert response.status_code == 400 and envelope(response)["code"] == "INVALID_REQUEST"


@pytest.mark.django_db
def test_unknown_api_paths_and_methods(api):
    response = api.get("/api/nothing/here")
    assert response.status_code == 404 and envelope(response)["code"] == "NOT_FOUND"
    response = api.delete("/api/decisions")
    assert response.status_code == 405 and envelope(response)["code"] == "METHOD_NOT_ALLOWED"


@pytest.mark.django_db(transaction=True)
def test_an_unexpected_accept_header_still_gets_json(api):
    run_id = email_run()
    response = api.get(f"/api/runs/{run_id}", HTTP_ACCEPT="application/xml")
    assert response.status_code == 200 and response.json()["id"] == run_id
    response = api.post(
        f"/api/agents/support-agent/runs/{run_id}/resume", {}, format="json", HTTP_ACCEPT="text/event-stream"
    )
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert envelope(response)["code"] == "INVALID_REQUEST"

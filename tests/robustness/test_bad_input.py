"""Bad input (issue 6, item 5): every kind gets its error code (docs/api.md#errors) and changes nothing.

Each refused request is checked twice: the status and ``error.code`` of the envelope, and the row
counts of runs, decisions, messages, open calls, snapshots, chunks, side effects and idempotency keys,
which must not move (a suspended run stays suspended and listed).
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator

from agentrun.core.models import Run, SuspendedToolCall, ToolEffect
from tests.helpers.asgi import communicator as ws
from tests.helpers.runs import EMAIL, ask_run, email_run, of_type, row_counts, start, wait_rested
from tests.helpers.users import reviewer_token

MIB = 1024 * 1024
STREAM = "/api/agents/support-agent/stream"
GENERATE = "/api/agents/support-agent/generate"


def post(api, path: str, body: bytes | str | dict, **extra):
    data = json.dumps(body) if isinstance(body, dict | list) else body
    return api.generic("POST", path, data, content_type="application/json", **extra)


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    return error


def nested(depth: int, leaf: object = 1) -> str:
    return "[" * depth + json.dumps(leaf) + "]" * depth


# --- starting a run: wrong types for each field --------------------------------------------------
START_BODIES = [
    (b"{", "INVALID_REQUEST"),
    (b'{"messages": "hi",}', "INVALID_REQUEST"),
    (b"[1, 2]", "INVALID_REQUEST"),
    (b'"hi"', "INVALID_REQUEST"),
    (b"42", "INVALID_REQUEST"),
    (b'{"messages": Infinity}', "INVALID_REQUEST"),
    (b"\xff\xfe{}", "INVALID_REQUEST"),
    ({}, "INVALID_REQUEST"),
    ({"messages": 5}, "INVALID_REQUEST"),
    ({"messages": None}, "INVALID_REQUEST"),
    ({"messages": {"role": "user", "content": "hi"}}, "INVALID_REQUEST"),
    ({"messages": [1]}, "INVALID_REQUEST"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "INVALID_REQUEST"),
    ({"messages": [{"role": "user", "content": 5}]}, "INVALID_REQUEST"),
    ({"messages": "hi", "memory": ["t1", "u1"]}, "INVALID_REQUEST"),
    ({"messages": "hi", "memory": "t1"}, "INVALID_REQUEST"),
    ({"messages": "hi", "memory": {"thread": 5, "resource": "u1"}}, "INVALID_REQUEST"),
    ({"messages": "hi", "memory": {"thread": "", "resource": "u1"}}, "INVALID_REQUEST"),
    ({"messages": "hi", "memory": {"thread": "t" * 256, "resource": "u1"}}, "INVALID_REQUEST"),
    ({"messages": "hi", "memory": {"thread": "t1", "resource": ["u1"]}}, "INVALID_REQUEST"),
    ({"messages": "hi", "maxSteps": "3"}, "INVALID_REQUEST"),
    ({"messages": "hi", "maxSteps": 1.5}, "INVALID_REQUEST"),
    ({"messages": "hi", "maxSteps": True}, "INVALID_REQUEST"),
    ({"messages": "hi", "maxSteps": 0}, "INVALID_REQUEST"),
    ({"messages": "hi", "maxSteps": 10**30}, "INVALID_REQUEST"),
    (b'{"messages": "hi", "maxSteps": 1e400}', "INVALID_REQUEST"),
    ({"messages": "hi", "requireToolApproval": "true"}, "INVALID_REQUEST"),
    ({"messages": "hi", "requireToolApproval": 1}, "INVALID_REQUEST"),
    ({"messages": "hi", "untilIdle": "yes"}, "INVALID_REQUEST"),
    ({"messages": "hi", "untilIdle": 0}, "INVALID_REQUEST"),
    ({"messages": "hi", "untilIdle": []}, "INVALID_REQUEST"),
    ({"messages": "hi", "untilIdle": {"maxIdleMs": -1}}, "INVALID_REQUEST"),
    ({"messages": "hi", "untilIdle": {"maxIdleMs": "60000"}}, "INVALID_REQUEST"),
    (b'{"messages": "hi", "untilIdle": {"maxIdleMs": 1e400}}', "INVALID_REQUEST"),
    ({"messages": "hi", "metadata": {"k": 1}}, "INVALID_METADATA"),
    ({"messages": "hi", "metadata": {"k": None}}, "INVALID_METADATA"),
    ({"messages": "hi", "metadata": {"k": {"nested": "v"}}}, "INVALID_METADATA"),
    ({"messages": "hi", "metadata": ["k", "v"]}, "INVALID_METADATA"),
    ({"messages": "hi", "metadata": "k=v"}, "INVALID_METADATA"),
    ({"messages": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}, "INVALID_METADATA"),
    ({"messages": "hi", "metadata": {"k" * 65: "v"}}, "INVALID_METADATA"),
    ({"messages": "hi", "metadata": {"k": "v" * 513}}, "INVALID_METADATA"),
    ({"messages": "a\x00b"}, "INVALID_REQUEST"),
    ({"messages": "hi", "metadata": {"k": "\ud800"}}, "INVALID_REQUEST"),
]


@pytest.mark.django_db
@pytest.mark.parametrize("path", [STREAM, GENERATE])
@pytest.mark.parametrize(("body", "code"), START_BODIES, ids=[repr(b)[:60] for b, _ in START_BODIES])
def test_a_bad_start_body_is_400_and_starts_nothing(api, path, body, code):
    email_run()  # something that could be disturbed
    before = row_counts()
    assert_error(post(api, path, body), 400, code)
    assert row_counts() == before


# --- decisions: wrong types, wrong calls ---------------------------------------------------------
def decide(api, run_id: str, kind: str, body, agent: str = "support-agent", **extra):
    return post(api, f"/api/agents/{agent}/runs/{run_id}/{kind}", body, **extra)


def assert_still_waiting(run_id: str, open_calls: int = 1) -> None:
    run = Run.objects.get(pk=run_id)
    assert run.status == Run.Status.SUSPENDED
    assert SuspendedToolCall.objects.filter(run_id=run_id, status=SuspendedToolCall.Status.OPEN).count() == open_calls
    assert not ToolEffect.objects.filter(run_id=run_id).exists()


APPROVE_BODIES = [
    (b"{", 400, "INVALID_REQUEST"),
    (b"[]", 400, "INVALID_REQUEST"),
    (b"null", 400, "INVALID_REQUEST"),
    ({"args": ["ann@example.com", "s", "b"]}, 400, "ARGS_INVALID"),
    ({"args": "to=ann"}, 400, "ARGS_INVALID"),
    ({"args": 5}, 400, "ARGS_INVALID"),
    ({"args": {"to": 5, "subject": "s", "body": "b"}}, 400, "ARGS_INVALID"),
    ({"args": {"to": "a@b.c", "subject": "s"}}, 400, "ARGS_INVALID"),
    ({"args": {**EMAIL, "cc": "x"}}, 400, "ARGS_INVALID"),
    ({"args": {**EMAIL, "to": "x" * 900_000, "extra": 1}}, 400, "ARGS_INVALID"),
    ({"args": {**EMAIL, "body": json.loads(nested(50))}}, 400, "ARGS_INVALID"),
    (b'{"args": {"to": "a", "subject": "s", "body": "b", "n": 1e400}}', 400, "INVALID_REQUEST"),
    ({"toolCallId": 5}, 400, "INVALID_REQUEST"),
    ({"toolCallId": ["call_x"]}, 400, "INVALID_REQUEST"),
    ({"toolCallId": "call_nope"}, 400, "TOOL_CALL_NOT_SUSPENDED"),
    ({"toolCallId": "x" * 10_000}, 400, "TOOL_CALL_NOT_SUSPENDED"),
    ({"reason": 5}, 400, "INVALID_REQUEST"),
    ({"reason": {"why": "no"}}, 400, "INVALID_REQUEST"),
    ({"reason": "a\x00b"}, 400, "INVALID_REQUEST"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("body", "status", "code"), APPROVE_BODIES, ids=[repr(b)[:50] for b, _, _ in APPROVE_BODIES])
def test_a_bad_approval_is_refused_and_the_run_stays_suspended(api, body, status, code):
    run_id = email_run()
    before = row_counts()
    assert_error(decide(api, run_id, "approve", body), status, code)
    assert row_counts() == before
    assert_still_waiting(run_id)


DECLINE_BODIES = [
    ({"reason": 5}, "INVALID_REQUEST"),
    ({"reason": ["no"]}, "INVALID_REQUEST"),
    ({"toolCallId": 5}, "INVALID_REQUEST"),
    ({"toolCallId": {}}, "INVALID_REQUEST"),
    ({"toolCallId": "call_nope"}, "TOOL_CALL_NOT_SUSPENDED"),
    (b"true", "INVALID_REQUEST"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("body", "code"), DECLINE_BODIES, ids=[repr(b)[:50] for b, _ in DECLINE_BODIES])
def test_a_bad_decline_is_refused_and_the_run_stays_suspended(api, body, code):
    run_id = email_run()
    before = row_counts()
    assert_error(decide(api, run_id, "decline", body), 400, code)
    assert row_counts() == before
    assert_still_waiting(run_id)


RESUME_BODIES = [
    ({}, "INVALID_REQUEST"),
    ({"answer": "Paris"}, "INVALID_REQUEST"),  # resumeData missing: the data given at the top level
    ({"resumeData": None}, "RESUME_DATA_INVALID"),
    ({"resumeData": "Paris"}, "RESUME_DATA_INVALID"),
    ({"resumeData": ["Paris"]}, "RESUME_DATA_INVALID"),
    ({"resumeData": {"answer": ""}}, "RESUME_DATA_INVALID"),
    ({"resumeData": {"answer": 5}}, "RESUME_DATA_INVALID"),
    ({"resumeData": {"answer": "Paris"}, "toolCallId": 5}, "INVALID_REQUEST"),
    ({"resumeData": {"answer": "Paris"}, "toolCallId": "call_nope"}, "TOOL_CALL_NOT_SUSPENDED"),
    (b'{"resumeData": {"answer": "P", "x": -1e400}}', "INVALID_REQUEST"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("body", "code"), RESUME_BODIES, ids=[repr(b)[:50] for b, _ in RESUME_BODIES])
def test_a_bad_resume_is_refused_and_the_run_stays_suspended(api, body, code):
    run_id = ask_run()
    before = row_counts()
    assert_error(decide(api, run_id, "resume", body), 400, code)
    assert row_counts() == before
    assert_still_waiting(run_id)


@pytest.mark.django_db
def test_the_wrong_kind_of_decision_is_refused(api):
    email, ask = email_run(), ask_run()
    before = row_counts()
    assert_error(decide(api, email, "resume", {"resumeData": {"answer": "x"}}), 400, "WRONG_DECISION_KIND")
    assert_error(decide(api, ask, "approve", {}), 400, "WRONG_DECISION_KIND")
    assert_error(decide(api, ask, "decline", {}), 400, "WRONG_DECISION_KIND")
    assert row_counts() == before
    assert_still_waiting(email)
    assert_still_waiting(ask)


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["k" * 256, "k" * 10_000, "a\x00b"])
def test_an_overlong_idempotency_key_is_400(api, key):
    run_id = email_run()
    before = row_counts()
    assert_error(decide(api, run_id, "approve", {}, HTTP_IDEMPOTENCY_KEY=key), 400, "INVALID_REQUEST")
    assert row_counts() == before
    assert_still_waiting(run_id)


# --- sizes and depth -----------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["stream", "generate", "approve", "decline", "resume"])
def test_a_body_over_1_mib_is_413_and_changes_nothing(api, kind):
    run_id = email_run()
    path = f"/api/agents/support-agent/{kind}" if kind in ("stream", "generate") else None
    path = path or f"/api/agents/support-agent/runs/{run_id}/{kind}"
    before = row_counts()
    body = json.dumps({"messages": "hi", "args": {**EMAIL, "body": "x" * (MIB + 1)}, "resumeData": {"answer": "x"}})
    assert_error(post(api, path, body), 413, "PAYLOAD_TOO_LARGE")
    assert row_counts() == before
    assert_still_waiting(run_id)


def _chunked_request(path: str, body: bytes, token: str) -> tuple[int, dict]:
    """POST through the real ASGI application, the body in 64 KiB parts and no Content-Length."""
    from agentrun.asgi import application

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 50000),
        "server": ("localhost", 80),
        "headers": [
            (b"host", b"localhost"),
            (b"content-type", b"application/json"),
            (b"transfer-encoding", b"chunked"),
            (b"authorization", f"Token {token}".encode()),
        ],
    }

    async def go() -> tuple[int, dict]:
        comm = ApplicationCommunicator(application, scope)
        step = 64 * 1024
        for i in range(0, len(body), step):
            await comm.send_input({"type": "http.request", "body": body[i : i + step], "more_body": True})
        await comm.send_input({"type": "http.request", "body": b"", "more_body": False})
        start_ = await comm.receive_output(timeout=20)
        parts = []
        while True:
            message = await comm.receive_output(timeout=20)
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        return start_["status"], json.loads(b"".join(parts))

    return async_to_sync(go)()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["generate", "approve"])
def test_a_body_over_1_mib_without_content_length_is_413(reviewer, kind):
    from rest_framework.authtoken.models import Token

    token = Token.objects.create(user=reviewer).key
    run_id = email_run()
    path = (
        "/api/agents/support-agent/generate"
        if kind == "generate"
        else f"/api/agents/support-agent/runs/{run_id}/approve"
    )
    before = row_counts()
    body = json.dumps({"messages": "hi", "args": {**EMAIL, "body": "x" * (2 * MIB)}}).encode()
    status, answer = _chunked_request(path, body, token)
    assert (status, answer["error"]["code"]) == (413, "PAYLOAD_TOO_LARGE")
    # Under the limit, the same route without Content-Length works.
    status, answer = _chunked_request("/api/agents/support-agent/generate", b'{"messages": "hi"}', token)
    assert status == 200 and answer["text"] == "Echo: hi"
    assert row_counts()["Run"] == before["Run"] + 1
    assert_still_waiting(run_id)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body",
    [
        "[" * 100_000,
        "{" * 100_000,
        '{"a":' * 100_000,
        nested(100_000),
        '{"messages": "hi", "metadata": ' + nested(5_000) + "}",
        '{"messages": ' + nested(990, "hi") + "}",
        '{"messages": "hi", "memory": {"thread": ' + nested(990, "t") + "}}",
    ],
    ids=["open-brackets", "open-braces", "open-keys", "closed-100k", "metadata-5k", "messages-990", "memory-990"],
)
def test_deeply_nested_json_is_400_not_a_recursion_error(api, body):
    before = row_counts()
    assert_error(post(api, GENERATE, body), 400, "INVALID_REQUEST")
    assert row_counts() == before


@pytest.mark.django_db
@pytest.mark.parametrize("depth", [101, 990, 5_000])
def test_deeply_nested_args_are_refused_and_the_run_stays_suspended(api, depth):
    run_id = email_run()
    before = row_counts()
    body = '{"args": {"to": "a@b.c", "subject": "s", "body": ' + nested(depth, "b") + "}}"
    assert_error(decide(api, run_id, "approve", body), 400, "INVALID_REQUEST")
    assert row_counts() == before
    assert_still_waiting(run_id)


@pytest.mark.django_db(transaction=True)
def test_huge_valid_args_are_applied_once_and_the_run_completes(api):
    """900 KB of arguments fit under the 1 MiB limit: accepted, stored, executed — not a 500."""
    run_id = email_run()
    big = {**EMAIL, "body": "x" * 900_000}
    response = decide(api, run_id, "approve", {"args": big})
    assert response.status_code == 202, response.content[:300]
    run = wait_rested(run_id)
    assert run.status == Run.Status.COMPLETED
    assert ToolEffect.objects.filter(run_id=run_id).count() == 1
    from agentrun.core.models import Decision

    assert Decision.objects.get(run_id=run_id).edited_args["body"] == big["body"]


# --- dates and query parameters ------------------------------------------------------------------
BAD_DATES = [
    "yesterday",
    "2024-02-30T00:00:00Z",
    "2024-13-01",
    "1e9",
    "9999-12-31T23:59:59-23:59",
    "0001-01-01T00:00:00+23:59",
    "2024-01-01T25:00:00Z",
    " ",
    "2024-01-01T00:00:00+99:00",
]


@pytest.mark.django_db
@pytest.mark.parametrize("value", BAD_DATES)
@pytest.mark.parametrize("param", ["fromDate", "toDate"])
@pytest.mark.parametrize("path", ["/api/agents/support-agent/suspended-runs", "/api/decisions"])
def test_an_invalid_date_is_400_invalid_date(api, path, param, value):
    assert_error(api.get(path, {param: value}), 400, "INVALID_DATE")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({"perPage": "abc", "page": "0"}, "INVALID_PER_PAGE"),
        ({"perPage": "0", "page": "0"}, "INVALID_PER_PAGE"),
        ({"perPage": "1001", "page": "0"}, "INVALID_PER_PAGE"),
        ({"perPage": "9" * 40, "page": "0"}, "INVALID_PER_PAGE"),
        ({"perPage": "10", "page": "-1"}, "INVALID_PAGE"),
        ({"perPage": "10", "page": "x"}, "INVALID_PAGE"),
        ({"perPage": "10", "page": "9" * 40}, "INVALID_PAGE"),
    ],
)
def test_bad_listing_pages_are_400(api, query, code):
    assert_error(api.get("/api/agents/support-agent/suspended-runs", query), 400, code)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query", [{"limit": "x"}, {"limit": "0"}, {"limit": "101"}, {"limit": "9" * 40}, {"order": "sideways"}]
)
@pytest.mark.parametrize("path", ["/api/decisions", "/api/background-tasks", "/api/runs/{run}/steps"])
def test_bad_list_parameters_are_400(api, path, query):
    run_id = email_run()
    assert_error(api.get(path.format(run=run_id), query), 400, "INVALID_REQUEST")


@pytest.mark.django_db
@pytest.mark.parametrize("cursor", ["after", "before"])
@pytest.mark.parametrize("value", ["nope", "x" * 5000, "'; DROP TABLE agentrun_run; --"])
def test_an_unknown_cursor_is_not_a_500(api, cursor, value):
    run_id = email_run()
    for path in ("/api/decisions", "/api/background-tasks", f"/api/runs/{run_id}/steps"):
        response = api.get(path, {cursor: value})
        assert response.status_code in (200, 400, 404), (path, response.status_code)
        if response.status_code != 200:
            assert response.json()["error"]["code"] in ("INVALID_REQUEST", "NOT_FOUND")


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["x", "-1", "1e3", "9" * 40])
def test_a_bad_replay_position_is_400(api, value):
    run_id = email_run()
    assert_error(api.get(f"/api/runs/{run_id}/stream", {"after": value}), 400, "INVALID_REQUEST")
    assert_error(api.get(f"/api/runs/{run_id}/stream", HTTP_LAST_EVENT_ID=value), 400, "INVALID_REQUEST")


# --- unknown ids ---------------------------------------------------------------------------------
@pytest.mark.django_db
def test_unknown_ids_are_404_with_the_contract_code(api):
    run_id = email_run()
    before = row_counts()
    long_id = "r" * 5000
    cases = [
        ("POST", "/api/agents/nobody/stream", {"messages": "hi"}, "AGENT_NOT_FOUND"),
        ("POST", "/api/agents/nobody/generate", {"messages": "hi"}, "AGENT_NOT_FOUND"),
        ("GET", "/api/agents/nobody/suspended-runs", None, "AGENT_NOT_FOUND"),
        ("POST", f"/api/agents/nobody/runs/{run_id}/approve", {}, "AGENT_NOT_FOUND"),
        ("POST", "/api/agents/support-agent/runs/run_nope/approve", {}, "RUN_NOT_FOUND"),
        ("POST", "/api/agents/support-agent/runs/run_nope/decline", {}, "RUN_NOT_FOUND"),
        ("POST", "/api/agents/support-agent/runs/run_nope/resume", {"resumeData": {}}, "RUN_NOT_FOUND"),
        ("POST", f"/api/agents/support-agent/runs/{long_id}/approve", {}, "RUN_NOT_FOUND"),
        # Another agent's run is not found either (docs/runs.md#sub-agents).
        ("POST", f"/api/agents/billing-agent/runs/{run_id}/approve", {}, "RUN_NOT_FOUND"),
        ("POST", f"/api/agents/billing-agent/runs/{run_id}/decline", {}, "RUN_NOT_FOUND"),
        ("GET", "/api/runs/run_nope", None, "RUN_NOT_FOUND"),
        ("GET", f"/api/runs/{long_id}", None, "RUN_NOT_FOUND"),
        ("GET", "/api/runs/run_nope/steps", None, "RUN_NOT_FOUND"),
        ("GET", "/api/runs/run_nope/stream", None, "RUN_NOT_FOUND"),
        ("POST", "/api/runs/run_nope/cancel", None, "RUN_NOT_FOUND"),
        ("GET", f"/api/runs/{run_id}/steps/step_nope", None, "NOT_FOUND"),
        ("GET", "/api/runs/run_nope/steps/step_nope", None, "RUN_NOT_FOUND"),
        ("GET", "/api/threads/thread_nope/messages", None, "NOT_FOUND"),
        ("GET", f"/api/threads/{long_id}/messages", None, "NOT_FOUND"),
        ("POST", "/api/background-tasks/task_nope/cancel", None, "NOT_FOUND"),
        ("POST", f"/api/background-tasks/{long_id}/cancel", None, "NOT_FOUND"),
    ]
    for method, path, body, code in cases:
        response = (
            api.get(path)
            if method == "GET"
            else api.generic(
                "POST", path, json.dumps(body) if body is not None else "", content_type="application/json"
            )
        )
        assert_error(response, 404, code)
    assert row_counts() == before
    assert_still_waiting(run_id)


# --- tool arguments from the model that fail their schema ----------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "args",
    [
        '{"orderId": "x", "amount": -1}',
        '{"orderId": "x", "amount": "ten"}',
        '{"orderId": "x"}',
        '{"orderId": 5, "amount": 1, "currency": "EUR"}',
        '{"orderId": "x", "amount": 1e400}',
        '{"orderId": "x", "amount": ' + "1" * 5000 + "}",
        nested(100_000, {}),
        '["x", 1]',
        '{"orderId": "x", "amount": ',
        '{"orderId": "' + "x" * 200_000 + '", "amount": -1}',
    ],
    ids=["negative", "string", "missing", "extra", "infinite", "huge-int", "deep", "list", "truncated", "huge"],
)
def test_model_arguments_that_fail_the_schema_become_a_tool_error_the_model_sees(args):
    stream, chunks = async_to_sync(start)("billing-agent", f"/tool refund {args}", thread="t-bad-args")
    errors = of_type(chunks, "tool-error")
    assert len(errors) == 1, [c["type"] for c in chunks]
    assert errors[0]["payload"]["toolName"] == "refund"
    assert not of_type(chunks, "tool-call-approval"), "invalid arguments never reach a reviewer"
    assert of_type(chunks, "finish")[-1]["payload"]["finishReason"] == "stop"
    run = Run.objects.get(pk=stream.run_id)
    assert run.status == Run.Status.COMPLETED
    assert not ToolEffect.objects.exists()
    assert not SuspendedToolCall.objects.filter(run_id=run.id).exists()
    # The model saw the error (its answer names it), and said so.
    text = "".join(c["payload"]["text"] for c in of_type(chunks, "text-delta"))
    assert text.startswith("refund:"), text


# --- websockets: malformed frames ----------------------------------------------------------------
BAD_FRAMES = [  # (ASGI message key, frame)
    ("bytes", b"\x00\x01binary"),
    ("bytes", b'{"action": "stream", "messages": "hi"}'),
    ("text", "not json"),
    ("text", ""),
    ("text", "{"),
    ("text", "NaN"),
    ("text", '{"action": "stream", "messages": Infinity}'),
    ("text", "[1, 2, 3]"),
    ("text", '"stream"'),
    ("text", "null"),
    ("text", "42"),
    ("text", "[" * 100_000),
    ("text", nested(100_000)),
    ("text", '{"action": "stream", "messages": ' + nested(990, "hi") + "}"),
    ("text", '{"action": "fly"}'),
    ("text", '{"action": 5}'),
    ("text", "{}"),
    ("text", '{"action": "approve"}'),
    ("text", '{"action": "approve", "runId": 5}'),
    ("text", '{"action": "resume", "runId": "run_nope", "resumeData": {}}'),
    ("text", '{"action": "stream"}'),
    ("text", '{"action": "stream", "messages": 5}'),
    ("text", '{"action": "stream", "messages": "hi", "maxSteps": "3"}'),
    ("text", '{"action": "stream", "messages": "hi", "metadata": {"k": 1}}'),
    ("text", '{"action": "stream", "messages": "a\\u0000b"}'),
    ("text", '{"action": "stream", "messages": "hi", "memory": {"thread": "\\ud800"}}'),
    ("text", '{"action": "stream", "messages": "hi", "untilIdle": {"maxIdleMs": 1e400}}'),
    ("text", json.dumps({"action": "stream", "messages": "x" * (MIB + 1)})),
]
FRAME_IDS = [f"{kind}:{frame[:40]!r}" for kind, frame in BAD_FRAMES]


async def _send(comm, kind: str, frame) -> None:
    # send_input, not send_to: send_to drops an empty frame.
    await comm.send_input({"type": "websocket.receive", kind: frame})


async def _assert_error_then_usable(comm, run_id: str | None = None) -> str:
    answer = await comm.receive_json_from(timeout=10)
    assert answer["type"] == "error", answer
    code = answer["error"]["code"]
    from agentrun.core.errors import HTTP_STATUS

    assert code in HTTP_STATUS and 400 <= HTTP_STATUS[code] < 500
    assert await comm.receive_nothing(timeout=0.05), "one frame in, one error out; the socket stays open"
    return code


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("kind", "frame"), BAD_FRAMES, ids=FRAME_IDS)
async def test_a_malformed_frame_on_the_agent_socket_gets_an_error_frame_and_the_socket_stays_usable(kind, frame):
    from asgiref.sync import sync_to_async

    token = await reviewer_token()
    run_id = await sync_to_async(email_run)()
    before = await sync_to_async(row_counts)()
    comm = ws("/ws/agents/support-agent/", token)
    assert (await comm.connect())[0]
    await _send(comm, kind, frame)
    if frame and len(frame) > MIB:
        # Over 1 MiB: the error frame, then a clean close 1009 (real daphne: tests/system/test_production.py).
        answer = await comm.receive_json_from(timeout=10)
        assert answer["error"]["code"] == "PAYLOAD_TOO_LARGE"
        assert (await comm.receive_output(timeout=5)) == {"type": "websocket.close", "code": 1009}
        assert await sync_to_async(row_counts)() == before
        return
    await _assert_error_then_usable(comm)
    assert await sync_to_async(row_counts)() == before
    await sync_to_async(assert_still_waiting)(run_id)
    # Still usable: a good frame streams a run to its finish.
    await comm.send_json_to(
        {"action": "stream", "messages": "still here", "memory": {"thread": "ws-t", "resource": "u"}}
    )
    frames = []
    while not frames or frames[-1]["type"] != "finish":
        frames.append(await comm.receive_json_from(timeout=10))
    assert "".join(f["payload"]["text"] for f in frames if f["type"] == "text-delta") == "Echo: still here"
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("kind", "frame"), BAD_FRAMES[:14] + BAD_FRAMES[-1:], ids=FRAME_IDS[:14] + FRAME_IDS[-1:])
async def test_any_frame_on_the_run_socket_gets_an_error_frame_and_the_socket_stays_open(kind, frame):
    from asgiref.sync import sync_to_async

    token = await reviewer_token()
    run_id = await sync_to_async(email_run)()
    comm = ws(f"/ws/runs/{run_id}/", token)
    assert (await comm.connect())[0]
    replay = []
    while not replay or replay[-1]["type"] != "finish":
        replay.append(await comm.receive_json_from(timeout=10))
    await _send(comm, kind, frame)
    await _assert_error_then_usable(comm)
    # Still subscribed: the approval's chunks arrive and the socket closes normally once the run is final.
    from agentrun.engine.agents import get_agent

    await (await get_agent("support-agent").approve_tool_call(run_id=run_id)).collect()
    live = []
    while not live or live[-1]["type"] != "finish":
        live.append(await comm.receive_json_from(timeout=10))
    assert live[0]["seq"] == replay[-1]["seq"] + 1
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 1000}


@pytest.mark.django_db(transaction=True)
async def test_a_decision_frame_with_bad_fields_decides_nothing():
    from asgiref.sync import sync_to_async

    token = await reviewer_token()
    run_id = await sync_to_async(email_run)()
    ask_id = await sync_to_async(ask_run)()
    before = await sync_to_async(row_counts)()
    comm = ws("/ws/agents/support-agent/", token)
    assert (await comm.connect())[0]
    frames = [
        ({"action": "approve", "runId": run_id, "args": ["x"]}, "ARGS_INVALID"),
        ({"action": "approve", "runId": run_id, "args": {"to": 1}}, "ARGS_INVALID"),
        ({"action": "approve", "runId": run_id, "toolCallId": 5}, "INVALID_REQUEST"),
        ({"action": "decline", "runId": run_id, "reason": 5}, "INVALID_REQUEST"),
        ({"action": "resume", "runId": run_id, "resumeData": {"answer": "x"}}, "WRONG_DECISION_KIND"),
        ({"action": "resume", "runId": ask_id}, "INVALID_REQUEST"),
        ({"action": "resume", "runId": ask_id, "resumeData": {"answer": ""}}, "RESUME_DATA_INVALID"),
        ({"action": "approve", "runId": ask_id}, "WRONG_DECISION_KIND"),
        ({"action": "approve", "runId": "run_nope"}, "RUN_NOT_FOUND"),
        ({"action": "approve", "runId": run_id, "toolCallId": "call_nope"}, "TOOL_CALL_NOT_SUSPENDED"),
    ]
    for frame, code in frames:
        await comm.send_json_to(frame)
        assert await _assert_error_then_usable(comm) == code, frame
    assert await sync_to_async(row_counts)() == before
    await sync_to_async(assert_still_waiting)(run_id)
    await sync_to_async(assert_still_waiting)(ask_id)
    await comm.disconnect()


# --- the Python API refuses the same input with the same codes ----------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"messages": "a\x00b"}, "INVALID_REQUEST"),
        ({"messages": [{"role": "user", "content": "\ud800"}]}, "INVALID_REQUEST"),
        ({"messages": "hi", "memory": {"thread": "t\x00", "resource": "u"}}, "INVALID_REQUEST"),
        ({"messages": "hi", "metadata": {"k": "v\x00"}}, "INVALID_METADATA"),
        ({"messages": "hi", "until_idle": {"max_idle_ms": float("inf")}}, "INVALID_REQUEST"),
    ],
)
def test_the_python_api_refuses_what_cannot_be_stored(kwargs, code):
    from agentrun import AgentRunError, get_agent

    before = row_counts()
    with pytest.raises(AgentRunError) as err:
        async_to_sync(get_agent("support-agent").stream)(**kwargs)
    assert err.value.code == code
    assert row_counts() == before


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("decision", "code"),
    [
        ({"args": {**EMAIL, "body": float("nan")}}, "ARGS_INVALID"),
        ({"args": '{"to": "a", "subject": "s", "body": ' + nested(100_000, "b") + "}"}, "ARGS_INVALID"),
        ({"args": '{"to": "a", "subject": "s", "body": "b", "n": ' + "1" * 5000 + "}"}, "ARGS_INVALID"),
        ({"args": {**EMAIL, "body": "b\x00"}}, "ARGS_INVALID"),
    ],
)
def test_python_api_edited_args_that_cannot_be_stored_are_args_invalid(decision, code):
    from agentrun import AgentRunError, get_agent

    run_id = email_run()
    before = row_counts()
    with pytest.raises(AgentRunError) as err:
        async_to_sync(get_agent("support-agent").approve_tool_call)(run_id=run_id, **decision)
    assert err.value.code == code
    assert row_counts() == before
    assert_still_waiting(run_id)


@pytest.mark.django_db(transaction=True)
def test_a_reason_that_cannot_be_stored_is_invalid_request():
    from agentrun import AgentRunError, get_agent

    run_id = email_run()
    before = row_counts()
    with pytest.raises(AgentRunError) as err:
        async_to_sync(get_agent("support-agent").decline_tool_call)(run_id=run_id, reason="a\x00b")
    assert err.value.code == "INVALID_REQUEST"
    assert row_counts() == before

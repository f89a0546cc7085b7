"""GET /api/agents/{agentId}/suspended-runs: the listing contract through the real URL routing."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.helpers.runs import email_run, refund_run, set_created_at

# Each test runs in a transaction rolled back at its end: nothing here needs a real commit.
pytestmark = pytest.mark.django_db

URL = "/api/agents/support-agent/suspended-runs"
T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


@pytest.fixture
def runs() -> dict[str, str]:
    """Four waiting runs on two threads / two resources, a day apart (oldest first), plus a billing one."""
    made = {
        "a": email_run(thread="t-1", resource="u-1"),
        "b": email_run(thread="t-1", resource="u-2"),
        "c": email_run(thread="t-2", resource="u-1"),
        "d": email_run(thread="t-2", resource="u-2"),
    }
    for i, run_id in enumerate(made.values()):
        async_to_sync(set_created_at)(run_id, T0 + timedelta(days=i))
    made["billing"] = refund_run(thread="t-1", resource="u-1")
    return made


def ids(response) -> list[str]:
    return [r["runId"] for r in response.json()["runs"]]


def test_lists_own_runs_newest_first_with_the_contract_shape(api, runs):
    response = api.get(URL)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"runs", "total"}
    assert body["total"] == 4
    assert ids(response) == [runs["d"], runs["c"], runs["b"], runs["a"]]  # the billing run is not listed
    run = body["runs"][0]
    assert set(run) == {
        "runId",
        "agentId",
        "status",
        "threadId",
        "resourceId",
        "createdAt",
        "suspendedAt",
        "startedBy",
        "toolCalls",
    }
    assert run["status"] == "suspended" and run["agentId"] == "support-agent"
    assert run["createdAt"] == "2026-01-13T12:00:00.000000Z"
    [call] = run["toolCalls"]
    assert set(call) == {
        "toolCallId",
        "toolName",
        "args",
        "requiresApproval",
        "suspendPayload",
        "resumeSchema",
        "risk",
        "argsFingerprint",
        "approvals",
    }
    assert call["toolName"] == "send-email" and call["requiresApproval"] is True
    assert call["approvals"] == {"required": 1, "given": []}
    # docs/api.md#the-listing: the demo's send-email is a medium-risk tool; the fingerprint is of the listed args.
    assert call["risk"] == "medium"
    canonical = json.dumps(call["args"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert call["argsFingerprint"] == hashlib.sha256(canonical.encode()).hexdigest()


def test_trailing_slash_is_the_same_endpoint(api, runs):
    assert ids(api.get(URL + "/")) == ids(api.get(URL))


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"threadId": "t-1"}, ["b", "a"]),
        ({"resourceId": "u-1"}, ["c", "a"]),
        ({"threadId": "t-2", "resourceId": "u-2"}, ["d"]),
        ({"fromDate": "2026-01-11T12:00:00Z"}, ["d", "c", "b"]),  # inclusive
        ({"toDate": "2026-01-11T12:00:00.000000Z"}, ["b", "a"]),  # inclusive
        ({"fromDate": "2026-01-11T00:00:00+00:00", "toDate": "2026-01-12T23:59:59Z"}, ["c", "b"]),
        ({"threadId": "nope"}, []),
    ],
)
def test_each_filter(api, runs, params, expected):
    response = api.get(URL, params)
    assert response.status_code == 200
    assert ids(response) == [runs[k] for k in expected]
    assert response.json()["total"] == len(expected)


def test_a_returned_created_at_used_as_to_date_still_matches(api, runs):
    created = api.get(URL).json()["runs"][1]["createdAt"]
    assert ids(api.get(URL, {"toDate": created}))[0] == runs["c"]
    assert ids(api.get(URL, {"fromDate": created, "toDate": created})) == [runs["c"]]


def test_pagination_applies_only_when_both_per_page_and_page_are_given(api, runs):
    newest_first = [runs[k] for k in "dcba"]
    assert ids(api.get(URL, {"perPage": 3, "page": 0})) == newest_first[:3]
    second = api.get(URL, {"perPage": 3, "page": 1})
    assert ids(second) == newest_first[3:]
    assert second.json()["total"] == 4  # counted before pagination
    assert ids(api.get(URL, {"perPage": 3, "page": 2})) == []
    assert ids(api.get(URL, {"perPage": 1})) == newest_first  # perPage alone: no paging
    assert ids(api.get(URL, {"page": 1})) == newest_first  # page alone: no paging
    assert ids(api.get(URL, {"perPage": 1000, "page": 0})) == newest_first


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"perPage": 0}, "INVALID_PER_PAGE"),
        ({"perPage": 1001}, "INVALID_PER_PAGE"),
        ({"perPage": "ten"}, "INVALID_PER_PAGE"),
        ({"perPage": -1, "page": 0}, "INVALID_PER_PAGE"),
        ({"page": -1}, "INVALID_PAGE"),
        ({"perPage": 5, "page": "x"}, "INVALID_PAGE"),
        ({"fromDate": "yesterday"}, "INVALID_DATE"),
        ({"toDate": "2026-13-40"}, "INVALID_DATE"),
        ({"fromDate": "0001-01-01T00:00:00+23:00"}, "INVALID_DATE"),  # before year 1 in UTC
    ],
)
def test_invalid_parameters(api, db, params, code):
    response = api.get(URL, params)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["message"]


def test_offsets_postgresql_refuses_are_normalised_not_500(api, runs):
    response = api.get(URL, {"fromDate": "0214-10-21T03:32:52-22:10", "toDate": "2999-01-01T00:00:00+23:59"})
    assert response.status_code == 200 and response.json()["total"] == 4
    response = api.get("/api/decisions", {"fromDate": "0214-10-21T03:32:52-22:10"})
    assert response.status_code == 200


def test_unknown_agent_is_404(api):
    response = api.get("/api/agents/nobody/suspended-runs")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "AGENT_NOT_FOUND"


def test_viewers_may_list(viewer_api, runs):
    assert viewer_api.get(URL).json()["total"] == 4


def test_query_count_does_not_grow_with_the_page_size(api):
    for i in range(12):
        email_run(thread=f"q-{i % 3}", resource="u-q")
    api.get("/api/agents/")  # the token and permissions are read once, then kept (docs/security.md)
    counts = {}
    for per_page in (1, 50):
        with CaptureQueriesContext(connection) as queries:
            response = api.get(URL, {"perPage": per_page, "page": 0})
        assert response.status_code == 200
        assert len(response.json()["runs"]) == min(per_page, 12)
        counts[per_page] = len(queries)
    assert counts[1] == counts[50], counts

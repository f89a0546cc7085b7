"""Unpaged listings are streamed batch by batch, and read exactly like the paged answer."""

from __future__ import annotations

import json

import pytest

from agentrun.core import selectors
from tests.helpers.runs import SUB_AGENT_REFUND, ask_run, email_run, start_run, suspend, two_call_run
from tests.helpers.users import make_user, token_client

# Each test runs in a transaction rolled back at its end: nothing here needs a real commit.
pytestmark = pytest.mark.django_db

URL = "/api/agents/support-agent/suspended-runs"


@pytest.fixture
def batches_of_two(monkeypatch):
    monkeypatch.setattr(selectors, "STREAM_BATCH", 2)


def body_of(response) -> bytes:
    return b"".join(response) if response.streaming else response.content  # Django consumes it in a loop of its own


@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")
def test_an_unpaged_listing_streams_the_paged_answer_batch_by_batch(api, batches_of_two):
    for i in range(5):
        email_run(thread=f"t-{i % 2}", resource="u-1")
    paged = api.get(URL, {"perPage": 1000, "page": 0})
    assert paged.status_code == 200 and len(paged.json()["runs"]) == 5

    unpaged = api.get(URL)
    assert unpaged.status_code == 200 and unpaged.streaming  # five runs, batches of two: streamed
    assert unpaged["Content-Type"] == "application/json"
    body = body_of(unpaged)
    assert json.loads(body) == paged.json()  # the same JSON (PostgreSQL spaces nested values its own way)

    by_thread = api.get(URL, {"threadId": "t-0", "perPage": "7"})  # perPage alone does not page
    assert by_thread.streaming
    expected = [r for r in paged.json()["runs"] if r["threadId"] == "t-0"]
    assert json.loads(body_of(by_thread)) == {"runs": expected, "total": 3}


@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")
def test_an_unpaged_listing_that_fits_in_one_batch_is_a_plain_answer(api, batches_of_two):
    run_id = email_run(thread="t-1")
    response = api.get(URL)
    assert not response.streaming
    assert [r["runId"] for r in response.json()["runs"]] == [run_id] and response.json()["total"] == 1
    empty = api.get(URL, {"threadId": "nobody"})
    assert empty.json() == {"runs": [], "total": 0}
    assert api.get(URL, {"perPage": "0"}).json()["error"]["code"] == "INVALID_PER_PAGE"  # checked all the same
    assert api.get(URL, {"page": "-1"}).json()["error"]["code"] == "INVALID_PAGE"
    assert api.get(URL, {"fromDate": "soon"}).json()["error"]["code"] == "INVALID_DATE"


@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")
def test_unpaged_items_are_the_paged_items_for_every_kind_of_call(api, batches_of_two):
    """Unpaged items are built in SQL on PostgreSQL (in Python for calls SQL leaves out: a float in the
    arguments, a sub-agent's call, one needing two approvals) and in Python on SQLite: each the paged item."""
    email_run(thread="t-plain", resource="u-1")
    email_run(
        thread="t-odd",
        resource="u-2",
        args={"to": "zoë@example.com", "subject": 'Quote "\\ \u2028', "body": "a\tb\nc\u0001 😀"},
    )
    ask_run(thread="t-ask")
    two_call_run(thread="t-two")
    suspend("refund", {"orderId": "o-1", "amount": 5}, thread="t-int", agent_id="billing-agent")
    suspend("refund", {"orderId": "o-2", "amount": 5.5}, thread="t-float", agent_id="billing-agent")
    suspend("pay-invoice", {"invoiceId": "i-1", "amount": 10}, thread="t-quorum", agent_id="billing-agent")
    start_run(SUB_AGENT_REFUND, thread="t-sub", agent_id="support-supervisor")
    starter = token_client(make_user("stan"))
    body = {"messages": '/tool send-email {"to": "x@y.z", "subject": "s", "body": "b"}', "memory": {"thread": "t-rest"}}
    assert starter.post("/api/agents/support-agent/generate", body, format="json").json()["status"] == "suspended"

    paged = api.get("/api/suspended-runs", {"perPage": 1000, "page": 0}).json()
    assert paged["total"] == 10 and {r["startedBy"] for r in paged["runs"]} == {None, "stan"}
    unpaged = api.get("/api/suspended-runs")
    assert unpaged.streaming
    assert json.loads(body_of(unpaged)) == paged
    # Pages are built in SQL on PostgreSQL too: each the listing as Python builds it, page by page.
    agents = ["billing-agent", "support-agent", "support-supervisor"]
    built = selectors.list_suspended_runs(agent_ids=agents, per_page=1000, page=0).to_dict()
    assert json.loads(json.dumps(built)) == paged
    for page in range(4):
        answer = api.get("/api/suspended-runs", {"perPage": 3, "page": page}).json()
        assert answer == {"runs": paged["runs"][3 * page : 3 * page + 3], "total": 10}

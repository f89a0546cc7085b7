"""GET /api/suspended-runs: the listing contract across every agent the caller may see (docs/api.md#across-agents).

Runs on SQLite and, with DATABASE_URL, on PostgreSQL: the same assertions on both.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from agentrun import Agent, tool
from agentrun.core import selectors
from tests.helpers.runs import email_run, refund_run, set_created_at, suspended_email_run
from tests.helpers.users import make_user, token_client

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/suspended-runs"
T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
ODD = ["a/b", "with space", "100%", "#hash", "ünï-çødé ✓", "a/../b?x=1&y=%2F"]


@pytest.fixture
def runs() -> dict[str, str]:
    """Support runs on two threads / resources and billing runs, a day apart in this order (oldest first)."""
    made = {
        "s1": email_run(thread="t-1", resource="u-1"),
        "b1": refund_run(thread="t-1", resource="u-2"),
        "s2": email_run(thread="t-2", resource="u-1"),
        "b2": refund_run(thread="t-2", resource="u-1"),
        "s3": email_run(thread="t-1", resource="u-2"),
    }
    for i, run_id in enumerate(made.values()):
        async_to_sync(set_created_at)(run_id, T0 + timedelta(days=i))
    return made


def ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [r["runId"] for r in response.json()["runs"]]


def body_of(response) -> bytes:
    return b"".join(response) if response.streaming else response.content


def test_lists_every_agents_runs_newest_first_in_the_per_agent_shape(api, runs):
    response = api.get(URL)
    body = response.json()
    assert ids(response) == [runs[k] for k in ("s3", "b2", "s2", "b1", "s1")]
    assert body["total"] == 5 and set(body) == {"runs", "total"}
    by_agent = {r["runId"]: r["agentId"] for r in body["runs"]}
    assert by_agent[runs["b1"]] == "billing-agent" and by_agent[runs["s1"]] == "support-agent"
    # Each item is exactly the per-agent listing's item.
    for agent_id in ("support-agent", "billing-agent"):
        own = api.get(f"/api/agents/{agent_id}/suspended-runs").json()["runs"]
        assert own == [r for r in body["runs"] if r["agentId"] == agent_id]
    assert api.get(URL + "/").json() == body  # with the trailing slash too


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"threadId": "t-1"}, ["s3", "b1", "s1"]),
        ({"resourceId": "u-1"}, ["b2", "s2", "s1"]),
        ({"threadId": "t-1", "resourceId": "u-2"}, ["s3", "b1"]),
        ({"fromDate": "2026-01-12T12:00:00Z"}, ["s3", "b2", "s2"]),  # inclusive
        ({"toDate": "2026-01-11T12:00:00.000000Z"}, ["b1", "s1"]),  # inclusive
        ({"fromDate": "2026-01-11T00:00:00+00:00", "toDate": "2026-01-13T23:59:59Z", "threadId": "t-2"}, ["b2", "s2"]),
        ({"agentId": "billing-agent"}, ["b2", "b1"]),
        ({"agentId": "billing-agent", "resourceId": "u-2"}, ["b1"]),
        ({"threadId": "nope"}, []),
    ],
)
def test_each_filter_and_its_total(api, runs, params, expected):
    response = api.get(URL, params)
    assert ids(response) == [runs[k] for k in expected]
    assert response.json()["total"] == len(expected)


def test_paging_and_total_as_on_the_per_agent_route(api, runs):
    newest_first = [runs[k] for k in ("s3", "b2", "s2", "b1", "s1")]
    assert ids(api.get(URL, {"perPage": 2, "page": 0})) == newest_first[:2]
    second = api.get(URL, {"perPage": 2, "page": 1})
    assert ids(second) == newest_first[2:4] and second.json()["total"] == 5  # counted before paging
    assert ids(api.get(URL, {"perPage": 2, "page": 2})) == newest_first[4:]
    assert ids(api.get(URL, {"perPage": 2, "page": 3})) == []
    assert ids(api.get(URL, {"perPage": 2})) == newest_first  # perPage alone: no paging
    assert ids(api.get(URL, {"page": 1})) == newest_first


def test_agent_id_answers_exactly_the_per_agent_route(api, runs):
    for params in ({}, {"threadId": "t-1"}, {"perPage": 1, "page": 1}, {"fromDate": "2026-01-11T12:00:00Z"}):
        across = api.get(URL, {"agentId": "support-agent", **params})
        own = api.get("/api/agents/support-agent/suspended-runs", params)
        assert across.status_code == 200 and across.content == own.content, params


def test_equal_creation_times_order_by_run_id_descending(api, runs):
    for run_id in runs.values():
        async_to_sync(set_created_at)(run_id, T0)
    assert ids(api.get(URL)) == sorted(runs.values(), reverse=True)
    assert ids(api.get(URL, {"perPage": 2, "page": 1})) == sorted(runs.values(), reverse=True)[2:4]


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"perPage": 0}, "INVALID_PER_PAGE"),
        ({"perPage": 1001, "page": 0}, "INVALID_PER_PAGE"),
        ({"perPage": 5, "page": "x"}, "INVALID_PAGE"),
        ({"page": -1}, "INVALID_PAGE"),
        ({"fromDate": "yesterday"}, "INVALID_DATE"),
        ({"toDate": "2026-13-40"}, "INVALID_DATE"),
    ],
)
def test_invalid_parameters_get_the_per_agent_errors(api, db, params, code):
    response = api.get(URL, params)
    assert response.status_code == 400 and response.json()["error"]["code"] == code


def test_anonymous_is_401_and_someone_who_may_view_nothing_is_403(db, runs):
    anonymous = APIClient().get(URL)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "NOT_AUTHENTICATED"
    nobody = token_client(make_user("nobody", group=None)).get(URL)
    assert nobody.status_code == 403 and nobody.json()["error"]["code"] == "PERMISSION_DENIED"
    bad_token = APIClient(HTTP_AUTHORIZATION="Token not-a-token").get(URL)
    assert bad_token.status_code == 401


def test_only_agents_the_caller_may_view_are_listed(settings, api, viewer_api, runs, reviewer):
    settings.AGENTRUN_AGENT_REVIEWERS = {"billing-agent": ["Billing reviewers"]}
    support_only = [runs[k] for k in ("s3", "s2", "s1")]
    assert ids(api.get(URL)) == support_only and api.get(URL).json()["total"] == 3
    assert ids(api.get(URL, {"perPage": 2, "page": 1})) == support_only[2:]
    assert ids(viewer_api.get(URL)) == support_only  # viewers may list too
    for client in (api, viewer_api):
        hidden = client.get(URL, {"agentId": "billing-agent"})
        assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "AGENT_NOT_FOUND"
    # A member of the agent's group sees it again.
    reviewer.groups.add(Group.objects.get_or_create(name="Billing reviewers")[0])
    assert len(ids(api.get(URL))) == 5


def test_someone_every_agent_is_hidden_from_is_403(settings, api, runs):
    from agentrun.engine.agents import all_agents

    settings.AGENTRUN_AGENT_REVIEWERS = {agent.id: ["Nobody"] for agent in all_agents()}
    response = api.get(URL)
    assert response.status_code == 403 and response.json()["error"]["code"] == "PERMISSION_DENIED"
    superuser = make_user("root", group=None)
    superuser.is_superuser = True
    superuser.save()
    assert len(ids(token_client(superuser).get(URL))) == 5  # superusers see every agent


def test_an_unknown_agent_id_is_404(api, db):
    for agent_id in ("nobody", *ODD):
        response = api.get(URL, {"agentId": agent_id})
        assert response.status_code == 404 and response.json()["error"]["code"] == "AGENT_NOT_FOUND", agent_id


def test_odd_thread_resource_and_agent_ids(api, db):
    @tool(id="send-email", requires_approval=True)
    def send_email(to: str, subject: str, body: str) -> dict:
        return {"sent": True}

    made = {}
    for i, odd in enumerate(ODD):
        Agent(id=f"agent {odd}", tools=[send_email], model="directive")
        made[odd] = async_to_sync(suspended_email_run)(thread=f"thread {odd}", resource=odd, agent_id=f"agent {odd}")
        async_to_sync(set_created_at)(made[odd], T0 + timedelta(hours=i))
    assert ids(api.get(URL)) == [made[odd] for odd in reversed(ODD)]
    for odd in ODD:
        for params in ({"threadId": f"thread {odd}"}, {"resourceId": odd}, {"agentId": f"agent {odd}"}):
            response = api.get(URL, params)
            assert ids(response) == [made[odd]] and response.json()["total"] == 1, params
            [run] = response.json()["runs"]
            assert (run["agentId"], run["threadId"], run["resourceId"]) == (f"agent {odd}", f"thread {odd}", odd)
        # Percent-encoded by hand, as a client building the query string would.
        raw = api.get(f"{URL}?agentId={quote(f'agent {odd}', safe='')}&perPage=10&page=0")
        assert ids(raw) == [made[odd]]
        # In the path of the per-agent routes, "/" as %2F (decoded before routing, as servers do).
        agent_path = f"/api/agents/{quote(f'agent {odd}', safe='')}"
        assert ids(api.get(f"{agent_path}/suspended-runs")) == [made[odd]], agent_path
        assert ids(api.get(f"{agent_path}/suspended-runs/", {"threadId": f"thread {odd}"})) == [made[odd]]
    for odd in ODD:
        agent_path = f"/api/agents/{quote(f'agent {odd}', safe='')}"
        response = api.post(f"{agent_path}/runs/{made[odd]}/decline", {"reason": "no"}, format="json")
        assert response.status_code == 202, (odd, response.content)
        assert ids(api.get(f"{agent_path}/suspended-runs")) == []


def test_query_count_does_not_grow_with_the_page_size_or_the_agents(api, db):
    for i in range(6):
        email_run(thread=f"q-{i % 3}")
        refund_run(thread=f"q-{i % 3}")
    api.get("/api/agents/")  # the token and permissions are read once, then kept (docs/security.md)
    counts = {}
    for per_page in (1, 50):
        with CaptureQueriesContext(connection) as queries:
            response = api.get(URL, {"perPage": per_page, "page": 0})
        assert len(ids(response)) == min(per_page, 12) and response.json()["total"] == 12
        counts[per_page] = len(queries)
    assert counts[1] == counts[50], counts


@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")
def test_an_unpaged_listing_across_agents_streams_the_paged_answer(api, runs, monkeypatch):
    monkeypatch.setattr(selectors, "STREAM_BATCH", 2)
    paged = api.get(URL, {"perPage": 1000, "page": 0})
    unpaged = api.get(URL)
    assert unpaged.streaming
    body = body_of(unpaged)
    assert json.loads(body) == paged.json()  # the same JSON (PostgreSQL spaces nested values its own way)


def test_expired_runs_not_swept_yet_are_neither_listed_nor_counted(api, runs):
    from django.utils import timezone

    from agentrun.core.models import Snapshot

    Snapshot.objects.filter(run_id__in=[runs["s1"], runs["b2"]]).update(expires_at=timezone.now() - timedelta(1))
    Snapshot.objects.filter(run_id=runs["b1"]).update(expires_at=timezone.now() + timedelta(1))
    expected = [runs[k] for k in ("s3", "s2", "b1")]
    for params in ({}, {"perPage": 2, "page": 0}):
        response = api.get(URL, params)
        assert response.json()["total"] == 3 and ids(response) == expected[: params.get("perPage", 3)]
    dated = api.get(URL, {"fromDate": "2026-01-01T00:00:00Z", "perPage": 10, "page": 0})
    assert dated.json()["total"] == 3 and ids(dated) == expected
    by_thread = api.get(URL, {"threadId": "t-2", "perPage": 10, "page": 0})
    assert by_thread.json()["total"] == 1 and ids(by_thread) == [runs["s2"]]


def test_a_reader_scoped_to_one_agent_never_sees_another_s_runs_whatever_the_filters(settings, db):
    """Two agents whose runs share every thread, resource and date: only the reader's scope tells them
    apart. Two readers, each kept out of the other's agent, ask every combination of filters, with and
    without naming their agent (on PostgreSQL each shape's SQL is compiled once, the scope a parameter of it): each sees
    exactly their agent's runs, as the listing built without that SQL shows them."""

    @tool(id="send-email", requires_approval=True)
    def send_email(to: str, subject: str, body: str) -> dict:
        return {"sent": True}

    one, two = "agent/one ü✓", "agent two %#'\""
    thread, resource = "thread a/b 100% #x 'q' \"dq\" ü✓", "user/ü 50%#'\""
    for agent in (one, two):
        Agent(id=agent, tools=[send_email], model="directive")
    made: dict[str, list[str]] = {one: [], two: []}
    for i in range(6):
        for agent in (one, two):
            run_id = async_to_sync(suspended_email_run)(
                thread=thread if i % 2 else f"other {i}", resource=resource if i % 3 else "u", agent_id=agent
            )
            async_to_sync(set_created_at)(run_id, T0 + timedelta(minutes=90 * i))
            made[agent].append(run_id)
    settings.AGENTRUN_AGENT_REVIEWERS = {one: ["Group one"], two: ["Group two"]}
    readers = {}
    for agent, group in ((one, "Group one"), (two, "Group two")):
        reader = make_user(f"reader of {group}")
        reader.groups.add(Group.objects.get_or_create(name=group)[0])
        readers[agent] = token_client(reader)
    filters = {
        "threadId": thread,
        "resourceId": resource,
        "fromDate": (T0 + timedelta(minutes=30)).isoformat(),
        "toDate": (T0 + timedelta(minutes=400, seconds=7)).isoformat(),
    }
    for present in range(16):
        params = {name: value for bit, (name, value) in enumerate(filters.items()) if present >> bit & 1}
        for agent, client in readers.items():
            expected = selectors.list_suspended_runs(
                agent_id=agent,
                thread_id=params.get("threadId"),
                resource_id=params.get("resourceId"),
                from_date=params.get("fromDate"),
                to_date=params.get("toDate"),
                per_page=4,
                page=0,
            ).to_dict()
            assert expected["total"] and {r["agentId"] for r in expected["runs"]} == {agent}, params
            for extra in ({}, {"agentId": agent}):  # every agent the reader sees; theirs alone
                answer = client.get(URL, {**params, **extra, "perPage": 4, "page": 0})
                assert answer.status_code == 200, (extra, params, answer.content)
                assert answer.json() == json.loads(json.dumps(expected)), (extra, params)
            other = two if agent == one else one
            hidden = client.get(URL, {**params, "agentId": other, "perPage": 4, "page": 0})
            assert hidden.status_code == 404, params

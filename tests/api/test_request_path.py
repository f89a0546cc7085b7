"""What every REST request pays before the view: one query for the token, one for the permissions (none
once the process knows them: tests/security/test_cached_identities.py), one Redis round trip."""

from __future__ import annotations

import threading

import pytest
import redis
from django.contrib.auth.models import Permission
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.helpers.asgi import AsgiClient
from tests.helpers.runs import email_run
from tests.helpers.users import make_user, reviewer_token, token_client

# Each test runs in a transaction rolled back at its end: nothing here needs a real commit.
pytestmark = pytest.mark.django_db

URL = "/api/agents/support-agent/suspended-runs"


def test_a_request_reads_the_token_once_and_the_permissions_once(api):
    email_run(thread="t-1")
    with CaptureQueriesContext(connection) as ctx:
        response = api.get(URL)
    assert response.status_code == 200
    sql = [q["sql"] for q in ctx.captured_queries]
    assert sum("authtoken_token" in q for q in sql) == 1
    assert sum("auth_permission" in q for q in sql) == 1  # the person's own and their groups' together


def test_a_page_of_the_listing_is_one_query_on_postgresql(api):
    """The total, the page and the page's calls (three queries, as on SQLite) are one on PostgreSQL: the
    items' JSON built by the page's query, the total a subquery of it (docs/performance.md, "Fourth pass")."""
    for i in range(3):
        email_run(thread=f"t-{i}")
    with CaptureQueriesContext(connection) as ctx:
        response = api.get(URL, {"perPage": 2, "page": 0})
    assert response.status_code == 200
    assert (len(response.json()["runs"]), response.json()["total"]) == (2, 3)
    listing = [q["sql"] for q in ctx.captured_queries if "agentrun_snapshot" in q["sql"]]
    assert len(listing) == (1 if connection.vendor == "postgresql" else 2)
    assert api.get(URL, {"perPage": 2, "page": 5}).json() == {"runs": [], "total": 3}  # past the end


def test_permissions_granted_to_the_person_and_to_their_groups_both_count(reviewer, viewer):
    loner = make_user("lone", password="pw", group=None)
    assert token_client(loner).get(URL).status_code == 403
    loner.user_permissions.add(Permission.objects.get(codename="view_run"))
    assert token_client(loner).get(URL).status_code == 200
    assert token_client(loner).post("/api/agents/support-agent/runs/nope/approve", {}, format="json").status_code == 403
    viewer.user_permissions.add(Permission.objects.get(codename="decide_toolcall"))  # groups' and own together
    answer = token_client(viewer).post(f"/api/agents/support-agent/runs/{email_run()}/approve", {}, format="json")
    assert answer.status_code == 202
    assert token_client(reviewer).get(URL).status_code == 200


# --- through the ASGI application, as daphne serves it ---------------------------------------------
@pytest.mark.django_db(transaction=True)  # the views run on the handler's threads: they need commits
async def test_requests_in_a_row_reuse_their_thread_and_their_redis_connection(monkeypatch):
    """Each request used to start two threads (its own, and one to join it after) and open a new Redis
    connection (a cache object, so a connection pool, per request): most of the request floor
    (docs/performance.md, "Fourth pass"). Now five requests in a row start at most one thread and open at
    most one Redis connection between them."""
    started, connections = [], []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (started.append(self.name), real_start(self))[1])
    real_make = redis.ConnectionPool.make_connection
    monkeypatch.setattr(
        redis.ConnectionPool, "make_connection", lambda self: (connections.append(1), real_make(self))[1]
    )
    client = AsgiClient({"Authorization": f"Token {await reviewer_token()}"})
    assert (await client.get("/api/agents/")).status_code == 200  # the first may start what the next reuse
    started.clear()
    connections.clear()
    for _ in range(5):
        response = await client.get("/api/agents/")
        assert response.status_code == 200
        await response.read()
    assert len(started) <= 1, started
    assert len(connections) <= 1


@pytest.mark.django_db(transaction=True)
async def test_a_known_token_costs_one_cache_round_trip(monkeypatch):
    """The failed-token check and the API count of a token this process knows already go to Redis
    together: one round trip a request (two before)."""
    if not isinstance(caches["default"], RedisCache):
        pytest.skip("round trips to Redis: the PostgreSQL + Redis run")
    sent = []
    real_send = redis.connection.AbstractConnection.send_packed_command
    monkeypatch.setattr(
        redis.connection.AbstractConnection,
        "send_packed_command",
        lambda self, *args, **kwargs: (sent.append(1), real_send(self, *args, **kwargs))[1],
    )
    client = AsgiClient({"Authorization": f"Token {await reviewer_token()}"})
    assert (await client.get("/api/agents/")).status_code == 200  # the token is looked up, then known
    sent.clear()
    for _ in range(3):
        assert (await client.get("/api/agents/")).status_code == 200
    assert len(sent) == 3

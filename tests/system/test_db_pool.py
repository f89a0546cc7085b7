"""A real daphne on PostgreSQL keeps its database connections in psycopg's pool between requests."""

from __future__ import annotations

import socket

import pytest
import requests
from django.db import connection

from tests.helpers.system import create_reviewer, wait_until

pytestmark = [pytest.mark.system, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def sessions() -> set[tuple[int, str]]:
    """The sessions on the test database (pid, start time)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, backend_start::text FROM pg_stat_activity WHERE datname = current_database()")
        return set(cursor.fetchall())


def subscribed(run_ids: list[str]) -> bool:
    """Each run has a subscriber on the channel layer: a server's stream joined the run's group (its
    Redis pub/sub channel, ``<prefix>__group__run.<id>`` with channels_redis' default prefix)."""
    import redis
    from django.conf import settings

    with redis.Redis.from_url(settings.REDIS_URL) as client:
        counts = dict(client.pubsub_numsub(*(f"asgi__group__run.{run_id}" for run_id in run_ids)))
    return all(count > 0 for count in counts.values()) and len(counts) == len(run_ids)


def test_requests_reuse_pooled_connections_instead_of_opening_one_each(processes):
    token = create_reviewer(processes, "pool-reviewer")
    ours = sessions()  # this test process's own
    _, port = processes.daphne("daphne", env={"AGENTRUN_EMBEDDED_SWEEPER": "0", "AGENTRUN_DB_POOL_MAX": "4"})
    url = f"http://127.0.0.1:{port}/api/agents/support-agent/suspended-runs"
    with requests.Session() as client:
        client.headers["Authorization"] = f"Token {token}"
        assert client.get(url).status_code == 200
        first = sessions() - ours
        for _ in range(30):
            assert client.get(url).status_code == 200
        later = sessions() - ours
    # Without a pool each request opens (and closes) a session of its own: none would outlive a request.
    assert first, "the server kept no connection open between requests"
    assert later <= first, "requests opened new database sessions"
    assert len(later) <= 4  # AGENTRUN_DB_POOL_MAX


def test_open_event_streams_do_not_hold_the_pools_connections(processes):
    """Streams may wait for minutes between two reads of the database: they borrow a connection for each
    read only, so a few of them cannot take a small pool from under the server's requests."""
    from agentrun.engine import store

    token = create_reviewer(processes, "stream-pool-reviewer")
    env = {"AGENTRUN_EMBEDDED_SWEEPER": "0", "AGENTRUN_DB_POOL_MAX": "2", "AGENTRUN_DB_POOL_TIMEOUT": "3"}
    _, port = processes.daphne("daphne", env=env)
    # Queued runs nobody drives (no worker here): their event streams stay open, waiting.
    queued = [
        store.create_run(
            agent_id="support-agent",
            messages=[{"role": "user", "content": "hi"}],
            thread_id=f"pool-{i}",
            resource_id=None,
            metadata={},
            options={},
        )
        for i in range(4)
    ]
    streams = []
    try:
        for run in queued:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            head = f"GET /api/runs/{run.id}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Token {token}\r\n"
            sock.sendall(f"{head}\r\n".encode())
            streams.append(sock)
        # Every stream is in its run's group (it reads the log and the run's state from there on), and waits.
        wait_until(lambda: subscribed([run.id for run in queued]), 20, "every stream to join its run's group")
        answer = requests.get(f"http://127.0.0.1:{port}/api/agents/", headers={"Authorization": f"Token {token}"})
        assert answer.status_code == 200, answer.text[:300]
    finally:
        for sock in streams:
            sock.close()

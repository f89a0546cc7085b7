"""A real daphne on PostgreSQL keeps its database connections in psycopg's pool between requests."""

from __future__ import annotations

import pytest
import requests
from django.db import connection

from tests.system.conftest import create_reviewer

pytestmark = [pytest.mark.system, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def sessions() -> set[tuple[int, str]]:
    """The sessions on the test database (pid, start time)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, backend_start::text FROM pg_stat_activity WHERE datname = current_database()")
        return set(cursor.fetchall())


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

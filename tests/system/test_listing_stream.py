"""A large unpaged listing through a real daphne: sent in pieces as it is read, the same runs as the pages."""

from __future__ import annotations

import json
import socket

import pytest
import requests

from benchmarks.seed import seed
from tests.helpers.system import create_reviewer, wait_until

pytestmark = [pytest.mark.system, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RUNS = 3000  # six batches


def get_in_pieces(port: int, path: str, token: str) -> tuple[str, list[bytes]]:
    """The response head and the body's HTTP/1.1 chunks, as they came off the socket."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Token {token}\r\nConnection: close\r\n\r\n"
        sock.sendall(request.encode())
        stream = sock.makefile("rb")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += stream.readline()
        pieces = []
        if b"transfer-encoding: chunked" not in head.lower():
            return head.decode(), [stream.read()]
        while size := int(stream.readline().strip(), 16):
            pieces.append(stream.read(size))
            stream.readline()
        return head.decode(), pieces


def test_a_large_unpaged_listing_is_sent_in_pieces_and_reads_like_the_pages(processes):
    seed(RUNS)
    token = create_reviewer(processes, "stream-reviewer")
    _, port = processes.daphne("daphne", env={"AGENTRUN_EMBEDDED_SWEEPER": "0"})
    path = "/api/agents/support-agent/suspended-runs"

    head, pieces = get_in_pieces(port, path, token)
    assert head.startswith("HTTP/1.1 200")
    assert "content-length" not in head.lower()
    assert len(pieces) > 1 and pieces[0].startswith(b'{"runs":[{"runId":')  # the first runs came first
    streamed = json.loads(b"".join(pieces))

    paged, headers = [], {"Authorization": f"Token {token}"}
    for page in range(RUNS // 1000):
        answer = requests.get(f"http://127.0.0.1:{port}{path}", {"perPage": 1000, "page": page}, headers=headers)
        paged += answer.json()["runs"]
    assert streamed == {"runs": paged, "total": RUNS}


def test_a_client_leaving_half_way_leaves_no_transaction_open(processes):
    from django.db import connection

    seed(RUNS)
    token = create_reviewer(processes, "leaving-reviewer")
    _, port = processes.daphne("daphne", env={"AGENTRUN_EMBEDDED_SWEEPER": "0"})
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        request = (
            f"GET /api/agents/support-agent/suspended-runs HTTP/1.1\r\nHost: x\r\nAuthorization: Token {token}\r\n\r\n"
        )
        sock.sendall(request.replace("Host: x", "Host: 127.0.0.1").encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # the first pieces, then we leave

    def open_transactions() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]

    wait_until(lambda: open_transactions() == 0, 10, "the streamed listing's transaction to end")

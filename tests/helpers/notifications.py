"""Notifications under test: a real HTTP receiver, webhook endpoints, reviewers with email, the outbox.

The receiver is a real ``http.server`` on 127.0.0.1 in a thread: webhooks are delivered over the
network as in production. Its answers are scripted per request (a status, or hanging until released).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import mail

from agentrun.core.access import VIEWERS
from notifications.delivery import notifier
from notifications.models import WebhookEndpoint
from tests.helpers.users import make_user
from tests.helpers.waiting import wait_for_tasks, wait_until


@dataclass
class Received:
    headers: dict[str, str]  # names lowercased (HTTP header names are case-insensitive)
    body: bytes
    at: float  # time.monotonic() when it arrived


@dataclass
class Receiver:
    url: str
    requests: list[Received] = field(default_factory=list)
    # One answer per request, in order (then the last one again): a status, or "hang" (no answer until
    # release(), or until the server gives up after HANG_SECONDS).
    answers: list[int | str] = field(default_factory=lambda: [200])
    released: threading.Event = field(default_factory=threading.Event)
    hanging: int = 0

    def release(self) -> None:
        self.released.set()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"the receiver got {len(self.requests)} requests, not {count}")
            time.sleep(0.02)
        return self.requests


HANG_SECONDS = 30


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            index = len(state.requests)
            state.requests.append(Received({k.lower(): v for k, v in self.headers.items()}, body, time.monotonic()))
            answer = state.answers[min(index, len(state.answers) - 1)]
            if answer == "hang":
                with lock:
                    state.hanging += 1
                state.released.wait(HANG_SECONDS)
                with lock:
                    state.hanging -= 1
                answer = 200
            self.send_response(int(answer))
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_port}/hooks"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    state.release()
    server.shutdown()
    server.server_close()


@pytest.fixture
def clean_notifier(settings) -> Iterator[None]:
    """Each test starts and ends with a fresh view of subscribers and no notification job running
    (a job must not outlive the test's database). Webhooks may reach the test's own receivers on
    127.0.0.1 (tests/security/test_webhook_egress.py shows the default refusing them)."""
    settings.AGENTRUN_PUBLIC_URL = "http://agentrun.test"
    settings.AGENTRUN_WEBHOOK_ALLOW_PRIVATE = True  # the receivers listen on 127.0.0.1
    notifier.invalidate()
    yield
    wait_for_tasks()
    notifier.invalidate()


@pytest.fixture
def fast_retries(settings) -> None:
    settings.AGENTRUN_WEBHOOK_RETRY_SECONDS = 0.3
    settings.AGENTRUN_WEBHOOK_TIMEOUT_SECONDS = 2


def endpoint_owner() -> User:
    """A superuser: an endpoint receives the events of agents its owner may view (all, here)."""
    return User.objects.filter(username="hook-owner").first() or User.objects.create_superuser("hook-owner")


def make_endpoint(url: str, **fields: Any) -> WebhookEndpoint:
    fields.setdefault("owner", endpoint_owner())
    return WebhookEndpoint.objects.create(url=url, secret=fields.pop("secret", "s3cret-for-tests"), **fields)


@pytest.fixture
def erin(transactional_db) -> User:
    """A reviewer with an email address (email immediately: the default)."""
    return make_user("erin", email="erin@example.com")


@pytest.fixture
def viewer_with_email(transactional_db) -> User:
    return make_user("vera", group=VIEWERS, email="vera@example.com")


def sent_emails(count: int = 1, timeout: float = 10.0) -> list:
    """Email is sent by notifications tasks: wait until ``count`` messages are in the outbox."""
    return wait_until(lambda: mail.outbox if len(mail.outbox) >= count else None, timeout, f"{count} emails")

"""Fixtures of the REST API tests: users with tokens in the contract's groups, and runs made by the engine."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Group, User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agentrun.core.access import REVIEWERS, VIEWERS, ensure_groups
from agentrun.core.models import Run
from tests.factories import is_rested, start, suspended_email_run, tool_line


def _user(username: str, group: str | None) -> User:
    ensure_groups()  # a transactional test flushed the groups post_migrate made
    user = User.objects.create_user(username, password="pw")
    if group:
        user.groups.add(Group.objects.get(name=group))
    return user


def token_client(user: User) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
    return client


@pytest.fixture
def reviewer(db) -> User:
    return _user("rita", REVIEWERS)


@pytest.fixture
def viewer(db) -> User:
    return _user("victor", VIEWERS)


@pytest.fixture
def api(reviewer) -> APIClient:
    return token_client(reviewer)


@pytest.fixture
def viewer_api(viewer) -> APIClient:
    return token_client(viewer)


@pytest.fixture
def auth_header(reviewer) -> dict[str, str]:
    return {"Authorization": f"Token {Token.objects.get_or_create(user=reviewer)[0].key}"}


def email_run(**kwargs: Any) -> str:
    """A support-agent run waiting for approval of one send-email call (made by the engine)."""
    return async_to_sync(suspended_email_run)(**kwargs)


def refund_run(*, thread: str = "thread-refund", resource: str = "user-1") -> str:
    """A billing-agent run waiting for approval of one refund call."""
    stream, _ = async_to_sync(start)(
        "billing-agent", tool_line("refund", {"orderId": "o-1", "amount": 5}), thread=thread, resource=resource
    )
    return stream.run_id


def ask_run(*, thread: str = "thread-ask", resource: str = "user-1") -> str:
    """A support-agent run whose ask-user call suspended for resume data."""
    stream, _ = async_to_sync(start)(
        "support-agent", tool_line("ask-user", {"question": "Which city?"}), thread=thread, resource=resource
    )
    return stream.run_id


def two_call_run(*, thread: str = "thread-two") -> str:
    message = "\n".join(
        [
            tool_line("send-email", {"to": "a@b.c", "subject": "s", "body": "b"}),
            tool_line("delete-record", {"table": "t", "id": 1}),
        ]
    )
    stream, _ = async_to_sync(start)("support-agent", message, thread=thread)
    return stream.run_id


def wait_rested(run_id: str, timeout: float = 10.0) -> Run:
    """Wait until a continuation running server-side is done: nobody holds the run's lease and it rests."""
    deadline = time.monotonic() + timeout
    while not is_rested(run := Run.objects.get(pk=run_id)):
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} did not rest: {run.status}")
        time.sleep(0.02)
    return run


@pytest.fixture
def make(db) -> dict[str, Callable[..., str]]:
    return {"email": email_run, "ask": ask_run, "two": two_call_run}

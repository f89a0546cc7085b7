"""People in the contract's groups (docs/api.md#authentication-and-permissions), their API tokens and clients.

``make_user`` is the one place a test makes a user; the fixtures ``reviewer`` / ``viewer`` (with API
clients ``api`` / ``viewer_api`` and ``auth_header``) are the REST tests' usual pair.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group, User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agentrun.core.access import REVIEWERS, VIEWERS, ensure_groups


def make_user(
    username: str, *, group: str | None = REVIEWERS, email: str | None = None, password: str | None = None, **extra: Any
) -> User:
    """A user in ``group`` (none: ``group=None``); ``extra``: ``is_staff``, ``is_superuser``..."""
    ensure_groups()  # a transactional test flushed the groups post_migrate made
    password = password if password is not None else f"pw-{username}-12345"
    user = User.objects.create_user(username, email=email or "", password=password, **extra)
    if group:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def token_of(user: User) -> str:
    """The user's API token (made the first time)."""
    return Token.objects.get_or_create(user=user)[0].key


def token_client(user: User) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_of(user)}")
    return client


@sync_to_async
def reviewer_token(username: str = "rita") -> str:
    """A new reviewer's API token, from async code (websocket and stream tests)."""
    return token_of(make_user(username, password="pw-12345678"))


@pytest.fixture
def reviewer(db) -> User:
    return make_user("rita", group=REVIEWERS, password="pw")


@pytest.fixture
def viewer(db) -> User:
    return make_user("victor", group=VIEWERS, password="pw")


@pytest.fixture
def api(reviewer) -> APIClient:
    return token_client(reviewer)


@pytest.fixture
def viewer_api(viewer) -> APIClient:
    return token_client(viewer)


@pytest.fixture
def auth_header(reviewer) -> dict[str, str]:
    return {"Authorization": f"Token {token_of(reviewer)}"}

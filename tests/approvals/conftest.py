"""Fixtures of the dashboard tests: signed-in browsers (Django's test client) of each kind of person."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agentrun.core.access import REVIEWERS, VIEWERS, ensure_groups
from tests.helpers.users import make_user


@pytest.fixture
def groups(db):
    ensure_groups()


def _client_for(username: str, group: str | None, **extra) -> tuple[Client, User]:
    user = make_user(username, group=group, password="pw-" + username, **extra)
    client = Client()
    client.force_login(user)
    return client, user


@pytest.fixture
def reviewer(groups):
    return _client_for("rita", REVIEWERS)


@pytest.fixture
def other_reviewer(groups):
    return _client_for("olga", REVIEWERS)


@pytest.fixture
def viewer(groups):
    return _client_for("vic", VIEWERS)


@pytest.fixture
def admin_client_(groups):
    return _client_for("root", None, is_staff=True, is_superuser=True)

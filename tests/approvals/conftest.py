from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Group, User
from django.test import Client

from agentrun.core.access import REVIEWERS, VIEWERS, ensure_groups
from agentrun.core.models import Run
from tests.factories import collect, get_agent, tool_line


@pytest.fixture
def groups(db):
    ensure_groups()


def _client_for(username: str, group: str | None, **extra) -> tuple[Client, User]:
    user = User.objects.create_user(username, password="pw-" + username, **extra)
    if group:
        user.groups.add(Group.objects.get(name=group))
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


def start_run(
    message: str, *, thread: str = "thread-ui", resource: str = "user-ui", agent_id: str = "support-agent"
) -> str:
    """Start a run through the Python API and read its first segment; returns the run id."""
    stream, _ = async_to_sync(collect)(
        get_agent(agent_id).stream(message, memory={"thread": thread, "resource": resource})
    )
    return stream.run_id


def suspend(tool_id: str, args: dict | str, **kwargs) -> str:
    return start_run(tool_line(tool_id, args), **kwargs)


def wait_until_final(run_id: str, timeout: float = 10.0) -> Run:
    """The continuation runs in the background after a dashboard decision: wait for it to end."""
    deadline = time.monotonic() + timeout
    while True:
        run = Run.objects.get(pk=run_id)
        if run.is_final:
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} is still {run.status}")
        time.sleep(0.05)

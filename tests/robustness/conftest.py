"""Fixtures of the robustness tests: the REST fixtures (users with tokens, runs made by the engine),
websocket helpers, and a count of every row a bad request could have changed."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from agentrun.asgi import application
from tests.api.conftest import api, auth_header, reviewer  # noqa: F401 - fixtures shared with the API tests

ORIGIN = [(b"origin", b"http://localhost")]


@pytest.fixture(autouse=True)
def _no_embedded_sweeper(settings):
    # The ASGI app would start a sweeper on each test's event loop; these tests need none.
    settings.AGENTRUN_EMBEDDED_SWEEPER = False


def row_counts() -> dict[str, int]:
    """What a refused request must leave as it was."""
    from agentrun.core.models import (
        Decision,
        IdempotencyKey,
        Message,
        Run,
        RunChunk,
        Snapshot,
        SuspendedToolCall,
        ToolEffect,
    )

    return {
        model.__name__: model.objects.count()
        for model in (Run, Decision, Message, SuspendedToolCall, Snapshot, RunChunk, ToolEffect, IdempotencyKey)
    }


def ws(path: str, token: str) -> WebsocketCommunicator:
    sep = "&" if "?" in path else "?"
    return WebsocketCommunicator(application, f"{path}{sep}token={token}", headers=ORIGIN)


@sync_to_async
def reviewer_token(username: str = "rita") -> str:
    from django.contrib.auth.models import Group, User
    from rest_framework.authtoken.models import Token

    from agentrun.core.access import REVIEWERS, ensure_groups

    ensure_groups()
    user = User.objects.create_user(username, password="pw-12345678")
    user.groups.add(Group.objects.get(name=REVIEWERS))
    return Token.objects.create(user=user).key


@pytest.fixture
def report(capsys) -> Callable[[str], None]:
    """Prints a line of figures past pytest's capture, so CI logs show it even under ``-q``."""

    def write(line: str) -> None:
        with capsys.disabled():
            sys.stdout.write(f"\n{line}\n")
            sys.stdout.flush()

    return write

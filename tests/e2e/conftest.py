"""Browser tests: the production web server (``agentrun.server.web``), Debian's chromium driven by
Playwright, one shared database.

Run as their own pytest invocation (pytest-asyncio and Playwright's sync API do not share a process):

    REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/pytest -m e2e -p no:asyncio tests/e2e

The server and this process share a dedicated SQLite file (``E2E_DATABASE_URL`` overrides it) and
the Redis channel layer (``REDIS_URL``, default db 9), so a run suspended here through the Python API
reaches the pages the browser holds open. Missing chromium or Redis fails the session; nothing skips.
"""

from __future__ import annotations

import importlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.browser import ARTIFACTS, E2E_DIR, PASSWORD, ROOT, SLACK_SIGNING_SECRET, e2e_selected, start_run

CHROMIUM = os.environ.get("E2E_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

E2E_DIR.mkdir(parents=True, exist_ok=True)
DATABASE_URL = os.environ.get("E2E_DATABASE_URL") or f"sqlite:///{E2E_DIR / 'e2e.sqlite3'}"
REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/9"
SERVER_ENV = {
    **os.environ,
    "DEBUG": "1",
    "DATABASE_URL": DATABASE_URL,
    "REDIS_URL": REDIS_URL,
    "AGENTRUN_DATA_DIR": str(E2E_DIR),
    "AGENTRUN_LOG_LEVEL": "WARNING",
    "AGENTRUN_SLACK_SIGNING_SECRET": SLACK_SIGNING_SECRET,
    "PYTHONPATH": str(ROOT),
}
# This process touches the ORM between Playwright's (greenlet-driven) calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"


def _point_django_at_the_shared_database() -> None:
    """pytest-django read the settings before this conftest loaded: re-evaluate them with our env."""
    from django.conf import settings

    os.environ.update({"DATABASE_URL": DATABASE_URL, "REDIS_URL": REDIS_URL, "AGENTRUN_DATA_DIR": str(E2E_DIR)})
    fresh = importlib.reload(importlib.import_module("agentrun.settings"))
    for name in ("DATABASES", "CHANNEL_LAYERS", "REDIS_URL", "DATA_DIR"):
        setattr(settings, name, getattr(fresh, name))
    # Drop what was built from the old values (no connection has been opened yet).
    from asgiref.local import Local
    from channels.layers import channel_layers
    from django.db import connections

    connections.close_all()
    connections.__dict__.pop("settings", None)
    connections._settings = None
    connections._connections = Local(connections.thread_critical)
    channel_layers.backends = {}


def pytest_configure(config: pytest.Config) -> None:
    # Only for the browser run: the normal suite also loads this file and keeps its own test database.
    if e2e_selected(config):
        _point_django_at_the_shared_database()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _require_redis() -> None:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except Exception as exc:  # any failure: the live tests cannot run without it
        pytest.fail(f"Redis at {REDIS_URL} is required by the browser tests: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def _shared_db(django_db_blocker: Any) -> Iterator[None]:
    """A fresh migrated database file for the session, used by the server and by this process."""
    if DATABASE_URL.startswith("sqlite:///"):
        for suffix in ("", "-wal", "-shm"):
            Path(DATABASE_URL.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=SERVER_ENV,
        check=True,
    )
    with django_db_blocker.unblock():
        yield


@pytest.fixture(scope="session")
def live_server_url(_shared_db: None) -> Iterator[str]:
    _require_redis()
    port = _free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    log = open(ARTIFACTS / "e2e-server.log", "w")  # noqa: SIM115 - closed at teardown
    server = subprocess.Popen(
        # The production web server (scripts/production.sh runs it), so a browser drives what users get.
        [sys.executable, "-m", "agentrun.server.web", "-b", "127.0.0.1", "-p", str(port), "agentrun.asgi:application"],
        cwd=ROOT,
        env=SERVER_ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/accounts/login/", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            pytest.fail(f"the web server did not start; see {ARTIFACTS / 'e2e-server.log'}", pytrace=False)
        time.sleep(0.2)
    yield url
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


@pytest.fixture(scope="session")
def chromium(live_server_url: str) -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"chromium is required at {CHROMIUM} (apt-get install chromium)", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def users(_shared_db: None) -> dict[str, Any]:
    from django.contrib.auth.models import Group, User

    from agentrun.core.access import REVIEWERS, VIEWERS

    made = {}
    for name, group in (("rita", REVIEWERS), ("olga", REVIEWERS), ("vic", VIEWERS)):
        user, _ = User.objects.get_or_create(username=name)
        user.set_password(PASSWORD)
        user.save()
        user.groups.add(Group.objects.get(name=group))
        made[name] = user
    return made


@pytest.fixture
def login(chromium: Any, live_server_url: str, users: dict) -> Iterator[Callable[..., Any]]:
    """``login("rita")`` → a page in a fresh browser context, signed in through the login form."""
    contexts = []
    dialogs: list[str] = []

    def _login(username: str, *, width: int = 1280, height: int = 900) -> Any:
        context = chromium.new_context(base_url=live_server_url, viewport={"width": width, "height": height})
        context.set_default_timeout(8_000)
        contexts.append(context)
        page = context.new_page()
        # Injected markup must stay inert: an alert() would open a dialog.
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto("/approvals/")
        assert "/accounts/login/" in page.url
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(re.compile(r"/approvals/$"))
        return page

    yield _login
    for context in contexts:
        context.close()
    assert not dialogs, f"dialogs opened: {dialogs}"


@pytest.fixture
def suspend() -> Callable[..., tuple[str, str]]:
    """``suspend(tool_id, args, thread=...)`` → (run id, tool call id) of a run waiting on that call."""
    import json

    from agentrun.core.models import SuspendedToolCall

    def _suspend(tool_id: str, args: dict, *, thread: str, resource: str = "cust-42") -> tuple[str, str]:
        run_id = start_run("support-agent", f"/tool {tool_id} {json.dumps(args)}", thread=thread, resource=resource)
        call = SuspendedToolCall.objects.get(run_id=run_id, status="open")
        return run_id, call.tool_call_id

    return _suspend


@pytest.fixture(autouse=True)
def _close_engine_db_connections() -> Iterator[None]:
    """Overrides the suite's async fixture of that name: this run has no asyncio plugin (see above).

    Engine work here runs in short-lived threads (``run_python_api``) that close their connections.
    """
    yield


@pytest.fixture(autouse=True)
def _engine_settles_on_the_tests_loop() -> Iterator[None]:
    """Browser tests run without pytest-asyncio (its loop clashes with Playwright's): there is no test
    loop to settle on; the suite's wait before the flush still runs."""
    yield

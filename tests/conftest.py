"""Suite-wide rules: PostgreSQL-only tests, CI strictness, and a clean agent registry.

- Tests marked ``postgres`` are *deselected* (not skipped) when the database is not PostgreSQL: a
  SQLite run reports them as deselected, so nothing looks skipped by accident.
- In CI (``CI=true``) with ``DATABASE_URL`` pointing at PostgreSQL, an unreachable server fails the
  run at once instead of skipping anything.
"""

from __future__ import annotations

import os

import pytest

# The shared fixtures (tests/helpers): users and API clients, runs, notifications' receiver, real processes.
pytest_plugins = [
    "tests.helpers.users",
    "tests.helpers.runs",
    "tests.helpers.notifications",
    "tests.helpers.wsgi",
    "tests.helpers.clock",
    "tests.helpers.system",
]

POSTGRES_SCHEMES = ("postgres://", "postgresql://", "pgsql://", "postgis://")


def _database_vendor() -> str:
    from django.db import connection

    return connection.vendor


def _wants_postgres() -> bool:
    return os.environ.get("DATABASE_URL", "").startswith(POSTGRES_SCHEMES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _database_vendor() == "postgresql":
        return
    kept, deselected = [], []
    for item in items:
        (deselected if item.get_closest_marker("postgres") else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    """Rate-limit counters (Redis on PostgreSQL runs) of this test process only: a later run's users
    have the same ids as an earlier one's (a new test database), not their counts. Fast password hashing."""
    from django.conf import settings

    from tests.helpers.browser import e2e_selected

    settings.CACHES["default"]["KEY_PREFIX"] = f"test-{os.getpid()}"
    if not e2e_selected(config):
        # A fast hasher: users are made by the hundred. Not for the browser tests, whose server (another
        # process, with the production hashers) checks the passwords this process sets.
        settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("CI", "").strip().lower() not in {"1", "true", "yes"} or not _wants_postgres():
        return
    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    try:
        # The maintenance database: the test database does not exist yet at this point.
        psycopg.connect(
            host=db.get("HOST") or None,
            port=db.get("PORT") or None,
            user=db.get("USER") or None,
            password=db.get("PASSWORD") or None,
            dbname="postgres",
            connect_timeout=5,
        ).close()
    except psycopg.Error as exc:
        pytest.exit(f"CI: DATABASE_URL points at PostgreSQL but it is unreachable: {exc}", returncode=1)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """One test database per pytest process: two suites run at once (the engine suite beside the e2e
    one, two checkouts on one machine) must not create, flush or drop each other's database."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    test = db.setdefault("TEST", {})
    if db["ENGINE"].endswith("sqlite3"):
        if test.get("NAME") and test["NAME"] != ":memory:":
            test["NAME"] = f"{test['NAME']}.{os.getpid()}"
    else:
        test["NAME"] = f"{test.get('NAME') or 'test_' + db['NAME']}_{os.getpid()}"
        # No connection pool in the test process: its helper threads (racing deciders, executors) keep
        # a connection each until they end, which would drain a pool of AGENTRUN_DB_POOL_MAX for later
        # tests. The servers the system tests start use the pool, as production does.
        db.get("OPTIONS", {}).pop("pool", None)


@pytest.fixture(autouse=True)
def _fresh_notifier_view():
    """The notifications listener keeps a view of who subscribes (endpoints, email recipients), read
    again after a change in this process (signals). A transactional test's flush deletes rows without
    signals: without this, the next test would inherit the last one's subscribers for a while."""
    from notifications.delivery import notifier

    notifier.invalidate()
    yield


@pytest.fixture(autouse=True)
def _fresh_memory_cache():
    """The embedded default keeps rate counters in the process's memory cache, keyed by user ids; SQLite
    hands a flushed test's ids out again, so the next test's person would start with the last one's
    count. (With Redis the keys carry the test database's name and PostgreSQL never reuses an id.)"""
    from django.core.cache import caches
    from django.core.cache.backends.locmem import LocMemCache

    if isinstance(memory := caches["default"], LocMemCache):
        memory.clear()
    yield


@pytest.fixture(autouse=True)
def _restore_agent_registry():
    """Tests may register throw-away agents (or re-create demo ones); put the registry back after."""
    from agentrun.engine import registry

    saved = registry.snapshot()
    yield
    registry.restore(saved)


@pytest.fixture(autouse=True)
async def _close_engine_db_connections():
    """The engine's database work runs in asgiref's sync thread; close its connection after each test.

    Otherwise it outlives the test (and PostgreSQL refuses to drop the test database at the end).
    """
    yield
    from asgiref.sync import sync_to_async
    from django.db import connections

    await sync_to_async(connections.close_all)()


SETTLE_SECONDS = 15


def _transactional(request: pytest.FixtureRequest) -> bool:
    marker = request.node.get_closest_marker("django_db")
    return "transactional_db" in request.fixturenames or bool(marker and marker.kwargs.get("transaction"))


def _unsettled() -> str:
    """What of the engine still goes on: runs someone drives (a live lease), background tasks not ended."""
    from django.utils import timezone

    from agentrun.core.models import BackgroundTask, Run

    driven = list(
        Run.objects.filter(lease_owner__isnull=False, lease_expires_at__gt=timezone.now()).values_list(
            "id", "status", "lease_owner"
        )
    )
    tasks = list(
        BackgroundTask.objects.filter(status__in=["pending", "running"]).values_list("id", "tool_name", "status")
    )
    # The in-process backend's tasks (an event's handling, a webhook's delivery) run on a loop of their
    # own and may outlive the test's: a flush that TRUNCATEs while one still writes deadlocks with it.
    from django.tasks import task_backends

    from agentrun.server.tasks_backend import InProcessBackend

    busy = ""
    if isinstance(backend := task_backends["default"], InProcessBackend):
        try:
            backend.wait_idle(timeout=0)
        except TimeoutError as still:
            busy = f" {still}"
    return (f"runs driven {driven} " if driven else "") + (f"background tasks {tasks}" if tasks else "") + busy


@pytest.fixture(autouse=True)
def _engine_settles_before_flush(request):
    """A 202 decision or a background task goes on after the test body returns. Let that work end
    before the transactional test's flush: otherwise the flush deadlocks with it on PostgreSQL, or it
    runs into the next test. Work still going after ``SETTLE_SECONDS`` fails the test, naming it: a
    test must end (or cancel) what it started."""
    if not _transactional(request):
        yield
        return
    request.getfixturevalue("transactional_db")  # set up first, so torn down after this fixture
    yield
    import time

    deadline = time.monotonic() + SETTLE_SECONDS
    while (left := _unsettled()) and time.monotonic() < deadline:
        time.sleep(0.05)
    from django.db import connection

    if connection.vendor == "sqlite":
        # The flush DELETEs every row, and decisions are append-only (agentrun.core.receipts): lift the
        # guard for it; the flush's post_migrate puts it back. (PostgreSQL's flush TRUNCATEs: no row trigger.)
        from agentrun.core.receipts import remove_guards

        remove_guards()
    if left:
        pytest.fail(f"the engine did not settle within {SETTLE_SECONDS}s of the test's end: {left}", pytrace=False)


@pytest.fixture(autouse=True)
async def _engine_settles_on_the_tests_loop(request, _engine_settles_before_flush):
    """The same wait, first on the test's event loop (torn down before the one above): work an async
    test started on its loop (a continuation, a background task, a lease's renewal) runs only while
    that loop does."""
    yield
    if not _transactional(request):
        return
    import asyncio

    from asgiref.sync import sync_to_async

    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_SECONDS
    while await sync_to_async(_unsettled_here)() and loop.time() < deadline:
        await asyncio.sleep(0.05)


def _unsettled_here() -> str:
    """``_unsettled`` from the engine's thread; a connection a test broke (an outage) is closed and
    the wait left to the one on the test's own connection."""
    from django.db import DatabaseError, connections

    try:
        return _unsettled()
    except DatabaseError:
        connections.close_all()
        return ""

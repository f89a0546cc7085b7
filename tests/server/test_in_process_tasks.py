"""The embedded task backend (agentrun.server.tasks_backend): a notifications task outlives the loop of
the script that enqueued it, and a task running counts as running whichever thread asks.

A script using the Python API runs its own event loop (``asyncio.run``); a run it streams suspends and
its event's handling is enqueued on the notifications queue. The script's loop ends right after — and
took along what was left on it: an event not yet taken (nobody emailed, no Slack message: CI saw it as
a flaky "timed out waiting for 1 emails"), a digest or a retry waiting for its ``run_after``.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.tasks import task, task_backends
from django.utils import timezone

from agentrun.engine import runtime
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)  # enqueueing asks whether a transaction is open

RAN: set[str] = set()
_ran_lock = threading.Lock()


@task(queue_name="notifications")
def remember(key: str) -> None:
    with _ran_lock:
        RAN.add(key)


def test_a_notifications_task_due_later_still_runs_after_the_scripts_loop_ended():
    due = timezone.now() + timedelta(seconds=0.3)

    async def script() -> None:  # enqueued from engine code the script awaited (``runtime.db``)
        await runtime.db(lambda: remember.using(run_after=due).enqueue("from-a-script"))()

    asyncio.run(script())  # the loop is gone before the task is due
    assert "from-a-script" not in RAN
    wait_until(lambda: "from-a-script" in RAN, timeout=5, what="the task enqueued by the script")


def test_a_notifications_task_enqueued_by_async_code_outlives_its_loop():
    due = timezone.now() + timedelta(seconds=0.3)

    async def script() -> None:
        await remember.using(run_after=due).aenqueue("inside-a-loop")

    asyncio.run(script())
    wait_until(lambda: "inside-a-loop" in RAN, timeout=5, what="the task enqueued in the loop")


RELEASED = threading.Event()


@task(queue_name="notifications")
def hold(key: str) -> None:
    with _ran_lock:
        RAN.add(key)
    RELEASED.wait(10)


def test_a_task_started_in_another_thread_counts_as_running_in_this_one():
    """Django keeps a task backend per thread. A task that a request's thread or the engine's database
    thread started must count when another thread waits for the tasks to end: the suite waits so before
    it empties the database, and an event's handling still writing then deadlocked with the flush on
    PostgreSQL (seen as a flaky Slack test; the next test then found the last one's rows)."""
    RELEASED.clear()

    def start_elsewhere() -> None:
        try:
            hold.enqueue("from-another-thread")
        finally:
            connections.close_all()

    starter = threading.Thread(target=start_elsewhere)
    starter.start()
    starter.join()
    wait_until(lambda: "from-another-thread" in RAN, timeout=5, what="the task running")
    with pytest.raises(TimeoutError, match="1 in-process tasks still running"):
        task_backends["default"].wait_idle(timeout=0)
    RELEASED.set()
    task_backends["default"].wait_idle(timeout=5)

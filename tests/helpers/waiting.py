"""Waiting on a condition, never on a clock: ``wait_until`` polls and fails loudly with what it waited for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from django.tasks import task_backends


def wait_until[T](
    predicate: Callable[[], T], timeout: float = 10.0, what: str = "the condition", interval: float = 0.02
) -> T:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
    return value


async def async_wait_until[T](
    predicate: Callable[[], Awaitable[T]], timeout: float = 10.0, what: str = "the condition", interval: float = 0.02
) -> T:
    """``wait_until`` from an event loop: ``predicate`` is awaited (the loop keeps running meanwhile)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := await predicate()):
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
    return value


def wait_for_tasks(timeout: float = 30.0, queue: str = "notifications") -> None:
    """Until the in-process task backend runs no task of ``queue`` (retries waiting for their time
    aside): webhooks and email by default."""
    task_backends["default"].wait_idle(timeout, queue=queue)

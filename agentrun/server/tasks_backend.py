"""The embedded task backend: tasks run inside the ASGI server process, without blocking the caller.

Enqueueing is transactional, as with ``django_tasks_db.DatabaseBackend`` (whose queue row is written in
the caller's transaction): a task enqueued inside an atomic block starts when that block commits, and
never if it rolls back. So a decision and its continuation commit together on either backend.

A task with ``run_after`` waits on the loop until then. Synchronous tasks of the default queue (the
engine's) run in asgiref's database thread, like every other engine call; synchronous tasks of any
other queue (``notifications``: webhooks, email) run in threads of their own, so a receiver that hangs
holds one of those, never the engine. The default queue's tasks run on their caller's loop (a
continuation shares its channel layer); the other queues' on the server's loop or the engine's private
one (``runtime.submit(detached=True)``), so that a script's ``asyncio.run`` ending does not cancel an
event's handling or a retry waiting for its ``run_after``.

Production uses ``django_tasks_db.DatabaseBackend`` and ``manage.py agentrun_worker`` instead.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from inspect import iscoroutinefunction
from traceback import format_exception
from typing import Any, ClassVar

from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.tasks import DEFAULT_TASK_QUEUE_NAME
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError, TaskResult, TaskResultStatus
from django.utils import timezone
from django.utils.crypto import get_random_string

from agentrun.engine import runtime

logger = logging.getLogger("agentrun.tasks")


def _in_own_thread(func: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        finally:
            connections.close_all()  # this thread's connections: the task may be its last for a while

    return sync_to_async(run, thread_sensitive=False)


class InProcessBackend(BaseTaskBackend):
    supports_async_task = True
    supports_defer = True

    # Tasks started and not finished (those waiting for their run_after aside): id -> (queue, loop). One
    # registry for the process: Django makes a backend per thread (``task_backends`` is thread-local),
    # and a task started in one thread (a request's, the engine's database thread) must count in
    # ``wait_idle`` called from any other.
    _busy: ClassVar[dict[str, tuple[str, asyncio.AbstractEventLoop | None]]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def enqueue(self, task, args, kwargs):  # noqa: ANN001, ANN201 - the framework's signature
        self.validate_task(task)
        result = self._result(task, args, kwargs)
        # Outside an atomic block on_commit runs at once. The coroutine is made only when it is due, so a
        # rolled-back enqueue leaves no coroutine that is never awaited.
        transaction.on_commit(lambda: self._start(result))
        return result

    def _result(self, task, args, kwargs) -> TaskResult:  # noqa: ANN001
        return TaskResult(
            task=task,
            id=get_random_string(32),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

    async def aenqueue(self, task, args, kwargs):  # noqa: ANN001, ANN201
        # Enqueueing only schedules a coroutine: do it on the caller's loop, not in a worker thread.
        # (Async code holds no transaction, so there is nothing to wait for.)
        self.validate_task(task)
        result = self._result(task, args, kwargs)
        self._start(result)
        return result

    def _start(self, result: TaskResult) -> None:
        queue = result.task.queue_name
        with self._lock:
            self._busy[result.id] = (queue, None)  # busy from now; its loop is known once submitted
        # The engine's queue runs on its caller's loop (a continuation shares the caller's channel layer);
        # any other queue's tasks must outlive a script's or a test's loop: a digest waiting for its
        # run_after, an event's handling not yet in its thread, would be cancelled when that loop ends.
        loop = runtime.submit(self._execute(result), detached=queue != DEFAULT_TASK_QUEUE_NAME)
        with self._lock:
            if result.id in self._busy:  # not finished already
                self._busy[result.id] = (queue, loop)

    def _mark(self, result: TaskResult, busy: bool) -> None:
        with self._lock:
            if busy:
                self._busy[result.id] = (result.task.queue_name, asyncio.get_running_loop())
            else:
                self._busy.pop(result.id, None)

    def wait_idle(self, timeout: float = 30.0, queue: str | None = None) -> None:
        """Until no task (of ``queue``, or of any) is queued or running, except those waiting for a later
        ``run_after`` and those whose event loop is gone (a test's) — for tests."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                for task_id, (_, loop) in list(self._busy.items()):
                    if loop is not None and (loop.is_closed() or not loop.is_running()):
                        del self._busy[task_id]
                busy = sum(1 for q, _ in self._busy.values() if queue in (None, q))
            if not busy:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{busy} in-process tasks still running")
            time.sleep(0.01)

    async def _execute(self, result: TaskResult) -> None:
        try:
            await self._run(result)
        finally:
            self._mark(result, busy=False)

    async def _run(self, result: TaskResult) -> None:
        task = result.task
        if task.run_after is not None:
            delay = (task.run_after - timezone.now()).total_seconds()
            if delay > 0:
                self._mark(result, busy=False)
                await asyncio.sleep(delay)
                self._mark(result, busy=True)
        now = timezone.now()
        object.__setattr__(result, "status", TaskResultStatus.RUNNING)
        object.__setattr__(result, "started_at", now)
        object.__setattr__(result, "last_attempted_at", now)
        try:
            if iscoroutinefunction(task.func):
                value = await task.func(*result.args, **result.kwargs)
            elif task.queue_name == DEFAULT_TASK_QUEUE_NAME:
                value = await sync_to_async(task.func)(*result.args, **result.kwargs)
            else:
                value = await _in_own_thread(task.func)(*result.args, **result.kwargs)
            object.__setattr__(result, "_return_value", value)
            object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        except Exception as exc:
            logger.exception("task %s failed", task.name)
            result.errors.append(
                TaskError(
                    exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
                    traceback="".join(format_exception(exc)),
                )
            )
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
        object.__setattr__(result, "finished_at", timezone.now())

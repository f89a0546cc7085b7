"""The embedded task backend: tasks run inside the ASGI server process, without blocking the caller.

Enqueueing is transactional, as with ``django_tasks_db.DatabaseBackend`` (whose queue row is written in
the caller's transaction): a task enqueued inside an atomic block starts when that block commits, and
never if it rolls back. So a decision and its continuation commit together on either backend.

Production uses ``django_tasks_db.DatabaseBackend`` and ``manage.py agentrun_worker`` instead.
"""

from __future__ import annotations

import logging
from inspect import iscoroutinefunction
from traceback import format_exception

from asgiref.sync import sync_to_async
from django.db import transaction
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError, TaskResult, TaskResultStatus
from django.utils import timezone
from django.utils.crypto import get_random_string

from agentrun.engine import runtime

logger = logging.getLogger("agentrun.tasks")


class InProcessBackend(BaseTaskBackend):
    supports_async_task = True

    def enqueue(self, task, args, kwargs):  # noqa: ANN001, ANN201 - the framework's signature
        self.validate_task(task)
        result = self._result(task, args, kwargs)
        # Outside an atomic block on_commit runs at once. The coroutine is made only when it is due, so a
        # rolled-back enqueue leaves no coroutine that is never awaited.
        transaction.on_commit(lambda: runtime.submit(self._execute(result)))
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
        runtime.submit(self._execute(result))
        return result

    async def _execute(self, result: TaskResult) -> None:
        task = result.task
        now = timezone.now()
        object.__setattr__(result, "status", TaskResultStatus.RUNNING)
        object.__setattr__(result, "started_at", now)
        object.__setattr__(result, "last_attempted_at", now)
        try:
            if iscoroutinefunction(task.func):
                value = await task.func(*result.args, **result.kwargs)
            else:
                value = await sync_to_async(task.func)(*result.args, **result.kwargs)
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

"""``manage.py agentrun_worker``: django-tasks-db's ``db_worker``, woken at once when a task is enqueued,
plus the periodic sweep.

Waking: on PostgreSQL a trigger on the task table (migration ``0006_task_wakeup``) sends
``NOTIFY agentrun_tasks`` with every enqueue, delivered when the enqueuing transaction commits (a
decision and its continuation); an idle worker waits on ``LISTEN`` instead of sleeping, so it claims
the task within a round trip. ``--interval`` stays the fallback poll (a missed notification, SQLite).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from typing import Any

import psycopg
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection, connections
from django.db.models import Min
from django.tasks import TaskResultStatus
from django.utils import timezone
from django_tasks_db.management.commands.db_worker import Command as DbWorkerCommand
from django_tasks_db.management.commands.db_worker import Worker
from django_tasks_db.models import DBTaskResult, get_date_max
from django_tasks_db.utils import exclusive_transaction, is_locked_database_exception

from agentrun.core import outages, workers
from agentrun.engine import lease
from agentrun.engine.sweeper import run_forever

logger = logging.getLogger("agentrun.worker")
RETRY_SECONDS = 0.5  # a database restart takes about a second
SWEEPER_JOIN_SECONDS = 3.0
WAKEUP_CHANNEL = "agentrun_tasks"


class TaskListener:
    """A connection of its own that LISTENs for enqueued tasks (PostgreSQL)."""

    def __init__(self) -> None:
        self.conn: psycopg.Connection | None = None

    def wait(self, timeout: float) -> None:
        """Return when a task was enqueued, or after ``timeout`` seconds."""
        try:
            if self.conn is None or self.conn.closed:
                params = connection.get_connection_params()
                params.pop("cursor_factory", None)
                params.pop("context", None)
                self.conn = psycopg.connect(**params, autocommit=True)
                self.conn.execute(f"LISTEN {WAKEUP_CHANNEL}")
            for _ in self.conn.notifies(timeout=timeout, stop_after=1):
                break
        except psycopg.OperationalError as exc:
            # The database went away: fall back to sleeping; the next wait reconnects.
            outages.failed(exc)
            self.close()
            time.sleep(timeout)
        except psycopg.Error:
            logger.warning("cannot listen for tasks; polling", exc_info=True)
            self.close()
            time.sleep(timeout)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class WakingWorker(Worker):
    """db_worker's worker loop, waiting on ``TaskListener`` (PostgreSQL) instead of sleeping.

    SIGTERM / SIGINT: no new task is claimed; the task running (a continuation, a background tool)
    has ``AGENTRUN_DRAIN_SECONDS`` to finish, then the process leaves anyway, expiring its leases so
    that another worker's sweep continues its runs at once (the log stays well-formed: the taker
    closes the segment left open). A second signal stops at once.
    """

    def shutdown(self, signum: int, frame: Any) -> None:
        if self.running and self.running_task:
            seconds = settings.AGENTRUN_DRAIN_SECONDS
            threading.Thread(target=self._leave_after, args=(seconds,), name="agentrun-drain", daemon=True).start()
        super().shutdown(signum, frame)

    def _leave_after(self, seconds: float) -> None:
        time.sleep(seconds)
        logger.warning("drain of %.0f s over: the task in progress is left to another worker", seconds)
        try:
            lease.expire_leases_of_this_process()
        finally:
            logging.shutdown()
            os._exit(1)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.listener = TaskListener() if connection.vendor == "postgresql" else None

    def _mine(self, tasks: Any) -> Any:
        tasks = tasks.filter(backend_name=self.backend_name)
        if not self.process_all_queues:
            tasks = tasks.filter(queue_name__in=self.queue_names)
        if self.excluded_queue_names:
            tasks = tasks.exclude(queue_name__in=self.excluded_queue_names)
        return tasks

    def _idle_seconds(self) -> float:
        """How long to wait for a notification: the poll interval, or less if a deferred task of this
        worker's queues (``run_after``: a webhook's retry) falls due sooner."""
        now = timezone.now()
        deferred = DBTaskResult.objects.filter(status=TaskResultStatus.READY, run_after__gt=now)
        deferred = self._mine(deferred.exclude(run_after=get_date_max()))  # get_date_max(): "no run_after"
        due = deferred.aggregate(due=Min("run_after"))["due"]
        return self.interval if due is None else max(0.0, min(self.interval, (due - now).total_seconds()))

    def _claim(self) -> DBTaskResult | None:
        tasks = self._mine(DBTaskResult.objects.ready())
        with exclusive_transaction(tasks.db):
            try:
                task_result = tasks.get_locked()
            except OperationalError as exc:
                if is_locked_database_exception(exc):  # SQLite: another worker holds the lock
                    return None
                raise
            if task_result is not None:
                task_result.claim(self.worker_id)  # so no other worker runs it
        return task_result

    def run(self) -> None:
        logger.info("Starting worker worker_id=%s queues=%s", self.worker_id, ",".join(self.queue_names))
        if self.startup_delay and self.interval:
            time.sleep(random.random())  # noqa: S311 - spread the first polls of workers started together
        try:
            while self.running:
                close_old_connections()
                task_result = self._claim()
                if task_result is not None:
                    self.run_task(task_result)
                if self.max_tasks is not None and self._run_tasks >= self.max_tasks:
                    return
                close_old_connections()
                if self.running and task_result is None:
                    if self.batch:
                        return
                    if self.listener is not None:
                        self.listener.wait(self._idle_seconds())
                    else:
                        time.sleep(self.interval)
        finally:
            if self.listener is not None:
                self.listener.close()


class Command(DbWorkerCommand):
    help = "Run tasks from the database (like db_worker, woken on enqueue) and sweep: expiry, stalled runs, lost tasks."

    def handle(self, *args: Any, **options: Any) -> None:
        self.configure_logging(options["verbosity"])
        workers.process_role = "worker"  # its heartbeats (each sweep) say so on /healthz
        stop_sweeping = threading.Event()
        sweeper = threading.Thread(
            target=lambda: asyncio.run(run_forever(stop=stop_sweeping)), name="agentrun-sweeper", daemon=True
        )
        sweeper.start()
        queue_names = options["queue_name"].split(",")
        worker = WakingWorker(
            queue_names=queue_names,
            interval=options["interval"],
            batch=options["batch"],
            backend_name=options["backend_name"],
            startup_delay=options["startup_delay"],
            max_tasks=options["max_tasks"],
            worker_id=options["worker_id"],
            excluded_queue_names=options["exclude_queues"].split(",") if options["exclude_queues"] else [],
        )
        worker.configure_signals()
        try:
            while True:
                try:
                    worker.run()
                    return  # stopped by a signal, --batch or --max-tasks
                except (OperationalError, InterfaceError) as exc:
                    # The claiming query fails while the database restarts: wait and poll again instead
                    # of exiting (a worker that exits takes its share of the work with it). One warning
                    # per outage (agentrun.core.outages), not one per poll.
                    outages.failed(exc)
                    connections.close_all()
                    time.sleep(RETRY_SECONDS)
        finally:
            # Let a sweep round in progress end before the interpreter does (it would fail, and log so).
            stop_sweeping.set()
            sweeper.join(timeout=SWEEPER_JOIN_SECONDS)

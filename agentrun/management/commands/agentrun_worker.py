"""``manage.py agentrun_worker``: django-tasks-db's ``db_worker`` plus the periodic sweep."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from django.db import InterfaceError, OperationalError, connections
from django_tasks_db.management.commands.db_worker import Command as DbWorkerCommand

from agentrun import health
from agentrun.engine.sweeper import run_forever

logger = logging.getLogger("agentrun.worker")
RETRY_SECONDS = 2.0


class Command(DbWorkerCommand):
    help = "Run tasks from the database (like db_worker) and sweep: expiry, stalled runs, lost background tasks."

    def handle(self, *args: Any, **options: Any) -> None:
        health.process_role = "worker"  # its heartbeats (each sweep) say so on /healthz
        threading.Thread(target=lambda: asyncio.run(run_forever()), name="agentrun-sweeper", daemon=True).start()
        while True:
            try:
                super().handle(*args, **options)
                return  # stopped by a signal
            except (OperationalError, InterfaceError):
                # db_worker's polling query fails while the database restarts: wait and poll again
                # instead of exiting (a worker that exits takes its share of the work with it).
                logger.warning("database unavailable; polling again in %.0f s", RETRY_SECONDS, exc_info=True)
                connections.close_all()
                time.sleep(RETRY_SECONDS)

"""``manage.py agentrun_worker``: django-tasks-db's ``db_worker`` plus the periodic sweep."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from django_tasks_db.management.commands.db_worker import Command as DbWorkerCommand

from agentrun.engine.sweeper import run_forever


class Command(DbWorkerCommand):
    help = "Run tasks from the database (like db_worker) and sweep: expiry, stalled runs, lost background tasks."

    def handle(self, *args: Any, **options: Any) -> None:
        threading.Thread(target=lambda: asyncio.run(run_forever()), name="agentrun-sweeper", daemon=True).start()
        super().handle(*args, **options)

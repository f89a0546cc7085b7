"""Which processes sweep: each sweep records a heartbeat; ``/healthz`` lists those seen recently.

Below the engine, so that the sweeper can record and the web server can read without either
importing the other.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from agentrun.core.models import WorkerHeartbeat
from agentrun.core.timeutil import iso

SEEN_RECENTLY_SWEEPS = 3

# "worker" in agentrun_worker processes (the command sets it), "server" where the server sweeps itself.
process_role = "server"


def process_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def record_heartbeat() -> None:
    """Called at the end of each successful sweep: this process is alive and sweeping."""
    now = timezone.now()
    WorkerHeartbeat.objects.update_or_create(
        id=process_id(),
        defaults={"host": socket.gethostname(), "pid": os.getpid(), "role": process_role, "seen_at": now},
    )


def recent_workers() -> list[dict[str, Any]]:
    """The processes whose sweep recorded a heartbeat within ``SEEN_RECENTLY_SWEEPS`` sweep periods."""
    since = timezone.now() - timedelta(seconds=SEEN_RECENTLY_SWEEPS * settings.AGENTRUN_SWEEP_SECONDS)
    return [
        {"id": w.id, "host": w.host, "pid": w.pid, "role": w.role, "seenAt": iso(w.seen_at)}
        for w in WorkerHeartbeat.objects.filter(seen_at__gte=since)[:100]
    ]

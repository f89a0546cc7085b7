"""``GET /healthz``: is this web process able to serve, and is anyone sweeping?

No authentication, JSON, no session or CSRF work. Checks:

- ``database``: ``SELECT 1`` and its latency;
- ``channelLayer``: a send and receive on a fresh channel (with Redis, the round trip through it);
- ``workers``: processes whose sweep (``agentrun.engine.sweeper.sweep_once``) recorded a heartbeat
  (``agentrun.core.workers``) within ``3 × AGENTRUN_SWEEP_SECONDS``: the ``agentrun_worker``
  processes, and on the embedded default the server's own sweeper.

Status: ``503`` when the database or the channel layer fails (this process cannot serve: take it out
of the load balancer), or while it drains after SIGTERM (``status: "draining"``). Without a recent
worker the answer is ``200`` with ``status: "degraded"``: the process serves reads, decisions and
streams, but continuations queued for workers, background tasks and expiry wait until a worker is
back, so restarting web processes would not help — alert on it instead.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.urls import re_path
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from agentrun.core import outages
from agentrun.core import workers as workers_seen

LAYER_TIMEOUT_SECONDS = 2.0
DATABASE_TIMEOUT_SECONDS = 2.0  # a pooled connection, at most (the pool's own timeout is for requests)

# Set when this web process drains after SIGTERM (agentrun.server.web): /healthz answers 503 "draining"
# so that a load balancer stops sending it requests.
draining = False


def _check_database() -> dict[str, Any]:
    started = time.perf_counter()
    try:
        pool = getattr(connection, "pool", None)
        if pool is not None:
            # What a request would get: a checked connection of the pool (none kept from before an
            # outage), within DATABASE_TIMEOUT_SECONDS rather than the pool's request timeout.
            pool.open()
            with pool.connection(timeout=DATABASE_TIMEOUT_SECONDS) as conn:
                conn.execute("SELECT 1").fetchone()
        else:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
                cursor.fetchone()
    except Exception as exc:  # any failure of the database is the answer, not a 500
        outages.failed(exc)
        return {"ok": False, "latencyMs": None, "error": f"{type(exc).__name__}: {exc}"[:300]}
    outages.database.reached()
    return {"ok": True, "latencyMs": round((time.perf_counter() - started) * 1000, 2)}


async def _check_channel_layer() -> dict[str, Any]:
    from channels.layers import get_channel_layer

    backend = settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND") if settings.CHANNEL_LAYERS else None
    try:
        layer = get_channel_layer()
        if layer is None:
            return {"ok": False, "backend": backend, "error": "no channel layer is configured"}
        nonce = uuid.uuid4().hex
        started = time.perf_counter()
        async with asyncio.timeout(LAYER_TIMEOUT_SECONDS):
            channel = await layer.new_channel()
            await layer.send(channel, {"type": "health.ping", "nonce": nonce})
            message = await layer.receive(channel)
        if message.get("nonce") != nonce:
            return {"ok": False, "backend": backend, "error": "the layer returned another message"}
        outages.channel_layer.reached()
        return {"ok": True, "backend": backend, "latencyMs": round((time.perf_counter() - started) * 1000, 2)}
    except TimeoutError:
        return {"ok": False, "backend": backend, "error": f"no answer within {LAYER_TIMEOUT_SECONDS} s"}
    except Exception as exc:  # a refused connection, a bad URL: the answer, not a 500
        outages.failed(exc)
        return {"ok": False, "backend": backend, "error": f"{type(exc).__name__}: {exc}"[:300]}


async def health_report() -> tuple[int, dict[str, Any]]:
    database = await sync_to_async(_check_database)()
    layer = await _check_channel_layer()
    workers: list[dict[str, Any]] = []
    if database["ok"]:
        try:
            workers = await sync_to_async(workers_seen.recent_workers)()
        except Exception as exc:  # e.g. migrations not applied yet
            database = {**database, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    serving = database["ok"] and layer["ok"] and not draining
    body = {
        "status": "draining" if draining else "ok" if serving and workers else "degraded",
        "database": database,
        "channelLayer": layer,
        "workers": workers,
        "workersSeenRecently": bool(workers),
    }
    return (200 if serving else 503), body


@never_cache
@require_GET
async def healthz(request: HttpRequest) -> JsonResponse:
    status, body = await health_report()
    return JsonResponse(body, status=status)


# --- /readyz --------------------------------------------------------------------------------------
# Set once every migration is applied: applied migrations stay applied for the code this process runs.
_migrations_applied = False


def _check_migrations() -> dict[str, Any]:
    """Whether every migration this code knows is applied (read once until it is)."""
    global _migrations_applied
    if _migrations_applied:
        return {"ok": True}
    from django.db.migrations.executor import MigrationExecutor

    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:  # the database went away meanwhile: the answer, not a 500
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    if pending:
        names = [f"{m.app_label}.{m.name}" for m, _ in pending]
        return {"ok": False, "error": f"{len(names)} migrations not applied", "pending": names[:20]}
    _migrations_applied = True
    return {"ok": True}


async def readiness_report() -> tuple[int, dict[str, Any]]:
    """Can this process serve: its database answers, its channel layer round-trips, every migration is
    applied, and it is not draining. Workers are not part of it (``/healthz`` tells about them)."""
    database = await sync_to_async(_check_database)()
    layer = await _check_channel_layer()
    migrations = await sync_to_async(_check_migrations)() if database["ok"] else {"ok": False, "error": "no database"}
    ready = database["ok"] and layer["ok"] and migrations["ok"] and not draining
    body = {
        "status": "draining" if draining else "ready" if ready else "not ready",
        "database": database,
        "channelLayer": layer,
        "migrations": migrations,
    }
    return (200 if ready else 503), body


@never_cache
@require_GET
async def readyz(request: HttpRequest) -> JsonResponse:
    status, body = await readiness_report()
    return JsonResponse(body, status=status)


urlpatterns = [
    re_path(r"^healthz/?$", healthz, name="healthz"),
    re_path(r"^readyz/?$", readyz, name="readyz"),
]

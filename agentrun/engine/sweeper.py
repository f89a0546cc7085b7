"""The periodic sweep: expire runs past their TTL, apply timeout policies, take over runs whose driver
died, recover and dispatch background tasks, hand undelivered events to their listeners, prune what is
past its retention. Runs in every
worker (``manage.py agentrun_worker``) and, on the embedded default, inside the server process."""

from __future__ import annotations

import asyncio
import logging
import threading

from asgiref.sync import sync_to_async
from django.conf import settings

from agentrun.core import outages, outbox, retention, workers
from agentrun.engine import background, lease, runtime, timeouts
from agentrun.engine.decisions import expire_due_runs
from agentrun.engine.dispatch import continue_run
from agentrun.engine.runtime import db

logger = logging.getLogger("agentrun.sweeper")


async def sweep_once() -> dict:
    # A database restart leaves this thread's connection broken: without this, every later round
    # would fail on it ("the connection is closed") and stalled runs would never be continued.
    await sync_to_async(runtime.recover_connection)()
    expired = await sync_to_async(expire_due_runs)()
    # After expiry (the agent's TTL is the outer bound); db(): a decided call's continuation runs here.
    timed = await db(timeouts.sweep)()
    # Every worker sweeps: each stalled run is claimed by one of them, once per lease period (the
    # continuation may wait in the queue longer than one sweep round).
    stalled = await sync_to_async(lease.claim_stalled_runs)()
    for agent_id, run_id in stalled:
        logger.warning("run %s has no live driver: continuing it", run_id)
        await continue_run.aenqueue(agent_id, run_id)
    recovered = await sync_to_async(background.recover_abandoned)()
    dispatched = await background.dispatch_pending()
    await sync_to_async(outbox.sweep)()  # webhooks and email: enqueue again what lost its task
    # Retention: a bounded batch of each kind past its time, every AGENTRUN_PRUNE_SECONDS.
    pruned = await sync_to_async(retention.prune_due)()
    await sync_to_async(workers.record_heartbeat)()  # /healthz: this process sweeps
    return {
        "expired": expired,
        **timed,
        "stalled": len(stalled),
        "recovered": recovered,
        "dispatched": dispatched,
        "pruned": sum(p.removed for p in pruned),
    }


async def run_forever(interval: float | None = None, stop: threading.Event | None = None) -> None:
    """Sweep every ``interval`` seconds, until ``stop`` is set (a worker shutting down)."""
    interval = interval or settings.AGENTRUN_SWEEP_SECONDS
    stop = stop or threading.Event()
    while not stop.is_set():
        try:
            await sweep_once()
        except outages.INFRASTRUCTURE_ERRORS as exc:  # the next round goes on once the service answers
            outages.failed(exc)
        except Exception:  # the sweep must outlive a bad round
            if stop.is_set():
                return  # the process is exiting under this round: not a failure
            logger.exception("sweep failed")
        await asyncio.sleep(interval)

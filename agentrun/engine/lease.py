"""A run's lease: the exclusive right to drive it and write its chunks, one holder at a time, across
processes. Renewed while held; a holder that dies stops renewing and the lease is taken over once expired.

``announce`` appends chunks to a run outside a segment (background task news), under the lease.
"""

from __future__ import annotations

import asyncio
import logging

from django.db import InterfaceError, OperationalError

from agentrun.engine import store
from agentrun.engine.runtime import db
from agentrun.fanout import RunPublisher

logger = logging.getLogger("agentrun.engine")

# Errors of the database connection itself (not of a query): retried by taking the run over later.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)


class RunLease:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.owner = store.new_lease_owner()
        self._heartbeat: asyncio.Task | None = None

    async def __aenter__(self) -> RunLease:
        await db(store.recover_connection)()  # a connection broken by a database restart is replaced
        delay = 0.01
        while not await db(store.acquire_lease)(self.run_id, self.owner):
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)
        self._heartbeat = asyncio.create_task(self._beat())
        return self

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(store.lease_ttl().total_seconds() / 3)
            try:
                await db(store.renew_lease)(self.run_id, self.owner)
            except Exception:  # a database hiccup must not stop the heartbeat for good
                logger.warning("could not renew the lease of %s", self.run_id, exc_info=True)
                await db(store.recover_connection)()

    async def __aexit__(self, exc_type: type | None, *exc: object) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if exc_type is not None and issubclass(exc_type, DATABASE_UNAVAILABLE):
            # The database went away mid-segment: keep the lease; once it expires a sweep continues
            # the run from what was committed (see Segment.run).
            return
        await db(store.release_lease)(self.run_id, self.owner)


async def announce(run_id: str, chunks: list[tuple[str, dict]]) -> None:
    """Append chunks to a run outside a segment (background task news), under the run's lease."""
    publisher = RunPublisher(run_id)
    async with RunLease(run_id):
        run = await db(store.load_run)(run_id)
        log = store.ChunkLog(run_id, run.next_seq, [publisher])
        for type_, payload in chunks:
            log.emit(type_, payload)
        await db(log.flush_sync)()
    await publisher.aclose()

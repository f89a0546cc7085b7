"""A run's lease: the exclusive right to drive it and write its chunks, one holder at a time, across
processes. Renewed while held; a holder that dies stops renewing and the lease is taken over once expired.
The lease's SQL lives here too: taking, renewing and releasing it, and the sweep's claim on runs whose
driver died (``claim_stalled_runs``).

``announce`` appends chunks to a run outside a segment (background task news), under the lease.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agentrun.core import outages, prepared
from agentrun.core.chunks import ChunkType
from agentrun.core.fanout import RunPublisher
from agentrun.core.ids import new_id
from agentrun.core.models import Run, RunChunk, SuspendedToolCall
from agentrun.core.outages import INFRASTRUCTURE_ERRORS
from agentrun.engine import store
from agentrun.engine.chunklog import ChunkLog, LeaseLost
from agentrun.engine.runtime import db, recover_connection

logger = logging.getLogger("agentrun.engine")


# --- the lease's SQL ------------------------------------------------------------------------------
def lease_ttl() -> timedelta:
    return timedelta(seconds=settings.AGENTRUN_LEASE_SECONDS)


# A sweeper that dispatches a continuation for a stalled run marks the run with a lease owned by
# ``dispatch:…`` first (one sweeper of many wins it), so that it is not dispatched again on every
# sweep round while the continuation waits in the task queue. Any segment may take such a lease over.
DISPATCH_OWNER_PREFIX = "dispatch:"


def new_lease_owner() -> str:
    # host:pid names the process that drives a run (operators, and the crash tests, can find it).
    return f"{socket.gethostname()[:20]}:{os.getpid()}:{new_id('lease')[-12:]}"


def acquire_lease(run_id: str, owner: str) -> bool:
    now = timezone.now()
    taken = (
        Run.objects.filter(pk=run_id)
        .filter(
            Q(lease_owner__isnull=True)
            | Q(lease_expires_at__lt=now)
            | Q(lease_owner=owner)
            | Q(lease_owner__startswith=DISPATCH_OWNER_PREFIX)
        )
        .update(lease_owner=owner, lease_expires_at=now + lease_ttl())
    )
    return taken == 1


def _lease_sql() -> str:
    """The UPDATE that takes a run's lease (``acquire_lease``'s conditions) and returns the run: started
    if it was queued, with its log's latest start/finish and its last seq, read backwards on the log's
    (run, seq) key. One statement, SQL written once (``agentrun.core.prepared``)."""
    runs = prepared.table(Run)
    chunks = prepared.table(RunChunk)
    seq, type_, run_id = (chunks.column(n) for n in ("seq", "type", "run"))
    status, started_at = runs.column("status"), runs.column("started_at")
    owner_col, expires = runs.column("lease_owner"), runs.column("lease_expires_at")
    return (
        f"UPDATE {runs.name} SET {owner_col} = %s, {expires} = %s, "
        f"{started_at} = CASE WHEN {status} = %s THEN %s ELSE {started_at} END, "
        f"{status} = CASE WHEN {status} = %s THEN %s ELSE {status} END "
        f"WHERE {runs.column('id')} = %s AND ({owner_col} IS NULL OR {expires} < %s OR {owner_col} = %s "
        f"OR SUBSTR({owner_col}, 1, {len(DISPATCH_OWNER_PREFIX)}) = %s) "
        f"RETURNING {runs.select.replace(runs.name + '.', '')}, "
        f"(SELECT c.{type_} FROM {chunks.name} c WHERE c.{run_id} = {runs.name}.{runs.column('id')} "
        f"AND c.{type_} IN ('start', 'finish') ORDER BY c.{seq} DESC LIMIT 1), "
        f"(SELECT c.{seq} FROM {chunks.name} c WHERE c.{run_id} = {runs.name}.{runs.column('id')} "
        f"ORDER BY c.{seq} DESC LIMIT 1)"
    )


_LEASE_SQL: dict[str, str] = {}


def take_run_to_drive(run_id: str, owner: str) -> Run | None:
    """Take the run's lease and read the run, in one statement; None if another holds the lease.

    A queued run is started by the same UPDATE (``started_now``): whoever drives a queued run starts
    it. ``segment_open``: the run's log has a ``start`` with no ``finish`` after it."""
    vendor = prepared.connection().vendor
    sql = _LEASE_SQL.get(vendor) or _LEASE_SQL.setdefault(vendor, _lease_sql())
    runs = prepared.table(Run)
    now = timezone.now()
    at = runs.prep("lease_expires_at", now)
    queued, in_progress = Run.Status.QUEUED, Run.Status.IN_PROGRESS
    params = [owner, runs.prep("lease_expires_at", now + lease_ttl()), queued, at, queued, in_progress]
    rows = prepared.fetch(sql, [*params, run_id, at, owner, DISPATCH_OWNER_PREFIX])
    if not rows:
        return None
    run: Any = runs.instance(rows[0])
    boundary, last_seq = rows[0][-2:]
    if (last_seq or 0) != run.next_seq - 1:
        # The UPDATE waited for the lock of a writer that committed chunks meanwhile: on PostgreSQL
        # (READ COMMITTED) its subqueries read the log as it was before that wait, while the row is
        # the writer's. The log is read again (every seq below next_seq is logged once committed).
        boundary = _latest_boundary(run_id)
    run.segment_open = boundary == "start"
    run.started_now = run.status == in_progress and run.started_at == now
    return run


def create_run_to_drive(**fields: Any) -> Run:
    """``store.create_run`` for a creator that drives the run at once: its INSERT starts the run and
    takes its lease (``RunLease(taken=run)``), one statement and one commit fewer than taking the lease
    after it (docs/performance.md#sixth-pass)."""
    run: Any = store.create_run(**fields, lease=(new_lease_owner(), timezone.now() + lease_ttl()))
    run.segment_open, run.started_now = False, True
    return run


def _latest_boundary(run_id: str) -> str | None:
    """The type of the run's latest ``start`` or ``finish`` chunk."""
    latest = RunChunk.objects.filter(run_id=run_id, type__in=["start", "finish"]).order_by("-seq")
    return latest.values_list("type", flat=True).first()


def renew_lease(run_id: str, owner: str) -> bool:
    return Run.objects.filter(pk=run_id, lease_owner=owner).update(lease_expires_at=timezone.now() + lease_ttl()) == 1


def release_lease(run_id: str, owner: str) -> None:
    Run.objects.filter(pk=run_id, lease_owner=owner).update(lease_owner=None, lease_expires_at=None)


def expire_leases_of_this_process() -> int:
    """A process leaving mid-segment (its drain ran out): let a sweep take its runs over now rather
    than after the lease period."""
    prefix = new_lease_owner().rsplit(":", 1)[0] + ":"
    return Run.objects.filter(lease_owner__startswith=prefix).update(lease_expires_at=timezone.now())


def claim_stalled_runs(limit: int = 100) -> list[tuple[str, str]]:
    """Runs nobody drives although they should be driven, claimed for this sweeper: a lease that
    expired (its holder died), or a decision whose continuation never started within a lease period.
    A final run whose lease expired is claimed too: its holder died before closing its segment (the
    run was cancelled meanwhile, say), and the continuation closes it (``Segment.run``).

    Each is marked dispatched (a ``dispatch:…`` lease) in the transaction that finds it, so it is
    dispatched once per lease period whatever the number of sweepers; rows another sweeper is
    claiming are skipped (``SKIP LOCKED``), never waited for. Both queries run on partial indexes
    (``run_lease_expiry``, ``suspended_call_decided``): their cost follows the runs in flight.
    Returns ``(agent_id, run_id)`` pairs.
    """
    now = timezone.now()
    grace = now - lease_ttl()
    undriven = SuspendedToolCall.objects.filter(
        status__in=[SuspendedToolCall.Status.DECIDED, SuspendedToolCall.Status.EXECUTING],
        decision__decided_at__lt=grace,
    ).values("run_id")
    with transaction.atomic():
        claimable = Run.objects.select_for_update(skip_locked=True, of=("self",))
        rows = list(
            claimable.filter(lease_owner__isnull=False, lease_expires_at__lt=now)
            .order_by("lease_expires_at")
            .values_list("agent_id", "id")[:limit]
        )
        if len(rows) < limit:
            rows += claimable.filter(lease_owner__isnull=True, pk__in=undriven).values_list("agent_id", "id")[
                : limit - len(rows)
            ]
        if rows:
            Run.objects.filter(pk__in=[run_id for _, run_id in rows]).update(
                lease_owner=f"{DISPATCH_OWNER_PREFIX}{new_id('lease')[-12:]}", lease_expires_at=now + lease_ttl()
            )
    return rows


# --- holding a lease ------------------------------------------------------------------------------


class RunLease:
    """``owner``: re-take a lease this process held before (a segment retried after an outage).
    ``drive``: the lease is taken for a segment, by ``take_run_to_drive`` (the run read, and started, by
    the same statement; the run is ``loaded``), then ``then(run)`` reads what else the segment needs
    first, in the same trip to the database thread (its result is ``read``). ``released``: the
    holder's last write released it already (its UPDATE cleared the lease: ``RELEASED``), so leaving
    costs no statement. ``taken``: a run this process just created with its lease
    (``create_run_to_drive``): it is ``loaded`` as it is, and ``then`` is not called (a run that just
    started has nothing more to read)."""

    def __init__(
        self,
        run_id: str,
        owner: str | None = None,
        *,
        drive: bool = False,
        then: Callable[[Run], Any] | None = None,
        taken: Run | None = None,
    ) -> None:
        self.run_id = run_id
        self.owner = (taken.lease_owner if taken is not None else owner) or new_lease_owner()
        self.drive = drive
        self.then = then
        self.taken = taken
        self.loaded: Any = None
        self.read: Any = None
        self.released = False
        self._heartbeat: asyncio.Task | None = None

    def _take(self) -> bool:
        recover_connection()  # a connection broken by a database restart is replaced
        if self.drive:
            self.loaded = take_run_to_drive(self.run_id, self.owner)
            if self.loaded is not None and self.then is not None:
                self.read = self.then(self.loaded)
            return self.loaded is not None
        return acquire_lease(self.run_id, self.owner)

    async def __aenter__(self) -> RunLease:
        delay = 0.01
        self.loaded = self.taken
        while self.taken is None and not await db(self._take)():
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)
        self._heartbeat = asyncio.create_task(self._beat())
        return self

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(lease_ttl().total_seconds() / 3)
            try:
                if not await db(renew_lease)(self.run_id, self.owner):
                    # Stalled past the lease: another process may drive the run now. This one's log
                    # writes are fenced (ChunkLog.owner): its next one raises LeaseLost.
                    logger.warning("run %s: lease lost to another process", self.run_id)
                    return
            except INFRASTRUCTURE_ERRORS as exc:  # a database hiccup must not stop the heartbeat for good
                outages.failed(exc)
                await db(recover_connection)()
            except Exception:
                logger.warning("could not renew the lease of %s", self.run_id, exc_info=True)

    async def __aexit__(self, exc_type: type | None, *exc: object) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if exc_type is not None and issubclass(exc_type, (*INFRASTRUCTURE_ERRORS, LeaseLost)):
            # The database or the channel layer went away mid-segment: keep the lease (the retry of
            # dispatch.continue_run re-takes it; else, once it expires, a sweep continues the run
            # from what was committed, see Segment.run).
            return
        if not self.released:
            await db(release_lease)(self.run_id, self.owner)


async def announce(run_id: str, chunks: list[tuple[ChunkType, dict]]) -> None:
    """Append chunks to a run outside a segment (background task news), under the run's lease."""
    publisher = RunPublisher(run_id)
    async with RunLease(run_id) as lease:
        run = await db(store.load_run)(run_id)
        log = ChunkLog(run_id, run.next_seq, [publisher], owner=lease.owner)
        for type_, payload in chunks:
            log.emit(type_, payload, hold=True)  # shown once logged: the news is in the log or nowhere
        await db(log.flush_sync)()
        log.committed()
    await publisher.aclose()

"""Retention (docs/operations.md "Retention"): what is removed once it is old enough, in bounded batches.

Each kind of record has a retention (``settings.AGENTRUN_RETENTION``, seconds; None: kept forever) and
a query for its rows past it, oldest first, on an index of its own (so a round that finds nothing costs
an index probe). The sweep (``prune_due``, every ``AGENTRUN_PRUNE_SECONDS`` in each sweeping process)
removes at most ``AGENTRUN_PRUNE_BATCH`` rows of each kind per round, each batch its own short
transaction (no long lock); a kind whose batch was full goes on at the next round. ``python manage.py
agentrun_prune [--dry-run]`` does it all at once, or says what it would remove.

The audit record is never pruned: runs, decisions, messages and steps stay. A final run's chunk log is
compacted (its chunks removed; the messages and steps are its record) only when
``AGENTRUN_RETAIN_CHUNKS_DAYS`` is set. The notifications app adds its kinds (webhook deliveries,
email notices) with ``add_kind``; an outbox event takes its deliveries and notices along when it goes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from agentrun.core.models import (
    RUN_ENDED_AT,
    RUN_FINAL_STATUSES,
    IdempotencyKey,
    OutboxEvent,
    RetentionCursor,
    Run,
    RunChunk,
    WorkerHeartbeat,
)


@dataclass(frozen=True)
class Kind:
    """A kind of record the retention removes: ``due(cutoff)`` are its rows older than the cutoff,
    ordered oldest first on an index. ``rank``: kinds are pruned in rank order (dependents first)."""

    name: str  # as printed: "outbox events"
    setting: str  # the environment variable of its retention
    key: str  # its entry in settings.AGENTRUN_RETENTION
    due: Callable[[datetime], QuerySet]
    rank: int = 50


def _task_results(cutoff: datetime) -> QuerySet:
    from django_tasks_db.models import DBTaskResult

    # On the partial index agentrun_task_finished (migration 0012_operations).
    finished = DBTaskResult.objects.filter(status__in=["SUCCESSFUL", "FAILED"], finished_at__lt=cutoff)
    return finished.order_by("finished_at")


KINDS: list[Kind] = [
    Kind(
        "outbox events",
        "AGENTRUN_RETAIN_EVENTS_DAYS",
        "events",
        lambda cutoff: OutboxEvent.objects.filter(handled_at__isnull=False, created_at__lt=cutoff).order_by(
            "created_at"
        ),
    ),
    Kind(
        "idempotency keys",
        "AGENTRUN_RETAIN_IDEMPOTENCY_HOURS",
        "idempotency_keys",
        lambda cutoff: IdempotencyKey.objects.filter(created_at__lt=cutoff).order_by("created_at"),
    ),
    Kind(
        "worker heartbeats",
        "AGENTRUN_RETAIN_HEARTBEATS_DAYS",
        "heartbeats",
        lambda cutoff: WorkerHeartbeat.objects.filter(seen_at__lt=cutoff).order_by("seen_at"),
    ),
    Kind("task results", "AGENTRUN_RETAIN_TASKS_DAYS", "task_results", _task_results),
]
CHUNK_LOGS = "chunk logs"
CHUNKS_SETTING = "AGENTRUN_RETAIN_CHUNKS_DAYS"
CHUNKS_CURSOR = "chunk_logs"


def add_kind(kind: Kind) -> None:
    """Register another app's kind (``AppConfig.ready``); the same name twice counts once."""
    if all(k.name != kind.name for k in KINDS):
        KINDS.append(kind)
        KINDS.sort(key=lambda k: k.rank)


def retention(key: str) -> timedelta | None:
    seconds = settings.AGENTRUN_RETENTION.get(key)
    return None if seconds is None else timedelta(seconds=seconds)


@dataclass
class Pruned:
    name: str
    setting: str
    removed: int  # rows (chunk logs: chunks), or how many would be removed (dry run)
    kept_forever: bool = False
    more: bool = False  # the batch was full: there may be more


def prune_kind(kind: Kind, *, now: datetime, batch: int) -> Pruned:
    keep = retention(kind.key)
    if keep is None:
        return Pruned(kind.name, kind.setting, 0, kept_forever=True)
    with transaction.atomic():
        ids = list(kind.due(now - keep).values_list("pk", flat=True)[:batch])
        if ids:
            kind.due(now - keep).model.objects.filter(pk__in=ids).delete()
    return Pruned(kind.name, kind.setting, len(ids), more=len(ids) == batch)


def _ended_runs(cutoff: datetime) -> QuerySet:
    """Final runs that ended before ``cutoff``, after the cursor, in the order they ended (index ``run_ended``)."""
    runs = Run.objects.filter(status__in=RUN_FINAL_STATUSES).annotate(ended=RUN_ENDED_AT).filter(ended__lt=cutoff)
    cursor = RetentionCursor.objects.filter(name=CHUNKS_CURSOR).first()
    if cursor is not None:
        runs = runs.filter(Q(ended__gt=cursor.position_at) | Q(ended=cursor.position_at, id__gt=cursor.position_id))
    return runs.order_by("ended", "id")


def compact_chunk_logs(*, now: datetime, batch: int) -> Pruned:
    """Remove the chunks of up to ``batch`` runs final for longer than the retention (their messages and
    steps stay: the run's record), moving the cursor past them."""
    keep = retention("chunk_logs")
    if keep is None:
        return Pruned(CHUNK_LOGS, CHUNKS_SETTING, 0, kept_forever=True)
    with transaction.atomic():
        runs = list(_ended_runs(now - keep).values_list("id", "ended")[:batch])
        if not runs:
            return Pruned(CHUNK_LOGS, CHUNKS_SETTING, 0)
        removed, _ = RunChunk.objects.filter(run_id__in=[run_id for run_id, _ in runs]).delete()
        last_id, last_ended = runs[-1]
        RetentionCursor.objects.update_or_create(
            name=CHUNKS_CURSOR, defaults={"position_at": last_ended, "position_id": last_id}
        )
    return Pruned(CHUNK_LOGS, CHUNKS_SETTING, removed, more=len(runs) == batch)


def prune_once(*, now: datetime | None = None, batch: int | None = None) -> list[Pruned]:
    """One batch of every kind (the sweep's round)."""
    now = now or timezone.now()
    batch = batch or settings.AGENTRUN_PRUNE_BATCH
    return [*(prune_kind(kind, now=now, batch=batch) for kind in KINDS), compact_chunk_logs(now=now, batch=batch)]


def prune_all(*, now: datetime | None = None, batch: int | None = None) -> dict[str, Pruned]:
    """Every batch of every kind until nothing is left past its retention (``agentrun_prune``)."""
    now = now or timezone.now()
    totals: dict[str, Pruned] = {}
    pending = True
    while pending:
        pending = False
        for pruned in prune_once(now=now, batch=batch):
            total = totals.setdefault(
                pruned.name, Pruned(pruned.name, pruned.setting, 0, kept_forever=pruned.kept_forever)
            )
            total.removed += pruned.removed
            pending = pending or pruned.more
    return totals


def would_prune(*, now: datetime | None = None) -> dict[str, Pruned]:
    """What ``prune_all`` would remove now, counted (``agentrun_prune --dry-run``)."""
    now = now or timezone.now()
    found = {}
    for kind in KINDS:
        keep = retention(kind.key)
        count = 0 if keep is None else kind.due(now - keep).count()
        found[kind.name] = Pruned(kind.name, kind.setting, count, kept_forever=keep is None)
    keep = retention("chunk_logs")
    chunks = 0
    if keep is not None:
        chunks = RunChunk.objects.filter(run_id__in=_ended_runs(now - keep).values("id")).count()
    found[CHUNK_LOGS] = Pruned(CHUNK_LOGS, CHUNKS_SETTING, chunks, kept_forever=keep is None)
    return found


_last_round = 0.0
_more = False


def prune_due() -> list[Pruned]:
    """The sweep's part: a round every ``AGENTRUN_PRUNE_SECONDS``, or at once while a kind has more."""
    global _last_round, _more
    if not _more and time.monotonic() - _last_round < settings.AGENTRUN_PRUNE_SECONDS:
        return []
    _last_round = time.monotonic()
    pruned = prune_once()
    _more = any(p.more for p in pruned)
    return pruned

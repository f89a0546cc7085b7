"""A run's chunk log: every chunk numbered (``seq``), handed to the live sinks, and written to
``RunChunk`` in batches — with each state change, in its transaction, before each model call, and at
the end of a segment. Only the holder of the run's lease writes it (``engine/lease.py``).
"""

from __future__ import annotations

import json
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from agentrun.core.chunks import Chunk, ChunkType
from agentrun.core.models import Run, RunChunk

# A buffered chunk: (seq, type, payload). No model instance per chunk: the log is written by one
# INSERT per batch (``insert_chunks``), the worker's largest cost per chunk before (docs/performance.md
# "Fan-out (third pass)", "Fourth pass").
Row = tuple[int, str, dict]


class LeaseLost(Exception):  # noqa: N818 - a state, not an error of ours
    """The run's lease went to another process (this one stalled past it): it writes nothing more."""


# --- the chunk log --------------------------------------------------------------------------------
class ChunkLog:
    """Numbers a run's chunks, hands them to the live sinks and writes them to the log in batches.

    Batching: chunks are written when a state change commits (in the same transaction), when the
    buffer is full, and at the end of the segment, so a token stream costs few round trips. Until
    then a chunk is live only: a driver that dies may have shown chunks the log never gets (its taker
    re-uses those seqs, README "Production").

    Announcements are never live only. A chunk emitted with ``hold=True`` announces a state change
    about to be written (a tool result, calls opened, an answer, the segment's ``finish``): the write
    that changes the state logs it in its transaction, and it reaches the sinks once that write
    committed (``committed``). So a process dying right after a commit has logged what the commit
    means, and no reader is shown a change that never happened. Chunks emitted after a held one wait
    with it (order is kept).

    ``owner``: the lease the writer holds. Every write is fenced by it: a driver that stalled past its
    lease while another process took the run over gets ``LeaseLost`` and its transaction rolls back,
    instead of writing over the taker's seqs.

    Whoever writes the log says how the write ended: ``committed()``, or ``rolled_back()`` — nothing it
    took is logged then: the held chunks are dropped and their seqs handed out again, the others
    (already shown live) are buffered again under the same seqs, so the log never has a gap.
    """

    BATCH = 200

    def __init__(self, run_id: str, next_seq: int, sinks: list, owner: str | None = None) -> None:
        self.run_id = run_id
        self.owner = owner
        self.next_seq = next_seq
        self.sinks = sinks
        self.buffer: list[Row] = []
        self.held: list[Chunk] = []  # emitted, not handed to the sinks yet
        self.taken: list[Row] = []  # taken by a write not known to have committed yet

    def emit(self, type_: ChunkType, payload: dict, *, hold: bool = False) -> Chunk:
        seq = self.next_seq
        chunk: Chunk = {"type": type_, "runId": self.run_id, "from": "AGENT", "seq": seq, "payload": payload}
        self.buffer.append((seq, type_, payload))
        self.next_seq = seq + 1
        if hold or self.held:
            self.held.append(chunk)
        else:
            self._publish(chunk)
        return chunk

    def _publish(self, chunk: Chunk) -> None:
        for sink in self.sinks:
            sink(chunk)

    @property
    def full(self) -> bool:
        return len(self.buffer) >= self.BATCH

    def flush_sync(self, **run_fields: Any) -> None:
        """Write the buffered chunks and the run's ``next_seq``; ``run_fields`` go in the same UPDATE, so
        a state change that commits the chunks emitted before it costs no extra round trip."""
        if not self.buffer and not run_fields:
            return
        batch, next_seq = self._take()
        # No savepoint inside a caller's transaction: nothing catches a failure here, which fails the
        # caller's transaction anyway.
        with transaction.atomic(savepoint=False):
            self.fenced_update(next_seq=next_seq, **run_fields)
            if batch:
                insert_chunks(self.run_id, batch)

    def run_row(self) -> Any:
        """The run's row, as long as the writer holds its lease (a queryset)."""
        row = Run.objects.filter(pk=self.run_id)
        return row if self.owner is None else row.filter(lease_owner=self.owner)

    def fenced_update(self, **fields: Any) -> None:
        """UPDATE the run's row; ``LeaseLost`` when the lease is another's (the caller's transaction
        then rolls back). First in a write, so that the row lock orders writers before their chunks."""
        if not self.run_row().update(**fields) and Run.objects.filter(pk=self.run_id).exists():
            raise LeaseLost(self.run_id)

    def _take(self) -> tuple[list[Row], int]:
        batch, self.buffer = self.buffer, []
        self.taken += batch
        return batch, self.next_seq

    def take_buffer(self) -> tuple[list[RunChunk], int]:
        """The chunks to write (``RunChunk`` instances, for ``bulk_create``), and the run's next_seq once
        they are written (the caller writes both)."""
        batch, next_seq = self._take()
        return [RunChunk(run_id=self.run_id, seq=seq, type=t, payload=p) for seq, t, p in batch], next_seq

    def committed(self) -> None:
        """The write that took the buffer committed: the held chunks it logged go to the sinks."""
        self.taken = []
        logged = self.next_seq - len(self.buffer)  # every seq below is in the log
        ready = [c for c in self.held if c["seq"] < logged]
        self.held = self.held[len(ready) :]
        for chunk in ready:
            self._publish(chunk)

    def rolled_back(self) -> list[Chunk]:
        """The write that took the buffer failed: nothing it took is logged. Returns the held chunks,
        dropped (what they announce did not happen)."""
        unlogged, self.taken = self.taken + self.buffer, []
        dropped, self.held = self.held, []
        if dropped:
            self.next_seq = dropped[0]["seq"]
            unlogged = [row for row in unlogged if row[0] < self.next_seq]
        self.buffer = unlogged
        return dropped


def insert_chunks(run_id: str, rows: list[Row]) -> None:
    """Write chunks of one run to the log: one INSERT, no model instance (what ``bulk_create`` wrote:
    each payload as ``json.dumps`` makes it, the same ``created_at`` for the batch)."""
    columns = ", ".join(connection.ops.quote_name(name) for name in _COLUMNS)
    table = connection.ops.quote_name(RunChunk._meta.db_table)
    now = timezone.now()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The batch as one JSON text, made by one json.dumps call and unpacked by PostgreSQL: one
            # parameter to adapt whatever the batch's size (arrays of strings cost ~7 µs a chunk to quote).
            cursor.execute(
                f"INSERT INTO {table} ({columns}) SELECT %s, (chunk->>0)::integer, chunk->>1, chunk->2, %s "
                "FROM jsonb_array_elements(%s::jsonb) AS chunk",
                [run_id, now, json.dumps(rows)],
            )
        else:
            stamp = connection.ops.adapt_datetimefield_value(now)
            cursor.executemany(
                f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s, %s)",
                [(run_id, seq, type_, json.dumps(payload), stamp) for seq, type_, payload in rows],
            )


_COLUMNS = ("run_id", "seq", "type", "payload", "created_at")  # RunChunk's

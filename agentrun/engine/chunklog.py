"""A run's chunk log: every chunk numbered (``seq``), handed to the live sinks, and written to
``RunChunk`` in batches — with each state change, in its transaction, before each model call, and at
the end of a segment. Only the holder of the run's lease writes it (``engine/lease.py``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentrun.core import prepared
from agentrun.core.chunks import Chunk, ChunkType
from agentrun.core.models import Run, RunChunk

# A buffered chunk: (seq, type, payload). No model instance per chunk: the log is written by one
# INSERT per batch (``_chunks_statement``), the worker's largest cost per chunk before (docs/performance.md
# "Fan-out (third pass)", "Fourth pass").
Row = tuple[int, str, dict]


class LeaseLost(Exception):  # noqa: N818 - a state, not an error of ours
    """The run's lease went to another process (this one stalled past it): it writes nothing more."""


@dataclass(frozen=True)
class Added:
    """A run column increased by ``amount`` in the UPDATE (``step_count=Added(1)``)."""

    amount: int


_UPDATES: dict[tuple, str] = {}


def _update_sql(names: tuple[str, ...], added: frozenset[str], fenced: bool, unless_final: bool) -> str:
    """The UPDATE of one run's columns, returning its status, written once per shape
    (``agentrun.core.prepared``)."""
    key = (prepared.connection().vendor, names, added, fenced, unless_final)
    sql = _UPDATES.get(key)
    if sql is None:
        runs = prepared.table(Run)
        sets = ", ".join(
            f"{runs.column(n)} = {runs.column(n)} + %s" if n in added else f"{runs.column(n)} = %s" for n in names
        )
        sql = f"UPDATE {runs.name} SET {sets} WHERE {runs.column('id')} = %s"
        if fenced:
            sql += f" AND {runs.column('lease_owner')} = %s"
        if unless_final:
            sql += f" AND {runs.column('status')} NOT IN ({', '.join(['%s'] * len(Run.FINAL_STATUSES))})"
        _UPDATES[key] = sql = f"{sql} RETURNING {runs.column('status')}"
    return sql


def _update_params(run_id: str, fields: dict[str, Any], owner: str | None, unless_final: bool) -> list[Any]:
    runs = prepared.table(Run)
    params = [v.amount if isinstance(v, Added) else runs.prep(n, v) for n, v in fields.items()]
    params.append(run_id)
    if owner is not None:
        params.append(owner)
    if unless_final:
        params += list(Run.FINAL_STATUSES)
    return params


def _shape(fields: dict[str, Any]) -> tuple[tuple[str, ...], frozenset[str]]:
    return tuple(fields), frozenset(n for n, v in fields.items() if isinstance(v, Added))


def update_run(
    run_id: str, fields: dict[str, Any], *, owner: str | None = None, unless_final: bool = False
) -> str | None:
    """UPDATE one run's ``fields`` (values, or ``Added``), as long as ``owner`` holds its lease (when
    given) and it is not final (``unless_final``). The run's status after it, or None when no row
    changed."""
    sql = _update_sql(*_shape(fields), owner is not None, unless_final)
    rows = prepared.fetch(sql, _update_params(run_id, fields, owner, unless_final))
    return rows[0][0] if rows else None


_CHUNK_INSERTS: dict[tuple[str, int], tuple[str, str]] = {}


def _chunks_statement(run_id: str, batch: list[Row]) -> prepared.Statement:
    """The INSERT of the batch, in one statement (gated: as ``prepared.run_gated`` runs it), each payload
    as ``json.dumps`` makes it (what ``JSONField`` writes), the batch's time as every chunk's
    ``created_at``. On PostgreSQL the batch is one JSON text unpacked by the database: one parameter to
    adapt whatever the batch's size (a parameter per column of every chunk cost ~7 µs a chunk to quote).
    Its SQL is written once per database (and, on SQLite, per batch size)."""
    vendor = prepared.connection().vendor
    key = (vendor, 0 if vendor == "postgresql" else len(batch))
    sqls = _CHUNK_INSERTS.get(key)
    chunks = prepared.table(RunChunk)
    if sqls is None:
        columns = ", ".join(chunks.column(n) for n in ("run_id", "seq", "type", "payload", "created_at"))
        head = f"INSERT INTO {chunks.name} ({columns})"
        if vendor == "postgresql":
            select = (
                "SELECT %s, (chunk->>0)::integer, chunk->>1, chunk->2, %s::timestamptz "
                "FROM jsonb_array_elements(%s::jsonb) AS chunk"
            )
            sqls = (f"{head} {select}", f"{head} {select} WHERE EXISTS (SELECT 1 FROM {prepared.GATE})")
        else:
            rows = ", ".join(["(%s, %s, %s, %s, %s)"] * len(batch))
            sqls = (f"{head} VALUES {rows}", "")
        _CHUNK_INSERTS[key] = sqls
    now = chunks.prep("created_at", timezone.now())
    if vendor == "postgresql":
        params: list[Any] = [run_id, now, json.dumps(batch)]
    else:
        params = []
        for seq, type_, payload in batch:
            params += [run_id, seq, type_, json.dumps(payload), now]
    return prepared.Statement(sqls[0], params, sqls[1])


def write_run_and_chunks(
    run_id: str,
    fields: dict[str, Any],
    batch: list[Row],
    *,
    owner: str | None = None,
    unless_final: bool = False,
    also: Sequence[prepared.Statement] = (),
) -> str | None:
    """UPDATE the run (``update_run``) and, if that changed its row, INSERT the batch and run ``also``
    (the rest of the write): one statement on PostgreSQL (``prepared.run_gated``), in order elsewhere
    (the caller holds a transaction). The run's status after it, or None when no row changed (then
    nothing was written)."""
    first = prepared.Statement(
        _update_sql(*_shape(fields), owner is not None, unless_final),
        _update_params(run_id, fields, owner, unless_final),
    )
    rest = [_chunks_statement(run_id, batch)] if batch else []
    rows = prepared.run_gated(first, [*rest, *also])
    return rows[0][0] if rows else None


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
        # The run's status as the last fenced write left it (its UPDATE returns it): whether the run was
        # cancelled meanwhile is known without a query of its own (``Segment._model_loop``).
        self.status_written: str | None = None

    def emit(self, type_: ChunkType, payload: dict, *, hold: bool = False) -> Chunk:
        chunk: Chunk = {"type": type_, "runId": self.run_id, "from": "AGENT", "seq": self.next_seq, "payload": payload}
        self.buffer.append((self.next_seq, type_, payload))
        self.next_seq += 1
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

    def flush_sync(self, also: Sequence[prepared.Statement] = (), **run_fields: Any) -> None:
        """Write the buffered chunks and the run's ``next_seq``; ``run_fields`` go in the same UPDATE, so
        a state change that commits the chunks emitted before it costs no extra round trip."""
        if not self.buffer and not run_fields and not also:
            return
        batch, next_seq = self.take_buffer()
        if prepared.one_statement():  # atomic on its own
            self.fenced_write({"next_seq": next_seq, **run_fields}, batch, also)
            return
        # No savepoint inside a caller's transaction: nothing catches a failure here, which fails the
        # caller's transaction anyway.
        with transaction.atomic(savepoint=False):
            self.fenced_write({"next_seq": next_seq, **run_fields}, batch, also)

    def write(
        self,
        fields: dict[str, Any],
        batch: list[Row],
        also: Sequence[prepared.Statement] = (),
        *,
        unless_final: bool = False,
    ) -> str | None:
        """UPDATE the run's row, as long as the writer holds its lease (and, ``unless_final``, the run
        is not final), then, if it did, INSERT the batch and run ``also`` (``write_run_and_chunks``);
        the run's status after it, None when nothing was written."""
        return write_run_and_chunks(self.run_id, fields, batch, owner=self.owner, unless_final=unless_final, also=also)

    def fenced_write(self, fields: dict[str, Any], batch: list[Row], also: Sequence[prepared.Statement] = ()) -> None:
        """UPDATE the run's row and INSERT the batch; ``LeaseLost`` when the lease is another's (nothing
        was written; the caller's transaction then rolls back). The UPDATE comes first in a write, so
        that the row lock orders writers before their chunks."""
        status = self.write(fields, batch, also)
        if status is None and Run.objects.filter(pk=self.run_id).exists():
            raise LeaseLost(self.run_id)
        self.status_written = status

    def fenced_update(self, **fields: Any) -> None:
        """``fenced_write`` without chunks."""
        self.fenced_write(fields, [])

    def take_buffer(self) -> tuple[list[Row], int]:
        """The chunks to write, and the run's next_seq once they are written (the caller writes both)."""
        batch, self.buffer = self.buffer, []
        self.taken += batch
        return batch, self.next_seq

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

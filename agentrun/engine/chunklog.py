"""A run's chunk log: every chunk numbered (``seq``), handed to the live sinks at once, and written to
``RunChunk`` in batches — with each state change, in its transaction, before each model call, and at
the end of a segment. Only the holder of the run's lease writes it (``engine/lease.py``).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from agentrun.core.models import Run, RunChunk


# --- the chunk log --------------------------------------------------------------------------------
class ChunkLog:
    """Numbers a run's chunks, hands each to the live sinks at once and writes them to the log in batches.

    Batching: chunks are written when a state change commits (in the same transaction), when the
    buffer is full, and at the end of the segment, so a token stream costs few round trips.
    """

    BATCH = 200

    def __init__(self, run_id: str, next_seq: int, sinks: list) -> None:
        self.run_id = run_id
        self.next_seq = next_seq
        self.sinks = sinks
        self.buffer: list[RunChunk] = []

    def emit(self, type_: str, payload: dict) -> dict:
        chunk = {"type": type_, "runId": self.run_id, "from": "AGENT", "seq": self.next_seq, "payload": payload}
        self.buffer.append(RunChunk(run_id=self.run_id, seq=self.next_seq, type=type_, payload=payload))
        self.next_seq += 1
        for sink in self.sinks:
            sink(chunk)
        return chunk

    @property
    def full(self) -> bool:
        return len(self.buffer) >= self.BATCH

    def flush_sync(self, **run_fields: Any) -> None:
        """Write the buffered chunks and the run's ``next_seq``; ``run_fields`` go in the same UPDATE, so
        a state change that commits the chunks emitted before it costs no extra round trip."""
        if not self.buffer and not run_fields:
            return
        batch, next_seq = self.take_buffer()
        # No savepoint inside a caller's transaction: nothing catches a failure here, which fails the
        # caller's transaction anyway.
        with transaction.atomic(savepoint=False):
            if batch:
                RunChunk.objects.bulk_create(batch)
            Run.objects.filter(pk=self.run_id).update(next_seq=next_seq, **run_fields)

    def take_buffer(self) -> tuple[list[RunChunk], int]:
        """The chunks to write, and the run's next_seq once they are written (the caller writes both)."""
        batch, self.buffer = self.buffer, []
        return batch, self.next_seq

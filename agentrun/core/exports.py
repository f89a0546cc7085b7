"""Decisions as files: CSV (spreadsheet-safe) and JSON, read in batches so that any number streams.

The admin's "Export selected decisions as CSV" and the history page's exports (docs/dashboard.md#history)
both write these columns and cells.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models import Q, QuerySet

from agentrun.core.models import Decision

CSV_COLUMNS = [
    "id",
    "decided_at",
    "kind",
    "agent_id",
    "run_id",
    "thread_id",
    "tool_call_id",
    "tool_name",
    "risk",
    "decided_by_username",
    "via",
    "reason",
    "args",
    "edited_args",
    "resume_data",
    "inner_agent_id",
    "inner_tool_name",
    "inner_args",
    "args_fingerprint",
]
JSON_COLUMNS = ("args", "edited_args", "resume_data", "inner_args")

# A cell a spreadsheet would read as a formula (=HYPERLINK(…), +, -, @, or a tab or CR before one) is
# written with a leading apostrophe, which spreadsheets show as text (OWASP, "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

EXPORT_BATCH = 1000


def csv_cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def decision_csv_row(decision: Decision) -> list[Any]:
    """One decision as the cells of ``CSV_COLUMNS``: JSON for the argument columns, ISO 8601 for the time."""
    row = []
    for column in CSV_COLUMNS:
        value = getattr(decision, column)
        if column in JSON_COLUMNS:
            value = "" if value is None else json.dumps(value, ensure_ascii=False)
        elif column == "decided_at":
            value = value.isoformat()
        row.append("" if value is None else csv_cell(value))
    return row


def csv_lines(rows: Iterable[list[Any]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows)
    return buffer.getvalue()


def _next_batch(decisions: QuerySet[Decision], after: tuple | None) -> list[Decision]:
    """The next ``EXPORT_BATCH`` decisions, newest first, after the ``(decided_at, id)`` of the last one read:
    a keyset page on ``decision_timeline``, so each batch costs the same however deep the export is."""
    page = decisions.order_by("-decided_at", "-id")
    if after is not None:
        at, pk = after
        page = page.filter(Q(decided_at__lt=at) | Q(decided_at=at, id__lt=pk))
    return list(page[:EXPORT_BATCH])


async def decision_batches(decisions: QuerySet[Decision]) -> AsyncIterator[list[Decision]]:
    """Every decision of ``decisions``, newest first, a batch at a time: memory holds one batch."""
    after = None
    while True:
        batch = await sync_to_async(_next_batch)(decisions, after)
        if batch:
            yield batch
        if len(batch) < EXPORT_BATCH:
            return
        after = (batch[-1].decided_at, batch[-1].id)


async def stream_csv(decisions: QuerySet[Decision]) -> AsyncIterator[bytes]:
    """A CSV file of ``decisions``: a header, then a row per decision (UTF-8)."""
    yield csv_lines([CSV_COLUMNS]).encode()
    async for batch in decision_batches(decisions):
        yield csv_lines(decision_csv_row(d) for d in batch).encode()


async def stream_json(decisions: QuerySet[Decision]) -> AsyncIterator[bytes]:
    """A JSON array of ``decisions`` in the shape of ``GET /api/decisions`` (``Decision.to_dict``)."""
    yield b"["
    first = True
    async for batch in decision_batches(decisions):
        items = ",\n".join(json.dumps(d.to_dict(), ensure_ascii=False) for d in batch)
        yield (("" if first else ",\n") + items).encode()
        first = False
    yield b"]\n"

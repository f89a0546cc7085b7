"""Cursor pagination of timelines (steps, messages, decisions), Assistants-API style.

``limit`` 1..100 (20), ``order`` asc|desc, ``after`` / ``before`` = an object id of the list: the page
holds the objects that come after (or before) it in the requested order. Two queries whatever the
page size: the cursor row, and the page (one row more than asked, to know ``hasMore``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import Model, Q, QuerySet

from agentrun.api.http import choice_param, int_param
from agentrun.core.errors import AgentRunError

MAX_LIMIT = 100
DEFAULT_LIMIT = 20


def list_envelope(data: list[dict], *, has_more: bool = False) -> dict:
    return {
        "object": "list",
        "data": data,
        "firstId": data[0]["id"] if data else None,
        "lastId": data[-1]["id"] if data else None,
        "hasMore": has_more,
    }


def _beyond(cursor: Model, time_field: str, *, later: bool) -> Q:
    """Rows strictly later (or earlier) than ``cursor`` on the (time, id) timeline."""
    moment = getattr(cursor, time_field)
    op = "gt" if later else "lt"
    return Q(**{f"{time_field}__{op}": moment}) | Q(**{time_field: moment, f"pk__{op}": cursor.pk})


def cursor_page(
    queryset: QuerySet,
    params: Any,
    *,
    time_field: str = "created_at",
    default_order: str = "desc",
    to_dict: Callable[[Any], dict] = lambda obj: obj.to_dict(),
) -> dict:
    limit = int_param(params.get("limit"), name="limit", default=DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT)
    order = choice_param(params.get("order"), name="order", choices=("asc", "desc"), default=default_order)
    ascending = order == "asc"
    after, before = params.get("after") or None, params.get("before") or None

    def cursor(object_id: str, name: str) -> Model:
        row = queryset.filter(pk=object_id).first()
        if row is None:
            raise AgentRunError("NOT_FOUND", f"{name} names no object of this list: {object_id!r}")
        return row

    rows = queryset
    if after is not None:
        rows = rows.filter(_beyond(cursor(after, "after"), time_field, later=ascending))
    if before is not None:
        rows = rows.filter(_beyond(cursor(before, "before"), time_field, later=not ascending))

    forward = (time_field, "pk") if ascending else (f"-{time_field}", "-pk")
    if before is not None and after is None:
        # The page next to the cursor, read backwards, then put back in the requested order.
        backward = tuple(f[1:] if f.startswith("-") else f"-{f}" for f in forward)
        page = list(rows.order_by(*backward)[: limit + 1])
        has_more = len(page) > limit
        page = page[:limit][::-1]
    else:
        page = list(rows.order_by(*forward)[: limit + 1])
        has_more = len(page) > limit
        page = page[:limit]
    return list_envelope([to_dict(obj) for obj in page], has_more=has_more)

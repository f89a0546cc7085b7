"""Reads. ``list_suspended_runs`` is the listing contract: snapshots, filtered and paged in SQL.
``decision_history`` is the audit trail's one filter (REST and the dashboard)."""

from __future__ import annotations

import functools
import sys
from collections.abc import AsyncIterator, Callable, Collection, Generator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection, transaction
from django.db.models import F, Func, IntegerField, OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.utils import timezone

from agentrun.core import claimstate
from agentrun.core.errors import AgentRunError
from agentrun.core.models import (
    Decision,
    Snapshot,
    SnapshotCount,
    SnapshotPeriodCount,
    SuspendedToolCall,
    args_fingerprint,
)
from agentrun.core.timeutil import iso, parse_datetime_bound

MAX_PER_PAGE = 1000
MAX_PAGE = 10**9  # page * perPage must stay a valid OFFSET on every database


@dataclass
class SuspendedRunToolCall:
    tool_call_id: str
    tool_name: str
    args: Any
    requires_approval: bool
    suspend_payload: Any
    resume_schema: dict | None
    risk: str = "medium"
    inner_agent_id: str | None = None
    inner_run_id: str | None = None
    inner_tool_call_id: str | None = None
    approvals_required: int = 1
    suspension: int = 0
    # A call surfaced from a sub-agent: the inner call the reviewer sees ({agentId, runId, toolCallId,
    # toolName, args}); and the approvals given towards a quorum ({decidedBy, decidedAt}).
    sub_agent: dict | None = None
    approvals_given: list[dict] = field(default_factory=list)
    claim: dict | None = None  # who is on it (docs/dashboard.md#shared-work): ``ClaimState.to_dict()``

    @property
    def shown_args(self) -> Any:
        """What a person deciding the call sees and approves (the inner call's, for a sub-agent's)."""
        return self.sub_agent["args"] if self.sub_agent is not None else self.args

    @property
    def args_fingerprint(self) -> str:
        return args_fingerprint(self.shown_args)

    def to_dict(self) -> dict:
        data = {
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "args": self.args,
            "requiresApproval": self.requires_approval,
            "suspendPayload": self.suspend_payload,
            "resumeSchema": self.resume_schema,
            "risk": self.risk,
            "argsFingerprint": self.args_fingerprint,
            "approvals": {"required": self.approvals_required, "given": self.approvals_given},
        }
        if self.claim is not None:  # the listings (docs/api.md#the-listing), not event payloads
            data["claim"] = self.claim
        if self.inner_run_id:
            data |= {
                "innerAgentId": self.inner_agent_id,
                "innerRunId": self.inner_run_id,
                "innerToolCallId": self.inner_tool_call_id,
                "subAgent": self.sub_agent,
            }
        return data


def describe_open_calls(
    calls: QuerySet[SuspendedToolCall], *, run_agents: dict[str, str] | None = None
) -> dict[str, list[SuspendedRunToolCall]]:
    """The open calls of ``calls`` as the listing shows them, by run id, in order: one query, plus one
    for the sub-agents' calls they surface and one for quorum approvals, each only when there are any.

    What a call shows (docs/api.md#the-listing): an edit an approver proposed while more approvals are
    needed (``pending_args``), else for a surfaced sub-agent call its inner call's arguments, else its
    own; ``argsFingerprint`` is of that.
    """
    rows = list(calls.filter(status=SuspendedToolCall.Status.OPEN).values_list(*_CALL_COLUMNS))
    inner: dict[tuple[str, str], tuple[str, Any]] = {}
    surfaced = [(r[9], r[10]) for r in rows if r[9]]
    if surfaced:
        keys = Q()
        for run_id, tool_call_id in surfaced:
            keys |= Q(run_id=run_id, tool_call_id=tool_call_id)
        for run_id, tool_call_id, tool_name, args in SuspendedToolCall.objects.filter(keys).values_list(
            "run_id", "tool_call_id", "tool_name", "args"
        ):
            inner[(run_id, tool_call_id)] = (tool_name, args)
    described: dict[str, list[SuspendedRunToolCall]] = {}
    quorum = []
    now = timezone.now()
    for row in rows:
        run_id, tool_call_id, tool_name, args, *rest, pending, required, suspension = row[:-CLAIM_COLUMNS]
        claimed_by, claimed_at, touched_at, assignee, assignee_group = row[-CLAIM_COLUMNS:]
        requires_approval, suspend_payload, resume_schema, risk, inner_agent_id, inner_run_id, inner_call_id = rest
        call = SuspendedRunToolCall(
            tool_call_id,
            tool_name,
            args,
            requires_approval,
            suspend_payload,
            resume_schema,
            risk,
            inner_agent_id,
            inner_run_id,
            inner_call_id,
            approvals_required=required,
            suspension=suspension,
        )
        call.claim = (
            None
            if run_agents is None
            else claimstate.state(
                claimed_by=claimed_by,
                claimed_at=claimed_at,
                touched_at=touched_at,
                assignee=assignee,
                assignee_group=assignee_group,
                agent_id=inner_agent_id or (run_agents or {}).get(run_id, ""),
                tool_name=tool_name,
                now=now,
            ).to_dict()
        )
        if inner_run_id:
            inner_name, inner_args = inner.get((inner_run_id, inner_call_id), (None, None))
            call.sub_agent = {
                "agentId": inner_agent_id,
                "runId": inner_run_id,
                "toolCallId": inner_call_id,
                "toolName": inner_name,
                "args": pending if pending is not None else inner_args,
            }
        elif pending is not None:
            call.args = pending
        if required > 1:
            quorum.append((run_id, call))
        described.setdefault(run_id, []).append(call)
    if quorum:
        _attach_approvals(quorum)
    return described


def _attach_approvals(quorum: list[tuple[str, SuspendedRunToolCall]]) -> None:
    """The approvals that count towards each call's quorum: on its suspension, of what it shows now."""
    approvals = Decision.objects.filter(
        run_id__in={run_id for run_id, _ in quorum},
        tool_call_id__in={c.tool_call_id for _, c in quorum},
        kind=Decision.Kind.APPROVE,
        completes=False,
    ).order_by("decided_at", "id")
    by_call: dict[tuple[str, str, int], list[Decision]] = {}
    for d in approvals:
        by_call.setdefault((d.run_id, d.tool_call_id, d.suspension), []).append(d)
    for run_id, call in quorum:
        shown = call.args_fingerprint
        call.approvals_given = [
            {"decidedBy": d.decided_by_username, "decidedAt": iso(d.decided_at)}
            for d in by_call.get((run_id, call.tool_call_id, call.suspension), [])
            if d.approved_fingerprint == shown
        ]


@dataclass
class SuspendedRun:
    run_id: str
    agent_id: str
    thread_id: str
    resource_id: str | None
    created_at: datetime
    suspended_at: datetime
    started_by: str | None
    tool_calls: list[SuspendedRunToolCall]
    status: str = "suspended"

    def to_dict(self) -> dict:
        # The one item shape of both listings (per agent and GET /api/suspended-runs): fields added here
        # (a claim, an assignee: docs/api.md#the-listing) reach every door that lists at once.
        return {
            "runId": self.run_id,
            "agentId": self.agent_id,
            "status": self.status,
            "threadId": self.thread_id,
            "resourceId": self.resource_id,
            "createdAt": iso(self.created_at),
            "suspendedAt": iso(self.suspended_at),
            "startedBy": self.started_by,
            "toolCalls": [c.to_dict() for c in self.tool_calls],
        }


@dataclass
class SuspendedRunsPage:
    runs: list[SuspendedRun]
    total: int

    def to_dict(self) -> dict:
        return {"runs": [r.to_dict() for r in self.runs], "total": self.total}


def _int_param(value: Any, code: str, name: str, minimum: int, maximum: int | None = None) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise AgentRunError(code, f"{name} must be an integer")
    if isinstance(value, str):
        if not value.strip().lstrip("-").isdigit():
            raise AgentRunError(code, f"{name} must be an integer, got {value!r}")
        value = int(value)
    if not isinstance(value, int):
        raise AgentRunError(code, f"{name} must be an integer")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise AgentRunError(code, f"{name} must be {bound}, got {value}")
    return value


def list_suspended_runs(
    *,
    agent_id: str | None = None,
    agent_ids: Collection[str] | None = None,
    thread_id: str | None = None,
    resource_id: str | None = None,
    from_date: datetime | str | None = None,
    to_date: datetime | str | None = None,
    per_page: int | str | None = None,
    page: int | str | None = None,
    with_claims: bool = False,
) -> SuspendedRunsPage:
    """Runs of ``agent_id`` waiting for people, newest first. Three queries whatever the page size:
    the total, the page of snapshots, and their open calls. ``with_claims``: each call also says who is
    on it (``claim``, docs/api.md#claims), for a listing that documents it.

    ``agent_ids`` instead of ``agent_id``: the runs of all those agents, in the same order, with the same
    filters, paging and total (``GET /api/suspended-runs``, docs/api.md#across-agents); the caller names
    the agents the reader may see."""
    listing = _Listing.of(agent_id, agent_ids, thread_id, resource_id, from_date, to_date, per_page, page)
    runs, count = _page_in_python(listing, with_claims=with_claims)
    return SuspendedRunsPage(runs=runs, total=count)


def _page_in_python(listing: _Listing, *, with_claims: bool = False) -> tuple[list[SuspendedRun], int]:
    """The listing's page of runs, built in Python (three queries: the total, the snapshots, their open
    calls), and its total."""
    ordered, total = listing.queries()
    count = int(list(total)[0])
    rows = list(ordered.values_list(*_SNAPSHOT_COLUMNS)[listing.paged])
    return _with_open_calls(rows, with_claims=with_claims), count


def encoded_suspended_runs(
    render: Callable[[list[SuspendedRun]], bytes],
    *,
    agent_id: str | None = None,
    agent_ids: Collection[str] | None = None,
    thread_id: str | None = None,
    resource_id: str | None = None,
    from_date: datetime | str | None = None,
    to_date: datetime | str | None = None,
    per_page: int | str | None = None,
    page: int | str | None = None,
) -> bytes:
    """``list_suspended_runs(...).to_dict()`` (without claims) as the JSON the REST answer sends:
    ``{"runs":[…],"total":N}``, the items comma-separated by ``render`` (the caller's JSON renderer).

    On PostgreSQL each item comes as the JSON kept for it at write time (``_ITEM_SQL``), read by the
    page's own query: one query (the page with its items and the total), and no Python per run but for
    the runs SQL leaves out (docs/performance.md, "Fifth pass"). Elsewhere:
    ``list_suspended_runs``'s runs, rendered."""
    listing = _Listing.of(agent_id, agent_ids, thread_id, resource_id, from_date, to_date, per_page, page)
    if connection.vendor != "postgresql":
        runs, count = _page_in_python(listing)
        return b'{"runs":[%s],"total":%d}' % (render(runs), count)
    # One query, its SQL compiled once for listings of this shape (``_compiled``): the page's runs with
    # their items and, on each row, the total (a subquery PostgreSQL evaluates once). A page past the end
    # has no row to carry it: the total alone then.
    page_query, total_query = _compiled(listing.shape())
    values = listing.values()
    first, after = listing.paged.start or 0, listing.paged.stop
    with connection.cursor() as cursor:
        # LIMIT NULL: no limit (not paged).
        cursor.execute(page_query.sql, [*page_query.params(values), None if after is None else after - first, first])
        rows = cursor.fetchall()
        if rows:
            count = int(rows[0][2])
        else:
            cursor.execute(total_query.sql, total_query.params(values))
            count = int(cursor.fetchone()[0])
    encoded = [b"" if item is None else item.encode() for _, item, _ in rows]
    left = [i for i, (_, item, _) in enumerate(rows) if item is None]
    if left:
        for i, run in zip(left, _with_open_calls(_snapshot_rows([rows[i][0] for i in left])), strict=True):
            encoded[i] = render([run])
    return b'{"runs":[%s],"total":%d}' % (b",".join(encoded), count)


@dataclass
class _Listing:
    """A listing's filters, checked, with what its total reads (``periods``, ``edges``), and its page:
    what its queries are built from (``queries``), and the values its compiled SQL takes (``values``)."""

    agent_ids: list[str]
    thread_id: str | None
    resource_id: str | None
    start: datetime | None
    end: datetime | None
    now: datetime
    # With date bounds: ``_periods``, padded with empty ones to as many as there can be, so that a dated
    # listing's query has one shape whatever its bounds (width 0 matches no counter, an edge from the
    # epoch to the epoch no snapshot).
    periods: list[tuple[int, int, int]]
    edges: list[tuple[datetime, datetime]]
    paged: slice

    @classmethod
    def of(
        cls,
        agent_id: str | None,
        agent_ids: Collection[str] | None,
        thread_id: str | None,
        resource_id: str | None,
        from_date: datetime | str | None,
        to_date: datetime | str | None,
        per_page: int | str | None,
        page: int | str | None,
    ) -> _Listing:
        agents = _agent_set(agent_id, agent_ids)
        per_page = _int_param(per_page, "INVALID_PER_PAGE", "perPage", 1, MAX_PER_PAGE)
        page = _int_param(page, "INVALID_PAGE", "page", 0, MAX_PAGE)
        start = parse_datetime_bound(from_date, "fromDate")
        end = parse_datetime_bound(to_date, "toDate")
        periods: list[tuple[int, int, int]] = []
        edges: list[tuple[datetime, datetime]] = []
        if start is not None or end is not None:
            whole, parts = _periods(start, end)
            periods = whole + [(0, 0, 0)] * (_PERIODS - len(whole))
            edges = [(_EPOCH + a * _US, _EPOCH + b * _US) for a, b in parts] + [(_EPOCH, _EPOCH)] * (
                _EDGES - len(parts)
            )
        return cls(
            agent_ids=agents,
            thread_id=thread_id or None,
            resource_id=resource_id or None,
            start=start,
            end=end,
            now=timezone.now(),
            periods=periods,
            edges=edges,
            # All when not paged.
            paged=slice(page * per_page, (page + 1) * per_page)
            if per_page is not None and page is not None
            else slice(None),
        )

    def queries(self) -> tuple[QuerySet[Snapshot], QuerySet]:
        """The listing's snapshots in order and the query of its total (``_total_query``); nothing read yet."""
        snapshots = _matching(
            agent_ids=self.agent_ids,
            thread_id=self.thread_id,
            resource_id=self.resource_id,
            start=self.start,
            end=self.end,
        )
        total = _total_query(snapshots, self)
        # A run past its time to live is not listed, even before the sweeper has expired it.
        ordered = snapshots.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=self.now)).order_by(
            "-created_at", "-run_id"
        )
        return ordered, total

    def shape(self) -> tuple[int, bool, bool, bool, bool]:
        """What decides the text of the listing's SQL: how many agents, which filters are present."""
        return (
            len(self.agent_ids),
            self.thread_id is not None,
            self.resource_id is not None,
            self.start is not None,
            self.end is not None,
        )

    def values(self) -> dict[str, Any]:
        """Every value the listing's SQL takes, by name (``_compiled`` finds where each goes)."""
        values: dict[str, Any] = {f"agent{i}": agent for i, agent in enumerate(self.agent_ids)}
        values |= {"thread": self.thread_id, "resource": self.resource_id, "start": self.start, "end": self.end}
        values["now"] = self.now
        for i, (width, first, after) in enumerate(self.periods):
            values |= {f"width{i}": width, f"first{i}": first, f"after{i}": after}
        for i, (low, high) in enumerate(self.edges):
            values |= {f"low{i}": low, f"high{i}": high}
        return values


def _total_query(snapshots: QuerySet[Snapshot], listing: _Listing) -> QuerySet:
    """The query of how many of ``snapshots`` (filtered) are listed: one row, one column, to run alone
    or to read as a subquery of the page's (``encoded_suspended_runs``).

    The snapshots present come from ``SnapshotCount`` (a few rows per key); with date bounds, from
    ``SnapshotPeriodCount`` and the edges (``_dated_total``); with date bounds and a thread or a
    resource, or a thread and a resource at once (which no counter keys), from a count on the listing's
    own index, which covers the bounds. Those past their time to live that the sweeper has not removed
    yet are subtracted: ``snapshot_agent_expiry`` finds them, few since the sweeper removes them.
    """
    thread_id, resource_id = listing.thread_id, listing.resource_id
    dated = listing.start is not None or listing.end is not None
    expired = _expired(snapshots, listing.now)
    if dated and not thread_id and not resource_id:
        return _dated_total(listing.agent_ids, listing.periods, listing.edges, expired)
    if dated or (thread_id and resource_id):
        # A thread's or a resource's runs within dates: counted on that index (docs/performance.md).
        return _one_value(snapshots, _COUNT - expired)
    counters = SnapshotCount.objects.filter(
        _one_of("agent_id", listing.agent_ids), **_counter_key(thread_id, resource_id)
    )
    return _one_value(counters, Coalesce(_sum("snapshots"), Value(0)) - expired)


@dataclass(frozen=True)
class _CompiledQuery:
    """A listing query's SQL and, for each of its parameters, the name of the listing's value that goes
    there (``_Listing.values``) or, for a constant of the query itself, None and the constant."""

    sql: str
    slots: tuple[tuple[str | None, Any], ...]

    def params(self, values: dict[str, Any]) -> list[Any]:
        return [values[name] if name is not None else constant for name, constant in self.slots]


# Stand-in widths and buckets: no width is one (60, 3600, 86400) nor any bucket (seconds since the
# epoch, now ~1.8e9); in the range of their columns (Django compiles a lookup of an integer out of
# its column's range to no query at all).
_STAND_IN = 2_100_000_000


@functools.lru_cache(maxsize=256)
def _compiled(shape: tuple[int, bool, bool, bool, bool]) -> tuple[_CompiledQuery, _CompiledQuery]:
    """The SQL of a listing page of this shape (its runs, items and total; ``LIMIT %s OFFSET %s`` last)
    and of its total alone, built by the ORM once per shape instead of on every request
    (docs/performance.md, "Fifth pass").

    Built from a listing of that shape whose every value is a stand-in no real value equals (text no
    id can hold, a date of the year 1000, a number no width nor bucket is): each parameter of the compiled SQL that is
    a stand-in is where that value goes; every other parameter is a constant of the query. Every value,
    the reader's agents first of all, is a parameter of the query, never part of its text."""
    agents, thread, resource, start, end = shape
    dated = start or end
    stand_in = _Listing(
        agent_ids=[f"\x00agent{i}" for i in range(agents)],
        thread_id="\x00thread" if thread else None,
        resource_id="\x00resource" if resource else None,
        start=datetime(1000, 1, 1, tzinfo=UTC) if start else None,
        end=datetime(1000, 1, 2, tzinfo=UTC) if end else None,
        now=datetime(1000, 1, 3, tzinfo=UTC),
        periods=[(_STAND_IN + 3 * i, _STAND_IN + 3 * i + 1, _STAND_IN + 3 * i + 2) for i in range(_PERIODS)]
        if dated
        else [],
        edges=[(datetime(1001 + i, 1, 1, tzinfo=UTC), datetime(1001 + i, 1, 2, tzinfo=UTC)) for i in range(_EDGES)]
        if dated
        else [],
        paged=slice(None),
    )
    names = {value: name for name, value in stand_in.values().items() if value is not None}

    def compiled(query: QuerySet, suffix: str = "") -> _CompiledQuery:
        sql, params = query.query.sql_with_params()
        return _CompiledQuery(sql + suffix, tuple((names.get(p), None if p in names else p) for p in params))

    ordered, total = stand_in.queries()
    page = ordered.annotate(item=RawSQL(_ITEM_SQL, []), total=Subquery(total)).values_list("run_id", "item", "total")
    return compiled(page, " LIMIT %s OFFSET %s"), compiled(total)


# COUNT(*) and SUM as plain functions, not aggregates: Django adds no GROUP BY, so ``SELECT COUNT(*) …``
# over the filtered rows is one row, whatever they are (none included), as ``aggregate`` reads it.
_COUNT = Func(template="COUNT(*)", output_field=IntegerField())


def _sum(column: str) -> Func:
    return Func(F(column), function="SUM", output_field=IntegerField())


def _one_value(rows: QuerySet, value: Any) -> QuerySet:
    """``SELECT value FROM rows``: one row (``value`` made of ``_COUNT``/``_sum`` over ``rows``)."""
    return rows.order_by().annotate(total=value).values_list("total", flat=True)[:1]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_FIRST, _LAST = datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC)  # no bound
# The most ``_periods`` gives: whole minutes and hours at both ends, whole days between; and two edges.
_PERIODS, _EDGES = 2 * (len(SnapshotPeriodCount.WIDTHS) - 1) + 1, 2


def _periods(start: datetime | None, end: datetime | None) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """``[start, end]`` as whole periods and edges: (width, first bucket, bucket after the last) for each
    range of whole minutes, hours and days (widths and buckets in seconds), and the ranges left over at
    both ends — under a minute each — as [from, to) in microseconds since the epoch."""
    low = ((start or _FIRST) - _EPOCH) // _US
    high = ((end or _LAST) - _EPOCH) // _US + 1  # end is inclusive
    widths = SnapshotPeriodCount.WIDTHS
    minute = widths[0] * 1_000_000
    first, last = -(-low // minute) * minute, high // minute * minute
    if first >= last:
        return [], [(low, high)]
    edges = [(a, b) for a, b in ((low, first), (last, high)) if a < b]
    periods: list[tuple[int, int, int]] = []
    level = 0
    while level + 1 < len(widths):  # whole minutes up to the first whole hour, etc.
        step = widths[level + 1] * 1_000_000
        inner_first, inner_last = -(-first // step) * step, last // step * step
        if inner_first >= inner_last:
            break
        for a, b in ((first, inner_first), (inner_last, last)):
            if a < b:
                periods.append((widths[level], a // 1_000_000, b // 1_000_000))
        first, last, level = inner_first, inner_last, level + 1
    periods.append((widths[level], first // 1_000_000, last // 1_000_000))
    return periods, edges


def _dated_total(
    agent_ids: list[str], periods: list[tuple[int, int, int]], edges: list[tuple[datetime, datetime]], expired: Coalesce
) -> QuerySet:
    """The listing's total with date bounds (no thread nor resource): the whole minutes, hours and days
    inside the bounds from ``SnapshotPeriodCount``, plus the snapshots of the partial minutes at both
    edges counted on the listing's index (all of it for bounds under two minutes apart), less those past
    their time to live (``expired``). Exact, and the same work whatever the number of runs: a few counter
    rows per day of the range and at most two minutes of snapshots
    (docs/performance.md#request-floor-unpaged-listing-date-totals-third-pass)."""
    whole = Q()
    for width, first, after in periods:
        whole |= Q(width=width, bucket__gte=first, bucket__lt=after)
    counters = SnapshotPeriodCount.objects.filter(_one_of("agent_id", agent_ids)).filter(whole)
    within = Q()
    for low, high in edges:
        within |= Q(created_at__gte=low, created_at__lt=high)
    at_edges = (
        Snapshot.objects.filter(_one_of("agent_id", agent_ids))
        .filter(within)
        .order_by()
        .annotate(n=Func(template="COUNT(*)", output_field=IntegerField()))
    )
    total = Coalesce(_sum("snapshots"), Value(0)) - expired + Coalesce(Subquery(at_edges.values("n")[:1]), Value(0))
    return _one_value(counters, total)


def _agent_set(agent_id: str | None, agent_ids: Collection[str] | None) -> list[str]:
    """The agents a listing reads: one (``agent_id``) or several (``agent_ids``), never both."""
    if (agent_id is None) == (agent_ids is None):
        raise TypeError("give agent_id or agent_ids, not both nor neither")
    return [agent_id] if agent_id is not None else sorted(set(agent_ids or ()))


def _one_of(column: str, agent_ids: list[str]) -> Q:
    """``column = ?`` for one agent (the plans the per-agent indexes were made for), ``IN (…)`` for several."""
    return Q(**{column: agent_ids[0]}) if len(agent_ids) == 1 else Q(**{f"{column}__in": agent_ids})


def _matching(
    *,
    agent_ids: list[str],
    thread_id: str | None,
    resource_id: str | None,
    start: datetime | None,
    end: datetime | None,
) -> QuerySet[Snapshot]:
    """The snapshots matching the listing's filters (expiry aside)."""
    snapshots = Snapshot.objects.filter(_one_of("agent_id", agent_ids))
    if thread_id:
        snapshots = snapshots.filter(thread_id=thread_id)
    if resource_id:
        snapshots = snapshots.filter(resource_id=resource_id)
    if start is not None:
        snapshots = snapshots.filter(created_at__gte=start)
    if end is not None:
        snapshots = snapshots.filter(created_at__lte=end)
    return snapshots


# The columns the listing reads, in the order of SuspendedRun's and SuspendedRunToolCall's fields: rows
# come as tuples, not model instances (which cost more than the rest of the listing together).
_SNAPSHOT_COLUMNS = (
    "run_id",
    "agent_id",
    "thread_id",
    "resource_id",
    "created_at",
    "suspended_at",
    "run__started_by_username",
)
_CALL_COLUMNS = (
    "run_id",
    "tool_call_id",
    "tool_name",
    "args",
    "requires_approval",
    "suspend_payload",
    "resume_schema",
    "risk",
    "inner_agent_id",
    "inner_run_id",
    "inner_tool_call_id",
    "pending_args",
    "approvals_required",
    "suspension",
    # Who is on the call (docs/dashboard.md#shared-work): the last five, see ``describe_open_calls``.
    "claimed_by_username",
    "claimed_at",
    "claim_touched_at",
    "assignee__username",
    "assignee_group__name",
)
CLAIM_COLUMNS = 5


def _with_open_calls(rows: list[tuple], *, with_claims: bool = False) -> list[SuspendedRun]:
    """The runs of these snapshot rows (``_SNAPSHOT_COLUMNS``) with their open calls (``describe_open_calls``)."""
    open_calls = SuspendedToolCall.objects.filter(run_id__in=[row[0] for row in rows]).order_by(
        "run_id", "position", "id"
    )
    calls_by_run = describe_open_calls(open_calls, run_agents={row[0]: row[1] for row in rows} if with_claims else None)
    return [
        SuspendedRun(
            run_id=run_id,
            agent_id=agent_id,
            thread_id=thread_id,
            resource_id=resource_id,
            created_at=created_at,
            suspended_at=suspended_at,
            started_by=started_by,
            tool_calls=calls_by_run.get(run_id, []),
        )
        for run_id, agent_id, thread_id, resource_id, created_at, suspended_at, started_by in rows
    ]


# --- unpaged listings, streamed ----------------------------------------------------------------
STREAM_BATCH = 500


# PostgreSQL: a run's listing item as JSON text, kept whole at write time (``ListingItem``, migration
# 0020_listing_items; docs/performance.md, "Fifth pass"): the fields and the order of
# ``SuspendedRun.to_dict`` and ``SuspendedRunToolCall.to_dict``. NULL when a call needs Python: its
# fingerprint is not in the column (a float in its arguments), it is surfaced from a sub-agent, or it
# needs several approvals (who gave them); the listings build those runs in Python. Nested JSON values
# are PostgreSQL's text of them (a space after ":" and ","): the same JSON, not always the same bytes as
# Python's rendering.
_ITEM_SQL = "(SELECT i.item FROM agentrun_listingitem i WHERE i.run_id = agentrun_snapshot.run_id)"


def _snapshot_rows(run_ids: list[str]) -> list[tuple]:
    """The ``_SNAPSHOT_COLUMNS`` of these runs' snapshots, in the order of ``run_ids`` (one query)."""
    found = {row[0]: row for row in Snapshot.objects.filter(run_id__in=run_ids).values_list(*_SNAPSHOT_COLUMNS)}
    return [found[run_id] for run_id in run_ids if run_id in found]


class SuspendedRunsStream:
    """Every run of an unpaged listing, read a batch at a time instead of all at once.

    The snapshots come through a server-side cursor, the open calls one query a batch: memory holds one
    batch, whatever the number of runs. On PostgreSQL the cursor is read inside a transaction, so that
    it fetches rows as they are asked for (outside one, PostgreSQL would compute every match before the
    first: a first byte growing with the listing). SQLite reads in chunks without one (a transaction
    would hold its write lock). Sync calls (``next_batch``, ``next_encoded``, ``close``) stay in one
    thread: the cursor and the transaction live on that thread's connection.

    On PostgreSQL (without claims) each row also carries its item's JSON, kept at write time (``_ITEM_SQL``):
    ``next_encoded`` hands those on as they are, with no query for the calls and no Python per run,
    and builds in Python only the runs SQL left out.
    """

    def __init__(self, snapshots: QuerySet[Snapshot], *, with_claims: bool = False) -> None:
        # Nothing runs until the first batch.
        self.with_claims = with_claims
        self._in_sql = connection.vendor == "postgresql" and not with_claims
        # In SQL: the run id and its item only (the other columns are read for the runs left to Python).
        columns = ["run_id", "item"] if self._in_sql else _SNAPSHOT_COLUMNS
        if self._in_sql:
            snapshots = snapshots.annotate(item=RawSQL(_ITEM_SQL, []))
        self._rows: Generator[tuple, None, None] = snapshots.values_list(*columns).iterator(  # type: ignore[assignment]
            chunk_size=STREAM_BATCH
        )
        self._transaction = transaction.atomic() if connection.vendor == "postgresql" else None
        self._started = False
        self.done = False

    def _next_rows(self) -> list[tuple]:
        if not self._started and self._transaction is not None:
            self._transaction.__enter__()
            if self._in_sql:
                # A subquery a row (the item) makes the plan of a large listing look dear enough for JIT
                # compilation, which costs more than it saves on a cursor read batch by batch.
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL jit = off")
        self._started = True
        try:
            rows = list(islice(self._rows, STREAM_BATCH))
        except BaseException:
            self.close(*sys.exc_info())
            raise
        if len(rows) < STREAM_BATCH:
            self.close()
        return rows

    def next_batch(self) -> list[SuspendedRun]:
        """The next runs (an empty list at the end); ``done`` once the last one is read."""
        rows = self._next_rows()
        try:
            if self._in_sql:
                rows = _snapshot_rows([row[0] for row in rows])
            return _with_open_calls(rows, with_claims=self.with_claims)
        except BaseException:
            self.close(*sys.exc_info())
            raise

    def next_encoded(self, render: Callable[[list[SuspendedRun]], bytes]) -> tuple[bytes, int]:
        """The next runs as the JSON of their items, comma-separated, and how many (0 at the end).
        ``render``: the items of runs built in Python, comma-separated (the caller's JSON renderer)."""
        rows = self._next_rows()
        try:
            if not self._in_sql:
                return render(_with_open_calls(rows, with_claims=self.with_claims)), len(rows)
            items: list[bytes] = [b"" if row[-1] is None else row[-1].encode() for row in rows]
            left = [i for i, row in enumerate(rows) if row[-1] is None]
            if left:
                built = _with_open_calls(_snapshot_rows([rows[i][0] for i in left]))
                for i, run in zip(left, built, strict=True):
                    items[i] = render([run])
        except BaseException:
            self.close(*sys.exc_info())
            raise
        return b",".join(items), len(rows)

    async def encoded_batches(self, render: Callable[[list[SuspendedRun]], bytes]) -> AsyncIterator[tuple[bytes, int]]:
        """``next_encoded``'s batches not read yet, each read in the caller's database thread."""
        while not self.done:
            encoded, count = await sync_to_async(self.next_encoded)(render)
            if count:
                yield encoded, count

    def close(self, *exc_info: Any) -> None:
        """Close the cursor and end the transaction (at the end, or when the reader gives up early)."""
        if self.done:
            return
        self.done = True
        self._rows.close()
        if self._started and self._transaction is not None:
            self._transaction.__exit__(*(exc_info or (None, None, None)))


def stream_suspended_runs(
    *,
    agent_id: str | None = None,
    agent_ids: Collection[str] | None = None,
    thread_id: str | None = None,
    resource_id: str | None = None,
    from_date: datetime | str | None = None,
    to_date: datetime | str | None = None,
    per_page: int | str | None = None,
    page: int | str | None = None,
    with_claims: bool = False,
) -> SuspendedRunsStream:
    """``list_suspended_runs`` without paging, streamed: the runs in the same order, with the same fields.

    The arguments are checked here, before any run is read. ``per_page`` or ``page`` alone does not page
    (the contract pages only with both) but is checked all the same, as ``list_suspended_runs`` does.
    """
    agents = _agent_set(agent_id, agent_ids)
    _int_param(per_page, "INVALID_PER_PAGE", "perPage", 1, MAX_PER_PAGE)
    _int_param(page, "INVALID_PAGE", "page", 0, MAX_PAGE)
    start = parse_datetime_bound(from_date, "fromDate")
    end = parse_datetime_bound(to_date, "toDate")
    snapshots = _matching(agent_ids=agents, thread_id=thread_id, resource_id=resource_id, start=start, end=end)
    # As in list_suspended_runs: a run past its time to live is not listed.
    listed = snapshots.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))
    return SuspendedRunsStream(listed.order_by("-created_at", "-run_id"), with_claims=with_claims)


def decision_history(
    *,
    hidden: frozenset[str] = frozenset(),
    agent_id: str | None = None,
    thread_id: str | None = None,
    run_id: str | None = None,
    resource_id: str | None = None,
    decided_by: str | None = None,
    kind: str | None = None,
    tool_name: str | None = None,
    via: str | None = None,
    from_date: datetime | str | None = None,
    to_date: datetime | str | None = None,
) -> QuerySet[Decision]:
    """The audit trail, filtered: what ``GET /api/decisions`` and the dashboard's history page both read.

    ``hidden``: agents the reader is outside of (``agentrun.core.access.hidden_agent_ids``). ``tool_name``
    matches the tool the reviewer saw (a surfaced sub-agent call's inner tool too). Empty filters are
    ignored; dates bound ``decidedAt`` inclusively (``INVALID_DATE`` otherwise). Unordered: the caller pages
    it (cursor or page number) on ``(decided_at, id)``.
    """
    decisions = Decision.objects.all()
    if hidden:
        # A decision on a call surfaced from a sub-agent shows that agent's call too.
        decisions = decisions.exclude(agent_id__in=hidden).exclude(inner_agent_id__in=hidden)
    for column, value in (
        ("agent_id", agent_id),
        ("thread_id", thread_id),
        ("run_id", run_id),
        ("run__resource_id", resource_id),
        ("decided_by_username", decided_by),
        ("kind", kind),
        ("via", via),
    ):
        if value:
            decisions = decisions.filter(**{column: value})
    if tool_name:
        # The tool the reviewer saw: a sub-agent's tool surfaced on its supervisor's call counts as that tool.
        decisions = decisions.filter(Q(tool_name=tool_name) | Q(inner_tool_name=tool_name))
    if (start := parse_datetime_bound(from_date, "fromDate")) is not None:
        decisions = decisions.filter(decided_at__gte=start)
    if (end := parse_datetime_bound(to_date, "toDate")) is not None:
        decisions = decisions.filter(decided_at__lte=end)
    return decisions


def _expired(snapshots: QuerySet[Snapshot], now: datetime) -> Coalesce:
    """How many of ``snapshots`` (some agents', or ``OuterRef("agent_id")``'s) are past their time to live
    but not swept yet: counted on ``snapshot_agent_expiry``, few since the sweeper removes them."""
    # COUNT(*) as a plain function, not an aggregate: Django adds no GROUP BY, so the subquery is one row
    # whether it counts one agent's snapshots or several agents' (GET /api/suspended-runs).
    overdue = (
        snapshots.filter(expires_at__lte=now)
        .order_by()
        .annotate(n=Func(template="COUNT(*)", output_field=IntegerField()))
    )
    return Coalesce(Subquery(overdue.values("n")[:1]), Value(0))


def _counter_key(thread_id: str | None, resource_id: str | None) -> dict[str, str]:
    """The ``SnapshotCount`` key (besides the agent) counting an agent's snapshots on a thread or resource."""
    if thread_id:
        return {"scope": SnapshotCount.Scope.THREAD, "scope_id": thread_id}
    if resource_id:
        return {"scope": SnapshotCount.Scope.RESOURCE, "scope_id": resource_id}
    return {"scope": SnapshotCount.Scope.AGENT, "scope_id": ""}


def waiting_runs_by_agent(agent_ids: list[str], *, resource_id: str = "") -> dict[str, int]:
    """How many runs of each of ``agent_ids`` wait (for ``resource_id``): for each, the listing's exact
    ``total`` as ``_total_query`` counts it (counters less the runs past their time to live not swept
    yet), for every agent in one query that scans no snapshots. Agents with none are left out."""
    snapshots = Snapshot.objects.filter(agent_id=OuterRef("agent_id"))
    if resource_id:
        snapshots = snapshots.filter(resource_id=resource_id)
    counters = SnapshotCount.objects.filter(agent_id__in=agent_ids, **_counter_key(None, resource_id))
    totals = counters.values("agent_id").annotate(total=Sum("snapshots") - _expired(snapshots, timezone.now()))
    return {
        agent_id: total for agent_id, total in totals.order_by("agent_id").values_list("agent_id", "total") if total
    }

"""``/approvals/metrics/``: how approvals go, for a team lead (docs/operations.md "The metrics page").

Waiting now; time to decision (p50/p95) per tool per day; decisions by kind and by via; the approval
rate per tool, with the tools approved unedited at least ``CANDIDATE_RATE`` of the time flagged as
candidates for a standing grant or a lower risk; timeouts and escalations; the slowest waits now. The
same numbers as tables, and as CSV (``metrics.csv``).

Reviewers see their agents only (``agentrun.core.access``). The page reads a bounded number of rows
whatever the volume: ``DecisionRollup`` (decisions per agent, tool, day, …, kept by a trigger), the
``WaitingCallCount`` counters, and one index probe per agent for the longest waits; never a scan of the
decisions. Percentiles come from the rollup's wait buckets (``agentrun.core.metrics.WAIT_BUCKETS``): the
page shows the bucket's upper bound ("≤ 10 min"), which the exact percentile never exceeds.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from agentrun.core.access import hidden_agent_ids
from agentrun.core.exports import csv_cell
from agentrun.core.metrics import AUTOMATIC_VIAS, WAIT_BUCKETS
from agentrun.core.models import DecisionRollup, Snapshot, SuspendedToolCall, WaitingCallCount
from approvals.views import viewer_required

DEFAULT_DAYS = 30
MAX_DAYS = 366
CANDIDATE_RATE = 0.95  # approved unedited at least this often: a candidate for a grant or a lower risk
CANDIDATE_MIN_DECISIONS = 20  # … over at least this many decisions by people
SLOWEST = 10
KINDS = ("approve", "decline", "resume", "expire")


def wait_label(bucket: int | None) -> str:
    """The upper bound of a wait bucket, for people: "≤ 30 s", "≤ 2 h", "> 7 d"."""
    if bucket is None:
        return "–"
    if bucket >= len(WAIT_BUCKETS):
        return f"> {duration(WAIT_BUCKETS[-1])}"
    return f"≤ {duration(WAIT_BUCKETS[bucket])}"


def duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def percentile_bucket(histogram: dict[int, int], p: float) -> int | None:
    """The bucket holding the nearest-rank ``p`` percentile of a {bucket: count} histogram."""
    total = sum(histogram.values())
    if not total:
        return None
    rank, seen = max(math.ceil(p * total), 1), 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return bucket
    return None


@dataclass
class ToolDay:
    """One tool on one day (or over the whole window: ``day`` None)."""

    tool: str
    day: date | None
    # Plain dicts (templates look keys up on them: a defaultdict would grow one per lookup).
    by_kind: dict[str, int] = field(default_factory=dict)
    by_via: dict[str, int] = field(default_factory=dict)
    waits: dict[int, int] = field(default_factory=dict)  # people's decisions, by wait bucket
    person_approved: int = 0
    person_approved_unedited: int = 0
    person_declined: int = 0
    timeouts: int = 0
    escalations: int = 0
    expiries: int = 0

    @property
    def decisions(self) -> int:
        return sum(self.by_kind.values())

    @property
    def kinds(self) -> list[tuple[str, int]]:
        return sorted(self.by_kind.items())

    @property
    def vias(self) -> list[tuple[str, int]]:
        return sorted(self.by_via.items())

    @property
    def p50(self) -> int | None:
        return percentile_bucket(self.waits, 0.5)

    @property
    def p95(self) -> int | None:
        return percentile_bucket(self.waits, 0.95)

    @property
    def p50_label(self) -> str:
        return wait_label(self.p50)

    @property
    def p95_label(self) -> str:
        return wait_label(self.p95)

    @property
    def approval_rate(self) -> float | None:
        judged = self.person_approved + self.person_declined
        return self.person_approved / judged if judged else None

    @property
    def unedited_rate(self) -> float | None:
        judged = self.person_approved + self.person_declined
        return self.person_approved_unedited / judged if judged else None

    @property
    def candidate(self) -> bool:
        judged = self.person_approved + self.person_declined
        return judged >= CANDIDATE_MIN_DECISIONS and (self.unedited_rate or 0) >= CANDIDATE_RATE

    def add(self, row: dict[str, Any]) -> None:
        """A count row: decisions (or escalations) of one kind, via, policy, edited or not."""
        n, kind, via, policy = row["n"], row["kind"], row["via"], row["policy"]
        if kind == DecisionRollup.ESCALATE:
            self.escalations += n
            return
        self.by_kind[kind] = self.by_kind.get(kind, 0) + n
        shown = f"{via} ({policy})" if policy else via
        self.by_via[shown] = self.by_via.get(shown, 0) + n
        if policy == "timeout":
            self.timeouts += n
        if via == "system" and kind == "expire":
            self.expiries += n
        if via in AUTOMATIC_VIAS:
            return
        if kind == "approve":
            self.person_approved += n
            if not row["edited"]:
                self.person_approved_unedited += n
        elif kind == "decline":
            self.person_declined += n

    def add_waits(self, bucket: int, n: int) -> None:
        """People's decisions in one wait bucket."""
        self.waits[bucket] = self.waits.get(bucket, 0) + n


@dataclass
class Report:
    since: date
    until: date
    days: int
    tools: list[ToolDay]  # over the window, by tool
    per_day: list[ToolDay]  # per tool per day
    all_days: list[ToolDay]  # all tools, per day
    total: ToolDay
    waiting: list[tuple[str, str, int]]  # (agent, risk, calls)
    slowest: list[dict[str, Any]]

    def chart_data(self) -> dict[str, Any]:
        """What static/metrics.js draws: per day, decisions by kind and the p50/p95 bounds in seconds."""

        def bound(bucket: int | None) -> float | None:
            return None if bucket is None else float(WAIT_BUCKETS[min(bucket, len(WAIT_BUCKETS) - 1)])

        return {
            "days": [d.day.isoformat() for d in self.all_days],
            "kinds": {kind: [d.by_kind.get(kind, 0) for d in self.all_days] for kind in KINDS},
            "p50": [bound(d.p50) for d in self.all_days],
            "p95": [bound(d.p95) for d in self.all_days],
        }


def build_report(*, hidden: frozenset[str], days: int) -> Report:
    today = timezone.now().date()
    since = today - timedelta(days=days - 1)
    rollup = DecisionRollup.objects.filter(day__gte=since).exclude(agent_id__in=hidden).order_by()
    counts = rollup.values("tool_name", "day", "kind", "via", "policy", "edited").annotate(n=Sum("decisions"))
    waits = (
        rollup.filter(wait_bucket__gte=0)
        .exclude(via__in=AUTOMATIC_VIAS)
        .exclude(kind=DecisionRollup.ESCALATE)
        .values("tool_name", "day", "wait_bucket")
        .annotate(n=Sum("decisions"))
    )
    tools: dict[str, ToolDay] = {}
    per_day: dict[tuple[str, date], ToolDay] = {}
    all_days = {since + timedelta(days=i): ToolDay("", since + timedelta(days=i)) for i in range(days)}
    total = ToolDay("", None)

    def targets(tool: str, day: date) -> tuple[ToolDay, ...]:
        return (
            tools.setdefault(tool, ToolDay(tool, None)),
            per_day.setdefault((tool, day), ToolDay(tool, day)),
            all_days.setdefault(day, ToolDay("", day)),
            total,
        )

    # Two grouped reads, each without the dimension the other needs: the counts (no wait bucket), and
    # the wait histogram of people's decisions (no kind, via, policy): far fewer rows than both at once.
    for row in counts:
        for target in targets(row["tool_name"], row["day"]):
            target.add(row)
    for row in waits:
        for target in targets(row["tool_name"], row["day"]):
            target.add_waits(row["wait_bucket"], row["n"])
    return Report(
        since=since,
        until=today,
        days=days,
        tools=sorted(tools.values(), key=lambda t: (-t.decisions, t.tool)),
        per_day=sorted(per_day.values(), key=lambda t: (t.day, t.tool), reverse=True),
        all_days=[all_days[d] for d in sorted(all_days)],
        total=total,
        waiting=waiting_now(hidden),
        slowest=slowest_waits(hidden),
    )


def waiting_now(hidden: frozenset[str]) -> list[tuple[str, str, int]]:
    """(agent, risk, calls waiting), from the counters."""
    rows = (
        WaitingCallCount.objects.exclude(agent_id__in=hidden)
        .values("agent_id", "risk")
        .annotate(n=Sum("calls"))
        .order_by("agent_id", "risk")
    )
    return [(r["agent_id"], r["risk"], r["n"]) for r in rows if r["n"]]


def slowest_waits(hidden: frozenset[str]) -> list[dict[str, Any]]:
    """The runs waiting longest now, of every visible agent that has calls waiting: ``SLOWEST`` per agent
    on the index ``snapshot_agent_waiting``, merged; then their open calls, one query."""
    agents = sorted({agent for agent, _, _ in waiting_now(hidden)})
    found = []
    for agent_id in agents:
        found += (
            Snapshot.objects.filter(agent_id=agent_id)
            .order_by("suspended_at")
            .values("run_id", "agent_id", "thread_id", "suspended_at")[:SLOWEST]
        )
    found = sorted(found, key=lambda s: s["suspended_at"])[:SLOWEST]
    calls = defaultdict(list)
    for run_id, tool_name, risk in SuspendedToolCall.objects.filter(
        run_id__in=[s["run_id"] for s in found], status=SuspendedToolCall.Status.OPEN
    ).values_list("run_id", "tool_name", "risk"):
        calls[run_id].append((tool_name, risk))
    now = timezone.now()
    return [
        s | {"waited": duration((now - s["suspended_at"]).total_seconds()), "calls": calls[s["run_id"]]} for s in found
    ]


def _days(request: HttpRequest) -> int:
    try:
        return min(max(int(request.GET.get("days", DEFAULT_DAYS)), 1), MAX_DAYS)
    except ValueError:
        return DEFAULT_DAYS


@require_GET
@viewer_required
def metrics_page(request: HttpRequest) -> HttpResponse:
    report = build_report(hidden=hidden_agent_ids(request.user), days=_days(request))
    return render(
        request,
        "approvals/metrics.html",
        {
            "report": report,
            "chart": report.chart_data(),
            "candidate_rate": round(CANDIDATE_RATE * 100),
            "candidate_min": CANDIDATE_MIN_DECISIONS,
        },
    )


CSV_COLUMNS = [
    "day",
    "tool",
    "decisions",
    *KINDS,
    "approved_by_people",
    "approved_unedited_by_people",
    "declined_by_people",
    "p50_wait_seconds_at_most",
    "p95_wait_seconds_at_most",
    "timeouts",
    "escalations",
    "expiries",
]


def _bound(bucket: int | None) -> str:
    if bucket is None:
        return ""
    return "" if bucket >= len(WAIT_BUCKETS) else str(WAIT_BUCKETS[bucket])


@require_GET
@viewer_required
def metrics_csv(request: HttpRequest) -> HttpResponse:
    """Per tool per day, the page's numbers (a p50/p95 past the last bucket is empty)."""
    report = build_report(hidden=hidden_agent_ids(request.user), days=_days(request))
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="agentrun-approvals-{report.until}.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for row in report.per_day:
        writer.writerow(
            [
                row.day.isoformat(),
                csv_cell(row.tool),  # a tool's name is its author's text: never a formula
                row.decisions,
                *(row.by_kind.get(kind, 0) for kind in KINDS),
                row.person_approved,
                row.person_approved_unedited,
                row.person_declined,
                _bound(row.p50),
                _bound(row.p95),
                row.timeouts,
                row.escalations,
                row.expiries,
            ]
        )
    return response

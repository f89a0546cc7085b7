"""A listing's ``total`` with ``fromDate``/``toDate`` is exact, edges included: it is summed from per-minute,
-hour and -day counters plus the edge minutes' runs (docs/performance.md), so every bound is checked
against a plain count — on a bucket's first and last microsecond, inside one minute, across days."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync

from agentrun.core.models import Snapshot
from agentrun.core.selectors import list_suspended_runs
from agentrun.core.timeutil import iso
from tests.helpers.runs import email_run, set_created_at

pytestmark = pytest.mark.django_db

URL = "/api/agents/support-agent/suspended-runs"
DAY = datetime(2026, 3, 1, tzinfo=UTC)
US = timedelta(microseconds=1)
WHEN = [
    DAY - US,  # the day before's last microsecond
    DAY,
    DAY + timedelta(seconds=59, microseconds=999_999),
    DAY + timedelta(minutes=1),
    DAY + timedelta(hours=1) - US,
    DAY + timedelta(hours=1),
    DAY + timedelta(hours=1, seconds=30),
    DAY + timedelta(days=1, hours=2, minutes=3, seconds=4, microseconds=500_000),
    DAY + timedelta(days=2),
    DAY + timedelta(days=3) - US,
    DAY + timedelta(days=5, minutes=7),
]
BOUNDS = sorted(
    {None, DAY + timedelta(days=1), DAY + timedelta(hours=1, minutes=1), DAY + timedelta(seconds=30)}
    | {w + d for w in WHEN for d in (-US, timedelta(0), US)},
    key=lambda b: (b is not None, b),
)


@pytest.fixture
def runs() -> dict[str, datetime]:
    made = {}
    for i, when in enumerate(WHEN):
        run_id = email_run(thread=f"t-{i}", resource="u-1")
        async_to_sync(set_created_at)(run_id, when)  # an update: the counters move with the snapshot
        made[run_id] = when
    email_run(thread="t-now")  # now: outside every bounded range below but the open-ended ones
    return made


def plain_count(start: datetime | None, end: datetime | None) -> int:
    snapshots = Snapshot.objects.filter(agent_id="support-agent")
    if start is not None:
        snapshots = snapshots.filter(created_at__gte=start)
    if end is not None:
        snapshots = snapshots.filter(created_at__lte=end)
    return snapshots.count()


def check_every_range(runs: dict[str, datetime]) -> int:
    checked = 0
    for start, end in itertools.product(BOUNDS, BOUNDS):
        if start is None and end is None:
            continue
        expected = plain_count(start, end)
        oracle = sum((start is None or start <= w) and (end is None or w <= end) for w in runs.values())
        if end is None:
            oracle += 1  # the run made now
        assert expected == oracle
        page = list_suspended_runs(agent_id="support-agent", from_date=start, to_date=end, per_page=2, page=0)
        assert page.total == expected, (start, end)
        checked += 1
    return checked


def test_a_dated_total_is_a_plain_count_on_every_edge(runs):
    assert check_every_range(runs) > 900


def test_dated_totals_follow_runs_that_leave_and_arrive(api, runs):
    leaving = next(run_id for run_id, when in runs.items() if when == DAY + timedelta(hours=1))
    assert api.post(f"/api/agents/support-agent/runs/{leaving}/approve", {}, format="json").status_code == 202
    del runs[leaving]
    moved = next(run_id for run_id, when in runs.items() if when == DAY)
    runs[moved] = DAY + timedelta(days=1, seconds=1)
    async_to_sync(set_created_at)(moved, runs[moved])
    check_every_range(runs)
    answer = api.get(
        URL, {"fromDate": iso(DAY), "toDate": iso(DAY + timedelta(days=1, seconds=1)), "perPage": 1, "page": 0}
    )
    assert answer.json()["total"] == plain_count(DAY, DAY + timedelta(days=1, seconds=1)) == 5

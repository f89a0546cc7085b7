"""The benchmark suite at a tiny N, so that it cannot rot: every row of its table gets a number.

Not a performance test: the figures are not checked (docs/performance.md has them, from `make bench`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers.system import ROOT

pytestmark = [pytest.mark.system, pytest.mark.postgres]

ROWS = [
    "REST request floor",
    "REST listing, 30 suspended runs, unfiltered first page",
    "REST listing, t(30) / t(30), unfiltered first page",
    "REST listing, 30, by thread, first page",
    "REST listing, 30, by resource, first page",
    "Python `list_suspended_runs`, 30, unfiltered first page",
    "REST listing, no paging, 30 matching runs: first byte",
    "REST listing, no paging, 30 matching runs: daphne RSS growth",
    "REST listing, no paging, 30 matching runs: total",
    "suspend → approve → complete, in-process, SQLite",
    "suspend → approve → complete, in-process, PostgreSQL",
    "`/approvals/metrics/` reads at N decisions",
    "`/approvals/` inbox, first page, 30 waiting threads",
    "sweep's prune round",
    "approve over REST on web B → first continuation chunk",
    "chunks/s to each of 10 `ws/runs` subscribers",
    "the subscriber furthest behind",
    "chunks/s to each of 10 `ws/runs` subscribers on one daphne",
    "chunks/s to each of 100 `ws/runs` subscribers on one daphne",
    "decisions/s end to end (approve over REST → run completed), 2 web + 2 workers",
    "decisions/s end to end (approve over REST → run completed), 2 web + 3 workers",
    # The third pass's request floor, unpaged listing and date totals (benchmarks/queries.py).
    "REST request floor: authenticated GET /api/agents/",
    "the same request in-process",
    "web A's CPU a request",
    "a bare ASGI app under the same daphne",
    "REST listing, 30, unfiltered first page",
    "unpaged listing in-process, 30 runs",
    "Python listing, 30, first page with fromDate/toDate",
    "REST listing, 30, first page with fromDate/toDate",
    "REST listing, no paging, 30 runs: total",
]


def test_the_suite_prints_every_row_with_a_number():
    from django.conf import settings

    db = settings.DATABASES["default"]
    server = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/postgres"
    env = dict(
        os.environ,
        BENCH_PG=server,
        BENCH_DB_PREFIX=f"{db['NAME']}_bench_{os.getpid()}",
        BENCH_REDIS_URL=settings.REDIS_URL,
    )
    small = ["--n", "30", "--reference-n", "30", "--repeat", "3", "--latency-runs", "2", "--words", "200"]
    small += ["--topology-runs", "20"]
    done = subprocess.run(
        [sys.executable, "benchmarks/suite.py", *small, "--cycles", "2", "--drop"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert "load average" in done.stdout and "CPUs" in done.stdout
    assert len(rows) == len(ROWS), done.stdout
    for label, row in zip(ROWS, rows, strict=True):
        what, measured = row.split(" | ")[:2]
        assert label in what, (label, row)
        assert re.search(r"\d", measured), row

"""Figures for the sweep's queries: what one sweep round costs with a large history, with and without
the partial indexes of migration 0008 (``run_lease_expiry``, ``snapshot_expiry``, ``suspended_call_decided``).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/agentrun .venv/bin/python benchmarks/sweeper.py --runs 200000

Works on a throw-away database next to the one named (``<name>_bench_sweeper``), dropped at the end.
The history is ``--runs`` finished runs plus ``--waiting`` suspended ones; a handful are due (expired
TTL, dead lease, decided but never continued). Each query is timed ``--repeat`` times (median), in a
transaction that is rolled back, so every repetition finds the same work.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
INDEXES = ("run_lease_expiry", "snapshot_expiry", "suspended_call_decided")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200_000)
    parser.add_argument("--waiting", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        sys.exit("set DATABASE_URL=postgres://… (the benchmark makes a database next to it)")
    parts = urlsplit(url)
    bench = f"{parts.path.lstrip('/') or 'agentrun'}_bench_sweeper"
    admin = urlunsplit(parts._replace(path="/postgres")).replace("postgres://", "postgresql://", 1)
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{bench}"')
        conn.execute(f'CREATE DATABASE "{bench}"')
    os.environ["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{bench}"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
    os.environ["AGENTRUN_LOG_LEVEL"] = "ERROR"
    sys.path.insert(0, str(ROOT))
    try:
        run(args)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{bench}"')


def run(args: argparse.Namespace) -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from agentrun.core.models import Run, Thread
    from agentrun.engine import lease
    from agentrun.engine.decisions import due_runs, expire_due_runs
    from tests.helpers.runs import bulk_suspended_runs, make_due, make_stalled

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    thread = Thread.objects.create(id="history")
    for first in range(0, args.runs, 20_000):
        Run.objects.bulk_create(
            Run(id=f"run_done_{i:08d}", agent_id="bulk-agent-1", thread=thread, status=Run.Status.COMPLETED)
            for i in range(first, min(first + 20_000, args.runs))
        )
    waiting = bulk_suspended_runs(args.waiting)
    make_due(waiting[:5])
    make_stalled(lease_expired=waiting[10:15], decided=waiting[20:25])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    written = time.perf_counter() - started
    print(f"history: {args.runs} finished runs, {args.waiting} waiting ({written:.0f} s to write)")

    def timed(fn) -> float:  # noqa: ANN001
        samples = []
        for _ in range(args.repeat):
            with transaction.atomic():
                began = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - began) * 1000)
                transaction.set_rollback(True)
        return statistics.median(samples)

    for label, drop in (("with the partial indexes", False), ("without them", True)):
        with transaction.atomic():
            if drop:
                with connection.cursor() as cursor:
                    for name in INDEXES:
                        cursor.execute(f'DROP INDEX "{name}"')
            stalled = timed(lease.claim_stalled_runs)
            due = timed(lambda: list(due_runs(100)))
            expiry = timed(expire_due_runs)
            transaction.set_rollback(True)
        print(
            f"sweep {label}: claim stalled runs {stalled:.2f} ms, find due runs {due:.2f} ms, "
            f"expire them {expiry:.2f} ms (median of {args.repeat})"
        )


if __name__ == "__main__":
    main()

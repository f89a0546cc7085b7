"""The sweep's queries follow the work due, not the history (partial indexes, PostgreSQL EXPLAIN), and
several sweepers share the work without waiting on each other (``SKIP LOCKED``)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentrun.core.models import Run, Thread
from agentrun.engine import lease
from agentrun.engine.decisions import expire_due_runs
from tests.helpers.runs import bulk_suspended_runs, make_due, make_stalled

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def history(count: int) -> None:
    """``count`` finished runs: what a year of traffic leaves behind."""
    thread = Thread.objects.create(id="history")
    runs = [
        Run(id=f"run_done_{i:07d}", agent_id="bulk-agent-1", thread=thread, status=Run.Status.COMPLETED)
        for i in range(count)
    ]
    Run.objects.bulk_create(runs, batch_size=5000)


def plans(queries: list[dict], table: str) -> list[str]:
    out = []
    for query in queries:
        sql = query["sql"]
        if sql.lstrip().upper().startswith("SELECT") and f'"{table}"' in sql.split(" WHERE ")[0]:
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN " + sql)
                out.append("\n".join(row[0] for row in cursor.fetchall()))
    return out


def test_the_sweeps_queries_use_partial_indexes_at_volume():
    history(30_000)
    waiting = bulk_suspended_runs(6_000)
    make_due(waiting[:3])
    make_stalled(lease_expired=waiting[10:12], decided=waiting[20:23])
    with connection.cursor() as cursor:
        for table in ("agentrun_run", "agentrun_snapshot", "agentrun_suspendedtoolcall", "agentrun_decision"):
            cursor.execute(f"VACUUM ANALYZE {table}")

    with CaptureQueriesContext(connection) as captured:
        claimed = lease.claim_stalled_runs()
    assert sorted(run_id for _, run_id in claimed) == sorted(waiting[10:12] + waiting[20:23])
    lease_plan, undriven_plan = plans(captured.captured_queries, "agentrun_run")
    assert "run_lease_expiry" in lease_plan and "Seq Scan" not in lease_plan, lease_plan
    assert "suspended_call_decided" in undriven_plan, undriven_plan
    assert "Seq Scan on agentrun_run" not in undriven_plan and "Seq Scan on agentrun_suspendedtoolcall" not in (
        undriven_plan
    ), undriven_plan
    # Claimed: a second sweeper finds nothing to dispatch until the dispatch lease lapses.
    assert lease.claim_stalled_runs() == []

    with CaptureQueriesContext(connection) as captured:
        assert expire_due_runs() == 3
    [expiry_plan] = plans(captured.captured_queries, "agentrun_snapshot")[:1]
    assert "snapshot_expiry" in expiry_plan and "Seq Scan" not in expiry_plan, expiry_plan
    assert set(Run.objects.filter(status=Run.Status.EXPIRED).values_list("pk", flat=True)) == set(waiting[:3])


def _in_another_connection(fn):
    """Run ``fn`` on a thread (its own connection) and return its result; fail if it blocks."""
    result: list = []

    def target() -> None:
        try:
            result.append(fn())
        finally:
            connections.close_all()

    worker = threading.Thread(target=target)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "the sweeper waited for a row another process holds"
    return result[0]


def test_sweepers_skip_the_runs_another_one_holds_instead_of_waiting():
    waiting = bulk_suspended_runs(20)
    make_due(waiting[:2])
    make_stalled(lease_expired=waiting[5:7], decided=[])
    held_due, held_stalled = waiting[0], waiting[5]
    with transaction.atomic():
        # Another sweeper (or a decider) is working on these two runs right now.
        list(Run.objects.select_for_update().filter(pk__in=[held_due, held_stalled]))
        claimed = _in_another_connection(lease.claim_stalled_runs)
        assert [run_id for _, run_id in claimed] == [waiting[6]]
        assert _in_another_connection(expire_due_runs) == 1
        assert Run.objects.get(pk=waiting[1]).status == Run.Status.EXPIRED
    # Released: the next round takes the rest.
    assert [run_id for _, run_id in lease.claim_stalled_runs()] == [held_stalled]
    assert expire_due_runs() == 1
    assert Run.objects.get(pk=held_due).status == Run.Status.EXPIRED
    assert Run.objects.get(pk=held_due).expired_at <= timezone.now() + timedelta(seconds=1)

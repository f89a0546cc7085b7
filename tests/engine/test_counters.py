"""The listing's ``total`` comes from snapshot counters (``SnapshotCount``), kept by triggers: it must equal
a brute-force count of the listed snapshots after every kind of write, concurrent ones included."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentrun import Agent, get_agent
from agentrun.core.ids import new_id
from agentrun.core.models import Run, RunStep, Snapshot, SnapshotCount
from agentrun.core.selectors import list_suspended_runs
from agentrun.demo import send_email
from agentrun.engine import store
from agentrun.engine.chunklog import ChunkLog
from agentrun.engine.decisions import cancel_on_timeout, cancel_run, expire_due_runs
from agentrun.engine.providers import usage_dict
from agentrun.engine.types import Decider, OpenCall, Waiting
from tests.helpers.decisions import record_decision
from tests.helpers.runs import EMAIL, bulk_suspended_runs, collect, of_type, start, suspended_email_run, tool_line

pytestmark = pytest.mark.django_db(transaction=True)

HOURS_AGO = timedelta(hours=3)


def _brute_total(agent_id: str, **filters: object) -> int:
    """The count the listing made before counters: every matching snapshot within its time to live."""
    snapshots = Snapshot.objects.filter(agent_id=agent_id, **filters)
    return snapshots.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())).count()


def check_exact() -> int:
    """Counters equal the snapshots key by key (no zero or negative rows), and every listing total —
    per agent, thread, resource, both, and date-bounded — equals the brute-force count. Returns how
    many totals were compared."""
    expected: Counter = Counter()
    for s in Snapshot.objects.all():
        expected[(s.agent_id, "agent", "")] += 1
        expected[(s.agent_id, "thread", s.thread_id)] += 1
        if s.resource_id is not None:
            expected[(s.agent_id, "resource", s.resource_id)] += 1
    actual: Counter = Counter()
    for row in SnapshotCount.objects.all():
        assert row.snapshots > 0, row
        assert 0 <= row.slot < SnapshotCount.SLOTS, row
        actual[(row.agent_id, row.scope, row.scope_id)] += row.snapshots
    assert actual == expected

    compared = 0
    rows = list(Snapshot.objects.values("agent_id", "thread_id", "resource_id", "created_at"))
    for agent_id in {r["agent_id"] for r in rows} | {"nobody-agent"}:
        mine = [r for r in rows if r["agent_id"] == agent_id]
        middle = sorted(r["created_at"] for r in mine)[len(mine) // 2] if mine else timezone.now()
        cases: list[dict] = [{}, {"created_at__gte": middle}, {"created_at__lte": middle}]
        cases += [{"thread_id": t} for t in {r["thread_id"] for r in mine}]
        cases += [{"resource_id": res} for res in {r["resource_id"] for r in mine} if res]
        cases += [{"thread_id": r["thread_id"], "resource_id": r["resource_id"]} for r in mine[:3] if r["resource_id"]]
        cases += [{"thread_id": r["thread_id"], "created_at__gte": middle} for r in mine[:3]]
        for filters in cases:
            listing = {
                "thread_id": filters.get("thread_id"),
                "resource_id": filters.get("resource_id"),
                "from_date": filters.get("created_at__gte"),
                "to_date": filters.get("created_at__lte"),
            }
            total = list_suspended_runs(agent_id=agent_id, **listing).total
            assert total == _brute_total(agent_id, **filters), (agent_id, filters)
            compared += 1
    return compared


exact = sync_to_async(check_exact)


@sync_to_async
def _expire_soon(run_id: str) -> None:
    """The run's time to live passed hours ago; the sweeper has not come by yet."""
    past = timezone.now() - HOURS_AGO
    Run.objects.filter(pk=run_id).update(expires_at=past)
    Snapshot.objects.filter(run_id=run_id).update(expires_at=past)


async def test_totals_stay_exact_through_every_way_a_run_starts_and_stops_waiting():
    support = get_agent("support-agent")
    runs = [
        await suspended_email_run(thread=f"t-{i % 3}", resource=f"u-{i % 2}", args={**EMAIL, "subject": str(i)})
        for i in range(6)
    ]
    await exact()
    # Two open calls on one run: deciding one leaves the run waiting, deciding both ends the wait.
    both = tool_line("send-email", EMAIL) + "\n" + tool_line("delete-record", {"table": "orders", "id": 7})
    stream, chunks = await start("support-agent", both, thread="t-0", resource=None)
    two = stream.run_id
    first, second = (c["payload"]["toolCallId"] for c in of_type(chunks, "tool-call-approval"))
    await exact()
    # A resumable tool, and a sub-agent whose inner run waits too (two snapshots, two agents).
    asking, _ = await start("support-agent", tool_line("ask-user", {"question": "Which order?"}), thread="t-1")
    supervised, chunks = await start(
        "support-supervisor",
        tool_line("agent-billing-agent", {"message": tool_line("refund", {"orderId": "A-17", "amount": 25.5})}),
        thread="t-sup",
        resource="u-0",
    )
    assert of_type(chunks, "tool-call-approval")[0]["payload"]["innerRunId"]
    assert await exact() > 10

    await collect(support.approve_tool_call(run_id=runs[0]))  # approved, runs, completes
    await exact()
    await collect(support.decline_tool_call(run_id=runs[1], reason="no"))
    await exact()
    await collect(support.approve_tool_call(run_id=two, tool_call_id=first))
    assert await sync_to_async(Snapshot.objects.filter(run_id=two).exists)()
    await exact()
    await collect(support.decline_tool_call(run_id=two, tool_call_id=second))
    await exact()
    await collect(support.resume_stream({"answer": "A-17"}, run_id=asking.run_id))
    await exact()
    await collect(get_agent("support-supervisor").approve_tool_call(run_id=supervised.run_id))
    await exact()

    await sync_to_async(cancel_run)(run_id=runs[2])
    await exact()
    # Past its time to live: out of every total at once, then the sweep expires it.
    await _expire_soon(runs[3])
    await exact()
    assert await sync_to_async(expire_due_runs)() == 1
    await exact()
    call = await sync_to_async(lambda: Run.objects.get(pk=runs[4]).suspended_calls.get())()
    assert await sync_to_async(cancel_on_timeout)(
        run_id=runs[4], tool_call_id=call.tool_call_id, reason="late", details={"policy": "timeout"}
    )
    await exact()
    failed = await sync_to_async(Run.objects.get)(pk=runs[5])
    await sync_to_async(store.fail_run_sync)(failed, {"code": "server_error", "message": "boom"})
    await exact()
    assert await sync_to_async(Snapshot.objects.count)() == 0
    assert await sync_to_async(SnapshotCount.objects.count)() == 0


@sync_to_async
def _delete_run(run_id: str) -> None:
    Run.objects.filter(pk=run_id).delete()  # the admin's delete: the snapshot goes by cascade


async def test_a_cascade_and_a_rolled_back_suspension_keep_the_totals_exact():
    kept = await suspended_email_run(thread="t-a")
    doomed = await suspended_email_run(thread="t-a")
    await _delete_run(doomed)
    await exact()
    assert (await get_agent("support-agent").list_suspended_runs()).total == 1

    @sync_to_async
    def suspend_then_roll_back() -> None:
        other = store.create_run(
            agent_id="support-agent", messages=[], thread_id="t-b", resource_id="u-b", metadata={}, options={}
        )
        step = RunStep.objects.filter(run_id=kept).first()
        with pytest.raises(RuntimeError), transaction.atomic():
            Snapshot.objects.filter(run_id=kept).delete()
            Snapshot.objects.create(
                run=other, agent_id="support-agent", thread_id="t-b", created_at=timezone.now(), step=step
            )
            check_exact()  # inside the transaction too
            raise RuntimeError("roll back")

    await suspend_then_roll_back()
    await exact()
    assert (await get_agent("support-agent").list_suspended_runs()).total == 1


def test_bulk_writes_moves_and_deletes_are_counted():
    bulk_suspended_runs(600, agents=3, threads=40, resources=7)
    assert check_exact() > 100
    # A snapshot moved to another thread and resource (never done by the engine, but exact anyway).
    Snapshot.objects.filter(run_id__in=["run_bulk_0000001", "run_bulk_0000002"]).update(
        thread_id="bulk-thread-moved", resource_id=None
    )
    Snapshot.objects.filter(run_id="run_bulk_0000004").update(suspended_at=timezone.now())  # no key changes
    check_exact()
    Snapshot.objects.filter(agent_id="bulk-agent-1", thread_id__in=["bulk-thread-7", "bulk-thread-14"]).delete()
    check_exact()
    past = timezone.now() - HOURS_AGO
    Snapshot.objects.filter(agent_id="bulk-agent-2", resource_id="bulk-user-3").update(expires_at=past)
    assert list_suspended_runs(agent_id="bulk-agent-2", resource_id="bulk-user-3").total == 0
    check_exact()
    Snapshot.objects.filter(agent_id="bulk-agent-0").delete()
    check_exact()
    assert not SnapshotCount.objects.filter(agent_id="bulk-agent-0").exists()


def test_the_migration_counts_the_snapshots_that_were_there_before_it():
    executor = MigrationExecutor(connection)
    before = [d for d in executor.loader.get_migration("agentrun", "0009_listing_counters").dependencies]
    leaves = executor.loader.graph.leaf_nodes()
    state = executor.migrate(before)  # no counters yet
    bulk_suspended_runs(200, agents=2, threads=9, resources=4, apps=state.apps)
    executor = MigrationExecutor(connection)
    executor.migrate(leaves)
    assert check_exact() > 20
    assert list_suspended_runs(agent_id="bulk-agent-1").total == 100


def test_the_total_is_one_query_that_counts_no_snapshot_rows():
    bulk_suspended_runs(300, agents=2, threads=30, resources=5)
    for filters in ({}, {"thread_id": "bulk-thread-7"}, {"resource_id": "bulk-user-3"}):
        with CaptureQueriesContext(connection) as captured:
            page = list_suspended_runs(agent_id="bulk-agent-1", per_page=5, page=0, **filters)
        assert page.total == _brute_total("bulk-agent-1", **filters) > 5
        total_sql = captured.captured_queries[0]["sql"]
        # The counters, and snapshots only through the expiry index (those past their time to live).
        assert '"agentrun_snapshotcount"' in total_sql, total_sql
        assert total_sql.count('FROM "agentrun_snapshot"') == 1, total_sql
        assert '"expires_at" <=' in total_sql, total_sql


@pytest.mark.postgres
def test_truncating_the_snapshots_clears_the_counts():
    bulk_suspended_runs(50, agents=2, threads=5, resources=3)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE agentrun_snapshot")
    check_exact()
    assert list_suspended_runs(agent_id="bulk-agent-1").total == 0


# --- concurrency (PostgreSQL: real row locks, one connection per thread) ----------------------------
def _suspend(i: int, barrier: threading.Barrier) -> str:
    """Suspend a run as the loop does (the store's own writers), after the barrier, on this thread's connection."""
    try:
        run = store.create_run(
            agent_id=f"race-agent-{i % 2}",
            messages=[{"role": "user", "content": "go"}],
            thread_id=f"race-t{i % 3}",
            resource_id=f"race-u{i % 2}" if i % 5 else None,
            metadata={},
            options={},
        )
        log = ChunkLog(run.id, run.next_seq, [])
        call = {"id": f"call-{i}", "name": "send-email", "args": EMAIL}
        tool_step = store.record_model_step(
            run, log, message_id=new_id("msg"), text="", calls=[call], usage=usage_dict(0, 0), started_at=timezone.now()
        )
        opens = [
            OpenCall(
                tool_call_id=call["id"],
                tool_name="send-email",
                args=EMAIL,
                position=0,
                risk="medium",
                waiting=Waiting(requires_approval=True),
            )
        ]
        barrier.wait()
        store.record_suspension(run, tool_step.id, log, opens=opens, ttl=None)
        return run.id
    finally:
        connection.close()


def _end(run_id: str, how: str, barrier: threading.Barrier) -> None:
    try:
        agent_id = Run.objects.values_list("agent_id", flat=True).get(pk=run_id)
        barrier.wait()
        if how == "cancel":
            cancel_run(run_id=run_id)
        else:
            record_decision(agent_id=agent_id, run_id=run_id, kind=how, decider=Decider.system("reviewer"))
    finally:
        connection.close()


@pytest.mark.postgres
def test_concurrent_suspensions_decisions_and_cancels_keep_the_counters_exact():
    for a in (0, 1):
        Agent(id=f"race-agent-{a}", tools=[send_email], model="directive")
    workers = 12
    with ThreadPoolExecutor(max_workers=workers) as pool:
        barrier = threading.Barrier(workers, timeout=30)
        runs = list(pool.map(lambda i: _suspend(i, barrier), range(workers)))
        check_exact()
        assert list_suspended_runs(agent_id="race-agent-0").total == workers // 2

        # Everything at once: half the runs end (approve, decline, cancel), new runs suspend beside them.
        barrier = threading.Barrier(workers, timeout=30)
        hows = ["approve", "decline", "cancel"]
        ends = [pool.submit(_end, run_id, hows[i % 3], barrier) for i, run_id in enumerate(runs[: workers // 2])]
        more = [pool.submit(_suspend, workers + i, barrier) for i in range(workers - len(ends))]
        for future in ends + more:
            future.result()  # no deadlock, no lost update: every writer succeeded
    check_exact()
    assert sum(list_suspended_runs(agent_id=f"race-agent-{a}").total for a in (0, 1)) == workers

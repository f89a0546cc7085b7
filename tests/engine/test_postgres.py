"""PostgreSQL: the listing query stays on indexes at volume; concurrent deciders decide exactly once."""

from __future__ import annotations

import asyncio
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentrun import AgentRunError, get_agent, get_run
from agentrun.core.models import Decision, ToolEffect
from agentrun.core.selectors import list_suspended_runs
from agentrun.engine.loop import Segment
from agentrun.engine.types import Decider
from tests.factories import EMAIL, bulk_suspended_runs, final_answer, suspended_email_run
from tests.factories import record_decision as decide

START = datetime(2024, 1, 1, tzinfo=UTC)
INDEX_ON_SNAPSHOT = re.compile(
    r"(Index Scan|Index Only Scan)( Backward)? using \w+ on agentrun_snapshot|Bitmap Index Scan on snapshot_\w+"
)


def _filters() -> dict[str, dict]:
    mid = START + timedelta(days=2)
    return {
        "agent only": {},
        "agent + thread": {"thread_id": "bulk-thread-27"},
        "agent + resource": {"resource_id": "bulk-user-47"},
        "agent + from/to": {"from_date": mid, "to_date": mid + timedelta(hours=6)},
        "agent + from": {"from_date": mid},
        "agent + to": {"to_date": mid.isoformat()},
        "agent + thread + resource": {"thread_id": "bulk-thread-27", "resource_id": "bulk-user-27"},
        "agent + thread + dates": {"thread_id": "bulk-thread-27", "from_date": START, "to_date": mid},
        "agent + resource + dates": {"resource_id": "bulk-user-47", "from_date": mid},
        "agent paged": {"per_page": 50, "page": 3},
        "agent + resource paged": {"resource_id": "bulk-user-47", "per_page": 20, "page": 0},
    }


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_listing_uses_snapshot_indexes_at_volume():
    ids = bulk_suspended_runs(12_000, agents=10, threads=400, resources=150, start=START)
    assert len(ids) == 12_000
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE agentrun_snapshot")
        cursor.execute("VACUUM ANALYZE agentrun_suspendedtoolcall")

    for label, filters in _filters().items():
        with CaptureQueriesContext(connection) as captured:
            page = list_suspended_runs(agent_id="bulk-agent-1", **filters)
        # count, the page of snapshots, their open calls: three queries whatever the page size.
        assert len(captured.captured_queries) == 3, (label, [q["sql"] for q in captured.captured_queries])
        assert page.total >= len(page.runs) > 0, label
        assert all(r.agent_id == "bulk-agent-1" and len(r.tool_calls) == 1 for r in page.runs)
        snapshot_queries = [q["sql"] for q in captured.captured_queries if '"agentrun_snapshot"' in q["sql"]]
        assert len(snapshot_queries) == 2, label
        for sql in snapshot_queries:
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN " + sql)
                plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Seq Scan on agentrun_snapshot" not in plan, f"{label}:\n{sql[:1000]}\n{plan[:2000]}"
            assert INDEX_ON_SNAPSHOT.search(plan), f"{label}: no snapshot index\n{sql[:1000]}\n{plan[:2000]}"
        calls_sql = next(q["sql"] for q in captured.captured_queries if '"agentrun_suspendedtoolcall"' in q["sql"])
        if 0 < len(page.runs) <= 100:  # a page's open calls: by run id, on an index (a full listing may scan)
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN " + calls_sql)
                plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Seq Scan on agentrun_suspendedtoolcall" not in plan, f"{label}:\n{plan[:2000]}"

    # Spot-check the answers too: the filters and total are right at volume.
    everything = list_suspended_runs(agent_id="bulk-agent-1")
    assert everything.total == 1_200
    created = [r.created_at for r in everything.runs]
    assert created == sorted(created, reverse=True)
    paged = list_suspended_runs(agent_id="bulk-agent-1", per_page=50, page=3)
    assert [r.run_id for r in paged.runs] == [r.run_id for r in everything.runs[150:200]]


def _race(run_id: str, deciders: int) -> list[object]:
    """``deciders`` threads, each with its own database connection, approving at the same moment."""
    barrier = threading.Barrier(deciders, timeout=30)

    def attempt(i: int) -> object:
        try:
            barrier.wait()
            return decide(
                agent_id="support-agent",
                run_id=run_id,
                kind="approve",
                decider=Decider.system(f"reviewer-{i}"),
                reason=f"approved by {i}",
            )
        except AgentRunError as exc:
            return exc
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=deciders) as pool:
        return list(pool.map(attempt, range(deciders)))


async def _exactly_once(deciders: int) -> None:
    run_id = await suspended_email_run()
    outcomes = await asyncio.to_thread(_race, run_id, deciders)
    winners = [o for o in outcomes if not isinstance(o, AgentRunError)]
    losers = [o for o in outcomes if isinstance(o, AgentRunError)]
    assert len(winners) == 1, outcomes
    assert len(losers) == deciders - 1
    assert {e.code for e in losers} <= {"TOOL_CALL_ALREADY_DECIDED", "RUN_NOT_SUSPENDED", "RUN_NOT_FOUND"}, losers

    @sync_to_async
    def decisions():
        return list(Decision.objects.filter(run_id=run_id))

    [decision] = await decisions()
    assert decision.decided_by_username == winners[0].decision.decided_by_username

    # The continuation, driven by several drivers at once (a retried request, a second worker):
    # the lease lets one apply the decision; the tool's effect happens once.
    agent = get_agent("support-agent")
    await asyncio.gather(*(Segment(agent, run_id).run() for _ in range(3)))
    assert (await get_run(run_id)).status == "completed"
    assert await final_answer(run_id) == f'send-email: {{"sent": true, "to": "{EMAIL["to"]}"}}'

    @sync_to_async
    def effects():
        return list(ToolEffect.objects.filter(run_id=run_id, tool_name="send-email"))

    [effect] = await effects()
    assert effect.payload == EMAIL
    with pytest.raises(AgentRunError) as err:
        await agent.approve_tool_call(run_id=run_id)
    assert err.value.code in {"TOOL_CALL_ALREADY_DECIDED", "RUN_NOT_FOUND"}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
async def test_twenty_four_concurrent_deciders_decide_exactly_once():
    await _exactly_once(24)


@pytest.mark.django_db(transaction=True)
async def test_concurrent_deciders_decide_exactly_once_on_any_database():
    await _exactly_once(6)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_listing_across_agents_uses_snapshot_indexes_at_volume():
    """GET /api/suspended-runs (docs/api.md#across-agents): several agents at once, still on indexes."""
    bulk_suspended_runs(12_000, agents=10, threads=400, resources=150, start=START)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE agentrun_snapshot")
    agents = [f"bulk-agent-{n}" for n in range(6)]
    for label, filters in _filters().items():
        with CaptureQueriesContext(connection) as captured:
            page = list_suspended_runs(agent_ids=agents, **filters)
        assert len(captured.captured_queries) == 3, label
        assert page.total >= len(page.runs) > 0, label
        assert {r.agent_id for r in page.runs} <= set(agents)
        if not ({"per_page", "thread_id", "resource_id"} & set(filters)):
            continue  # most of the table (6 agents of 10, unpaged): reading it whole is the right plan
        for sql in [q["sql"] for q in captured.captured_queries if '"agentrun_snapshot"' in q["sql"]]:
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN " + sql)
                plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Seq Scan on agentrun_snapshot" not in plan, f"{label}:\n{sql[:1000]}\n{plan[:2000]}"
            assert INDEX_ON_SNAPSHOT.search(plan), f"{label}: no snapshot index\n{sql[:1000]}\n{plan[:2000]}"
    everything = list_suspended_runs(agent_ids=agents)
    assert everything.total == len(everything.runs) == 7_200
    assert [(r.created_at, r.run_id) for r in everything.runs] == sorted(
        ((r.created_at, r.run_id) for r in everything.runs), reverse=True
    )
    paged = list_suspended_runs(agent_ids=agents, per_page=50, page=3)
    assert [r.run_id for r in paged.runs] == [r.run_id for r in everything.runs[150:200]]
    one = list_suspended_runs(agent_ids=["bulk-agent-1"], thread_id="bulk-thread-27")
    assert one.to_dict() == list_suspended_runs(agent_id="bulk-agent-1", thread_id="bulk-thread-27").to_dict()

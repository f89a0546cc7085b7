"""The decision cycle's round trips are pinned: a change that adds SQL statements to it fails here.

Counted on every connection (the engine's database calls run on asgiref's thread): the suspension (a
run started through the Python API until it waits), then the decision and the continuation that
carries it out and completes the run. ``benchmarks/cycle.py`` measures the same cycle's time.
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from agentrun import Agent, ToolContext, get_agent, tool
from agentrun.core.models import Run, Thread, ToolEffect
from agentrun.demo import send_email
from agentrun.engine.decisions import cancel_run, record_decisions
from agentrun.engine.lease import create_run_to_drive
from agentrun.engine.loop import Segment
from agentrun.engine.runtime import db
from agentrun.engine.types import PYTHON, DecisionCommand, DecisionRequest
from benchmarks.cycle import one_cycle, statement_log
from tests.helpers.decisions import decide_call, record_decision
from tests.helpers.runs import EMAIL, of_type, start, tool_line

pytestmark = pytest.mark.django_db(transaction=True)

# Measured when the round trips were cut (issue 12), down from 43 and 55 on SQLite (whose count
# includes each BEGIN) and 38 and 48 on PostgreSQL; cut again in the third pass (docs/performance.md,
# "Decision cycle and topology (third pass)": the expiry check under the decision's lock, no savepoint,
# the lease taken with the run's read and released by the segment's last write, one read of the
# decided calls, one UPDATE to complete; 21 / 32 and 17 / 28), and in its fourth pass (the lease's
# UPDATE reads and starts the run, the status comes back from the log's fenced UPDATE, a run that has
# not waited has no snapshot to delete; on PostgreSQL each write of the log is one statement, a
# data-modifying WITH; 19 / 29 and 8 / 17 with an expiry check the service no longer makes, dropped
# here since), and in its sixth (a run driven by its creator is created started with its lease; on
# PostgreSQL the continuation marks its first call executing in the statement that reads the calls;
# 18 / 28 and 7 / 15). Lower them when you cut more; never raise them.
MOST = {
    "sqlite": {"suspend": 18, "decide_and_complete": 28},
    "postgresql": {"suspend": 7, "decide_and_complete": 15},
}
# The whole cycle as a user of the Python API meets it (``benchmarks/cycle.py``, what ``make bench``
# times): the above, plus the decision service's enqueue and the reads of the stream that relays the
# continuation (``fanout.subscribe``). 69 and 60 before the third pass, 61 and 53 after it; 49 and 26
# before the sixth.
CYCLE_MOST = {"sqlite": 48, "postgresql": 24}


def _listing(statements: list[str]) -> str:
    return "\n".join(f"  {sql[:160]}" for sql in statements)


async def _suspended(thread: str) -> str:
    """What ``stream()`` does (its producer task aside): the run created, its first segment driven."""
    run = await db(create_run_to_drive)(
        agent_id="support-agent",
        messages=[{"role": "user", "content": tool_line("send-email", EMAIL)}],
        thread_id=thread,
        resource_id="user-1",
        metadata={},
        options={},
    )
    assert (await Segment(get_agent("support-agent"), run.id, created=run).run()).finish_reason == "suspended"
    return run.id


async def test_a_decision_cycle_costs_no_more_statements_than_measured():
    await _suspended("warm-up")  # connections opened, registry loaded
    most = MOST[connection.vendor]
    with statement_log() as log:
        await db(log.install_here)()
        with log.phase() as suspend:
            run_id = await _suspended("t-cycle")
        with log.phase() as decide:
            # What the decision service does (less the enqueue; the expiry check is under the decision's
            # lock), then the continuation it queues.
            await sync_to_async(record_decision)(agent_id="support-agent", run_id=run_id, kind="approve")
            await Segment(get_agent("support-agent"), run_id).run()
        await db(log.uninstall_here)()
    assert (await Run.objects.aget(pk=run_id)).status == Run.Status.COMPLETED
    assert len(suspend) <= most["suspend"], f"{len(suspend)} statements to suspend:\n{_listing(suspend)}"
    assert len(decide) <= most["decide_and_complete"], (
        f"{len(decide)} statements to decide and complete:\n{_listing(decide)}"
    )


async def test_a_cycle_through_the_python_api_costs_no_more_statements_than_measured():
    """stream() until the run waits, approve_tool_call(), read the continuation until it completes. The
    fewest of three cycles: a relaying stream may read the log once more when chunks reach it late."""
    await _suspended("warm-up")
    cycles = []
    with statement_log() as log:
        await db(log.install_here)()
        for index in range(3):
            figures = await one_cycle(log, index)
            cycles.append([*figures["suspend_sql"], *figures["approve_complete_sql"]])
        await db(log.uninstall_here)()
    statements = min(cycles, key=len)
    assert len(statements) <= CYCLE_MOST[connection.vendor], (
        f"{len(statements)} statements for one cycle:\n{_listing(statements)}"
    )


@tool(id="cancel-own-run", requires_approval=True, description="Cancels the run it belongs to.")
async def cancel_own_run(*, ctx: ToolContext) -> dict:
    await sync_to_async(cancel_run)(run_id=ctx.run_id)
    return {"cancelled": True}


async def test_decided_calls_loaded_together_are_not_carried_out_once_the_run_is_cancelled():
    """The continuation reads every decided call in one query: one that no longer waits when its turn
    comes (the run was cancelled while an earlier one ran) must not run."""
    Agent(id="cancelling-agent", tools=[cancel_own_run, send_email], model="directive")
    message = tool_line("cancel-own-run", {}) + "\n" + tool_line("send-email", EMAIL)
    stream, chunks = await start("cancelling-agent", message, thread="t-cancel")
    first, second = (c["payload"]["toolCallId"] for c in of_type(chunks, "tool-call-approval"))
    requests = [
        DecisionRequest(kind="approve", tool_call_id=first),
        DecisionRequest(kind="approve", tool_call_id=second),
    ]
    await sync_to_async(record_decisions)(
        DecisionCommand(
            agent_id="cancelling-agent", run_id=stream.run_id, requests=tuple(requests), decider=PYTHON, batch=True
        )
    )

    result = await Segment(get_agent("cancelling-agent"), stream.run_id).run()

    assert result.finish_reason == "cancelled"
    assert (await Run.objects.aget(pk=stream.run_id)).status == Run.Status.CANCELLED
    assert not await ToolEffect.objects.filter(tool_call_id=second).aexists()  # the email was never sent


async def test_the_audit_chain_head_is_locked_last_in_a_decision():
    """Decisions of unrelated runs queue on the chain head (receipts chain in commit order): it is taken
    by the decision's last statements, after its rows and its continuation's queue row, so another
    decision waits for the receipt's insert and the commit only (docs/security.md, "Audit receipts")."""
    run_id = await _suspended("t-head-last")
    with statement_log() as log:
        await db(log.install_here)()
        with log.phase() as decide:
            await sync_to_async(decide_call)(agent_id="support-agent", run_id=run_id, kind="decline")
        await db(log.uninstall_here)()
    tables = [sql.split('"')[1] if '"' in sql else sql for sql in decide]
    # (The continuation the decision queued may start before the phase ends: its statements come after.)
    head = tables.index("agentrun_auditchainhead")
    assert tables[head + 1] == "agentrun_auditreceipt", _listing(decide)
    # Every table the statements before the head's write to (a statement may write to several: a
    # data-modifying WITH on PostgreSQL).
    before = {name for sql in decide[:head] for name in sql.split('"')[1::2] if name.startswith("agentrun_")}
    assert {"agentrun_decision", "agentrun_suspendedtoolcall", "agentrun_snapshot"} <= before, _listing(decide)


@pytest.mark.django_db
def test_the_engines_statements_are_planned_once_per_connection_not_on_every_run():
    """The engine's statements (``agentrun.core.prepared``) keep the same text from one run to the next;
    on PostgreSQL their values are bound by the server, which prepares a statement once it has run
    ``AGENTRUN_DB_PREPARE_THRESHOLD`` times on a connection and no longer parses or plans it (what a
    DBA sees in ``pg_prepared_statements``). Values that SQL would misread if quoted into the text
    (``%``, quotes, ``/``, ``#``, unicode) come back as they were written."""
    from agentrun.core import prepared

    Thread.objects.create(id="t", resource_id="r")
    ids = [f"run_{i}%s%%'/ #é\"{i}" for i in range(7)]
    for run_id in ids:
        Run.objects.create(id=run_id, agent_id="support-agent", thread_id="t", resource_id="r")
    chosen = ids[:6]
    for run_id in chosen:
        assert prepared.table(Run).values(("id", "status"), '"id" = %s', [run_id]) == [(run_id, "queued")]
    if connection.vendor != "postgresql":
        return
    assert connection.settings_dict["OPTIONS"]["prepare_threshold"] == 5
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared_texts = [row[0] for row in cursor.fetchall()]
    assert any('SELECT "id", "status" FROM "agentrun_run" WHERE "id" = $1' in text for text in prepared_texts), (
        prepared_texts
    )

"""Issue 25: the database failing (PostgreSQL: a connection terminated, a statement cancelled, the
database refusing connections for a while, as during a restart).

A. An infrastructure error is never a tool's result: under an approved tool (its effect-ledger write)
it leaves the call approved and not carried out; the continuation runs it again with the same
``tool_call_id`` once the database answers, and the effect happens once.
C/D. No door goes silent or answers in Django's words: streams close with 1013 / an error event naming
the seq to resume after, REST answers 503 ``SERVICE_UNAVAILABLE`` with ``Retry-After``, the dashboard a
"try again" page, a new websocket is closed 1013 (docs/operations.md)."""

from __future__ import annotations

import json

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections, transaction
from psycopg import sql

from agentrun.core.models import Decision, Run, RunChunk, ToolEffect
from agentrun.engine.agents import Agent, get_agent
from agentrun.engine.dispatch import continue_run
from agentrun.engine.tools import ToolContext, tool
from agentrun.engine.types import Decider
from tests.helpers.asgi import AsgiClient, communicator, parse, receive_until
from tests.helpers.decisions import record_decision as decide
from tests.helpers.runs import EMAIL_LINE as EMAIL
from tests.helpers.runs import rested
from tests.helpers.users import reviewer_token

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

FAULTS = {
    # The server ends the connection under the write: what a PostgreSQL restart does.
    "connection terminated": "SELECT pg_terminate_backend(pg_backend_pid())",
    # The statement is cancelled and the connection lives on: the engine could go on writing.
    "statement cancelled": "SET LOCAL statement_timeout = 1; SELECT pg_sleep(1)",
}
attempts: dict[str, int] = {}


@sync_to_async
def _ledger_write(ctx: ToolContext, to: str, fault: str) -> None:
    """The demo tools' effect ledger; its first write of each call meets the fault."""
    attempts[ctx.tool_call_id] = attempts.get(ctx.tool_call_id, 0) + 1
    if attempts[ctx.tool_call_id] == 1:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(FAULTS[fault])
    ToolEffect.objects.get_or_create(
        tool_call_id=ctx.tool_call_id, defaults={"run_id": ctx.run_id, "tool_name": "send", "payload": {"to": to}}
    )


@tool(id="send", requires_approval=True, description="Send, recording the effect once.")
async def send(to: str, fault: str, *, ctx: ToolContext) -> dict:
    await _ledger_write(ctx, to, fault)
    return {"sent": True, "to": to}


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_a_database_error_under_an_approved_tool_is_not_its_result(fault):
    agent = Agent(id="ledger-agent", tools=[send], model="directive")
    stream = await agent.stream(f'/tool send {{"to": "ada@example.com", "fault": "{fault}"}}')
    await stream.collect()
    run_id = stream.run_id
    await sync_to_async(decide)(agent_id=agent.id, run_id=run_id, kind="approve", decider=Decider.system("ops"))

    # The continuation meets the fault, does not record it as the tool's result, and runs the call
    # again (same tool_call_id) once the database answers.
    assert await continue_run.acall(agent.id, run_id) == "stop"

    run = await Run.objects.aget(pk=run_id)
    call_id = (await Decision.objects.aget(run_id=run_id)).tool_call_id
    assert attempts[call_id] == 2
    assert run.status == "completed" and run.last_error is None
    assert await ToolEffect.objects.filter(tool_call_id=call_id).acount() == 1
    chunks = [c async for c in RunChunk.objects.filter(run_id=run_id).order_by("seq")]
    types = [c.type for c in chunks]
    assert "tool-error" not in types, types
    [result] = [c.payload for c in chunks if c.type == "tool-result"]
    assert result["toolCallId"] == call_id and result["result"] == {"sent": True, "to": "ada@example.com"}
    assert [c.seq for c in chunks] == list(range(1, len(chunks) + 1))
    assert types.count("start") == types.count("finish") and chunks[-1].payload["finishReason"] == "stop"


# --- the database away for a while ------------------------------------------------------------------
class DatabaseOutage:
    """The test database refuses new connections and loses those it has (what a PostgreSQL restart
    does), for as long as the test wants."""

    def __init__(self) -> None:
        db = connection.settings_dict
        self.name = db["NAME"]
        self.admin = psycopg.connect(
            host=db["HOST"] or "127.0.0.1",
            port=db["PORT"] or 5432,
            user=db["USER"] or "postgres",
            password=db["PASSWORD"] or None,
            dbname="postgres",
            autocommit=True,
        )
        self.on = False

    def begin(self) -> None:
        self.admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(self.name)))
        self.admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [self.name])
        self.on = True

    def restore(self) -> None:
        self.admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(self.name)))
        self.on = False

    async def end(self) -> None:
        self.restore()
        # The connection of the engine's thread died with the others: a fresh one from here on.
        await sync_to_async(connections.close_all)()


@pytest.fixture
def outage(transactional_db):
    down = DatabaseOutage()
    yield down
    if down.on:
        down.restore()
    connections.close_all()  # this thread's too, before the test database is flushed
    down.admin.close()


async def suspended(thread: str) -> tuple[str, int]:
    stream = await get_agent("support-agent").stream(EMAIL, memory={"thread": thread})
    chunks = await stream.collect()
    return stream.run_id, chunks[-1]["seq"]


async def test_a_run_socket_closes_1013_naming_the_seq_to_resume_after(outage):
    token = await reviewer_token("out-ws")
    run_id, last = await suspended("out-ws")
    comm = communicator(f"/ws/runs/{run_id}/?after=0", token)
    assert (await comm.connect())[0]
    await receive_until(comm, lambda f: f["type"] == "finish")  # replayed: it now waits, live
    outage.begin()
    closed = await comm.receive_output(timeout=30)
    assert closed == {"type": "websocket.close", "code": 1013, "reason": f"resume after={last}"}

    # While the database is away a new socket is closed 1013 too, never refused with an HTTP error.
    refused = communicator(f"/ws/runs/{run_id}/?after={last}", token)
    assert (await refused.connect(timeout=30))[0]
    assert await refused.receive_output(timeout=30) == {
        "type": "websocket.close",
        "code": 1013,
        "reason": "try again later",
    }
    await outage.end()
    again = communicator(f"/ws/runs/{run_id}/?after={last - 1}", token)
    assert (await again.connect())[0]
    [finish] = await receive_until(again, lambda f: f["type"] == "finish")
    assert finish["seq"] == last
    await again.disconnect()


async def test_an_agent_socket_says_where_to_pick_a_run_up_and_stays_usable(outage):
    token = await reviewer_token("out-agents")
    comm = communicator("/ws/agents/support-agent/", token)
    assert (await comm.connect())[0]
    # A model call that takes a while: the socket relays the run's chunks meanwhile.
    await comm.send_json_to({"action": "stream", "messages": "/sleep 3000\nstill here"})
    [_, step] = await receive_until(comm, lambda f: f["type"] == "step-start")
    outage.begin()
    error = await comm.receive_json_from(timeout=30)
    assert error == {
        "type": "error",
        "error": {
            "code": "SERVICE_UNAVAILABLE",
            "message": "The database is unreachable; try again in 2 s.",
            "details": {"runId": step["runId"], "resumeAfter": step["seq"]},
        },
    }
    await outage.end()
    # The run went on (its segment tried again once the database answered); the rest is in its log.
    run = await rested(step["runId"], seconds=60)
    assert run.status == "completed"
    rest = communicator(f"/ws/runs/{step['runId']}/?after={step['seq']}", token)
    assert (await rest.connect())[0]
    chunks = await receive_until(rest, lambda f: f["type"] == "finish" and f["payload"]["finishReason"] == "stop")
    assert "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta") == "Echo: /sleep 3000\nstill here"
    # The agent socket is still usable.
    await comm.send_json_to({"action": "nonsense"})
    assert (await comm.receive_json_from(timeout=10))["error"]["code"] == "INVALID_REQUEST"
    await comm.disconnect()
    await rest.disconnect()


@pytest.fixture
def staged_driver(transactional_db):
    """Stages a live driver of a run (its lease), released once the outage is over (asked for before it)."""
    staged: list[str] = []

    def stage(run_id: str):  # noqa: ANN202 - the update's coroutine
        staged.append(run_id)
        return Run.objects.filter(pk=run_id).aupdate(lease_owner="host:1:alive", lease_expires_at=far_future())

    yield stage
    Run.objects.filter(pk__in=staged).update(lease_owner=None, lease_expires_at=None)


async def test_the_run_event_stream_ends_with_an_error_event_and_no_done(staged_driver, outage):
    token = await reviewer_token("out-sse")
    run_id, last = await suspended("out-sse")
    # Someone drives the run (a live lease): the stream stays open, live.
    await staged_driver(run_id)
    response = await AsgiClient({"Authorization": f"Token {token}"}).get(f"/api/runs/{run_id}/stream?after={last - 1}")
    parts = response.parts(timeout=30)
    events = parse(await anext(parts))
    assert [e["id"] for e in events] == [str(last)]
    outage.begin()
    async for part in parts:
        events += parse(part)
    error = events[-1]
    assert error["event"] == "error", events
    assert json.loads(error["data"])["error"]["code"] == "SERVICE_UNAVAILABLE"
    assert json.loads(error["data"])["error"]["details"] == {"resumeAfter": last}
    assert "done" not in [e["event"] for e in events]  # an EventSource reconnects by itself


async def test_rest_answers_503_with_retry_after_and_the_dashboard_a_try_again_page(outage, caplog):
    token = await reviewer_token("out-rest")
    session = await signed_in("out-rest")
    client = AsgiClient({"Authorization": f"Token {token}"})
    assert (await client.get("/api/agents/support-agent/suspended-runs")).status_code == 200
    outage.begin()
    answer = await client.get("/api/agents/support-agent/suspended-runs")
    assert answer.status_code == 503
    assert answer["Retry-After"] == "2" and answer["Content-Type"] == "application/json"
    assert json.loads(await answer.read())["error"]["code"] == "SERVICE_UNAVAILABLE"
    page = await AsgiClient({"cookie": f"sessionid={session}"}).get("/approvals/")
    assert page.status_code == 503 and page["Retry-After"] == "2"
    assert b"Try again in a moment" in await page.read()
    # The outage is logged once (agentrun.outages), not as an error line per request.
    assert not [r for r in caplog.records if r.name == "django.request"], caplog.text
    await outage.end()
    assert (await client.get("/api/agents/support-agent/suspended-runs")).status_code == 200


def far_future():
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() + timedelta(minutes=5)


@sync_to_async
def signed_in(username: str) -> str:
    """A session cookie of this user, as the dashboard's login would set it."""
    from django.contrib.auth.models import User
    from django.test import Client

    browser = Client()
    browser.force_login(User.objects.get(username=username))
    return browser.cookies["sessionid"].value

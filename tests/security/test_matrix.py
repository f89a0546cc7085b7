"""The authorization matrix: who may do what, on every REST endpoint, websocket route and dashboard page.

The target of every cell is ``support-agent``, which ``AGENTRUN_AGENT_REVIEWERS`` restricts to the group
"Support reviewers" (and ``billing-agent`` to "Billing reviewers"). The principals:

- ``anonymous``: nobody signed in;
- ``viewer``: ``Viewers`` + "Support reviewers" (may read support-agent, decide nothing);
- ``other``: ``Reviewers`` + "Billing reviewers": the global decide permission, but support-agent is
  outside its scope (the reviewer of another agent);
- ``reviewer``: ``Reviewers`` + "Support reviewers";
- ``superuser``: no group at all.

Cells read: ``401`` NOT_AUTHENTICATED, ``403`` PERMISSION_DENIED, ``404`` the row's not-found code,
``200+`` / ``200-`` a 200 whose answer does / does not contain the target. Every refused write is
checked to have changed nothing (no Decision row, run still suspended, no new run, task untouched);
every allowed write to have happened. Requests go through the real routing: the ASGI application for
REST and websockets (Origin ``http://localhost``), Django's test client for the dashboard.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token

from agentrun.asgi import application
from agentrun.core.access import REVIEWERS, VIEWERS, ensure_groups
from agentrun.core.errors import AgentRunError
from agentrun.core.models import BackgroundTask, Decision, Run, RunStep, SuspendedToolCall
from agentrun.engine.agents import get_agent
from agentrun.engine.types import Decider
from tests.api.asgi_client import AsgiClient
from tests.api.conftest import wait_rested
from tests.factories import collect, rested, start, suspended_email_run, tool_line
from tests.factories import decide_call as decide

pytestmark = pytest.mark.django_db(transaction=True)

TARGET = "support-agent"
SUPPORT_REVIEWERS = "Support reviewers"
BILLING_REVIEWERS = "Billing reviewers"
MAPPING = {TARGET: [SUPPORT_REVIEWERS], "billing-agent": [BILLING_REVIEWERS]}
PRINCIPALS = ("anonymous", "viewer", "other", "reviewer", "superuser")
ORIGIN = (b"origin", b"http://localhost")


def table(text: str) -> list[tuple[str, dict[str, str], str]]:
    """``row | anonymous | viewer | other | reviewer | superuser [| note]`` lines → (row, cells, note)."""
    rows = []
    for line in text.strip().splitlines()[2:]:
        name, *cells = (c.strip() for c in line.strip().strip("|").split("|"))
        note = cells.pop() if len(cells) > len(PRINCIPALS) else ""
        rows.append((name, dict(zip(PRINCIPALS, cells, strict=True)), note))
    return rows


# --- REST (docs/api.md) ----------------------------------------------------------------------------
# The last column is the error code a 404 carries.
REST = table("""
| endpoint                     | anonymous | viewer | other | reviewer | superuser | 404 code        |
|------------------------------|-----------|--------|-------|----------|-----------|-----------------|
| GET agents                   | 401       | 200+   | 200-  | 200+     | 200+      | -               |
| POST agent stream            | 401       | 403    | 404   | 200      | 200       | AGENT_NOT_FOUND |
| POST agent generate          | 401       | 403    | 404   | 200      | 200       | AGENT_NOT_FOUND |
| GET suspended-runs           | 401       | 200+   | 404   | 200+     | 200+      | AGENT_NOT_FOUND |
| GET all suspended-runs       | 401       | 200+   | 200-  | 200+     | 200+      | -               |
| GET all suspended-runs of a  | 401       | 200+   | 404   | 200+     | 200+      | AGENT_NOT_FOUND |
| POST approve                 | 401       | 403    | 404   | 202      | 202       | AGENT_NOT_FOUND |
| POST decline                 | 401       | 403    | 404   | 202      | 202       | AGENT_NOT_FOUND |
| POST resume                  | 401       | 403    | 404   | 202      | 202       | AGENT_NOT_FOUND |
| GET run                      | 401       | 200    | 404   | 200      | 200       | RUN_NOT_FOUND   |
| GET run steps                | 401       | 200    | 404   | 200      | 200       | RUN_NOT_FOUND   |
| GET run step                 | 401       | 200    | 404   | 200      | 200       | RUN_NOT_FOUND   |
| GET run stream               | 401       | 200    | 404   | 200      | 200       | RUN_NOT_FOUND   |
| POST run cancel              | 401       | 403    | 404   | 200      | 200       | RUN_NOT_FOUND   |
| GET thread messages          | 401       | 200+   | 404   | 200+     | 200+      | NOT_FOUND       |
| GET decisions                | 401       | 200+   | 200-  | 200+     | 200+      | -               |
| GET background-tasks         | 401       | 200+   | 200-  | 200+     | 200+      | -               |
| POST background-task cancel  | 401       | 403    | 404   | 200      | 200       | NOT_FOUND       |
| GET schema                   | 200       | 200    | 200   | 200      | 200       | -               |
| GET docs                     | 200       | 200    | 200   | 200      | 200       | -               |
""")

# --- websockets (docs/api.md#websockets) -----------------------------------------------------------
# <a> is support-agent; the action frame (stream / approve / decline / resume) is sent once connected.
# CODE/close: an error frame then the socket closes with that code; CODE alone: an error frame, the
# socket stays open; chunks: the run's chunks arrive; refused: the handshake is refused; event / silent:
# the approvals feed does / does not tell about a new support-agent call.
WEBSOCKETS = table("""
| route (frame sent)       | anonymous              | viewer            | other                | reviewer | superuser |
|--------------------------|------------------------|-------------------|----------------------|----------|-----------|
| ws/runs/<run>/           | NOT_AUTHENTICATED/4403 | chunks            | RUN_NOT_FOUND/4404   | chunks   | chunks    |
| ws/agents/<a>/ stream    | NOT_AUTHENTICATED/4403 | PERMISSION_DENIED | AGENT_NOT_FOUND/4404 | chunks   | chunks    |
| ws/agents/<a>/ approve   | NOT_AUTHENTICATED/4403 | PERMISSION_DENIED | AGENT_NOT_FOUND/4404 | chunks   | chunks    |
| ws/agents/<a>/ decline   | NOT_AUTHENTICATED/4403 | PERMISSION_DENIED | AGENT_NOT_FOUND/4404 | chunks   | chunks    |
| ws/agents/<a>/ resume    | NOT_AUTHENTICATED/4403 | PERMISSION_DENIED | AGENT_NOT_FOUND/4404 | chunks   | chunks    |
| ws/approvals/            | refused                | event             | silent               | event    | event     |
""")

# --- dashboard (docs/dashboard.md) -----------------------------------------------------------------
# 302 login: redirected to the login page; 302 run: decided, redirected to the run page.
DASHBOARD = table("""
| page                   | anonymous | viewer | other | reviewer | superuser | method |
|------------------------|-----------|--------|-------|----------|-----------|--------|
| inbox                  | 302 login | 200+   | 200-  | 200+     | 200+      | GET    |
| thread                 | 302 login | 200+   | 200-  | 200+     | 200+      | GET    |
| run                    | 302 login | 200    | 404   | 200      | 200       | GET    |
| history                | 302 login | 200+   | 200-  | 200+     | 200+      | GET    |
| decide approve         | 302 login | 403    | 403   | 302 run  | 302 run   | POST   |
| decide decline         | 302 login | 403    | 403   | 302 run  | 302 run   | POST   |
| decide resume          | 302 login | 403    | 403   | 302 run  | 302 run   | POST   |
""")


# --- the world every cell acts on ------------------------------------------------------------------
@pytest.fixture
def scoped(settings):
    settings.AGENTRUN_AGENT_REVIEWERS = MAPPING
    yield
    # The made-up tasks never end by themselves: end them, or the suite's teardown waits for them.
    BackgroundTask.objects.filter(tool_call_id__startswith=SYNTHETIC_TASK).update(status="cancelled")


@sync_to_async
def make_principals() -> dict[str, User | None]:
    ensure_groups()  # a transactional test flushed the groups post_migrate made

    def user(name: str, *groups: str, superuser: bool = False) -> User:
        made = User.objects.create_user(name, password=f"pw-{name}-1234", is_superuser=superuser, is_staff=superuser)
        made.groups.add(*(Group.objects.get_or_create(name=g)[0] for g in groups))
        return made

    return {
        "anonymous": None,
        "viewer": user("vera", VIEWERS, SUPPORT_REVIEWERS),
        "other": user("bill", REVIEWERS, BILLING_REVIEWERS),
        "reviewer": user("rita", REVIEWERS, SUPPORT_REVIEWERS),
        "superuser": user("root", superuser=True),
    }


@sync_to_async
def token_of(user: User | None) -> str | None:
    return None if user is None else Token.objects.get_or_create(user=user)[0].key


@dataclass
class World:
    """A support-agent thread: a run waiting for approval, one for resume data, one decided and done."""

    thread: str
    email_run: str
    ask_run: str
    done_run: str
    step_id: str
    task_id: str


def new_thread() -> str:
    return f"sec-{uuid.uuid4().hex[:10]}"


async def email_run(thread: str) -> str:
    return await suspended_email_run(thread=thread, resource="sec-user")


async def ask_run(thread: str) -> str:
    stream, _ = await start(
        TARGET, tool_line("ask-user", {"question": "Which city?"}), thread=thread, resource="sec-user"
    )
    return stream.run_id


SYNTHETIC_TASK = "call_sec_"


@sync_to_async
def pending_task(run_id: str) -> str:
    """A background task of a finished run, running with a fresh heartbeat (so no sweeper takes it
    over) and executed by nobody: asking it to stop (``cancel_requested``) is the write."""
    run = Run.objects.get(pk=run_id)
    now = timezone.now()
    return BackgroundTask.objects.create(
        run=run,
        agent_id=run.agent_id,
        thread_id=run.thread_id,
        tool_call_id=f"{SYNTHETIC_TASK}{uuid.uuid4().hex}",
        tool_name="research",
        args={"topic": "x", "seconds": 1},
        status="running",
        started_at=now,
        heartbeat_at=now,
    ).id


async def build_world() -> World:
    thread = new_thread()
    done = await email_run(thread)
    await sync_to_async(decide)(agent_id=TARGET, run_id=done, kind="approve", decider=Decider.system("ops"))
    await rested(done)
    email, ask = await email_run(thread), await ask_run(thread)
    step_id = await RunStep.objects.filter(run_id=email).values_list("id", flat=True).afirst()
    return World(thread, email, ask, done, step_id, await pending_task(done))


@sync_to_async
def run_state(run_id: str) -> tuple[str, int, int]:
    """(status, decisions, open calls): what a refused write must leave as it was."""
    return (
        Run.objects.get(pk=run_id).status,
        Decision.objects.filter(run_id=run_id).count(),
        SuspendedToolCall.objects.filter(run_id=run_id, status=SuspendedToolCall.Status.OPEN).count(),
    )


@sync_to_async
def target_run_count() -> int:
    return Run.objects.filter(agent_id=TARGET).count()


@sync_to_async
def task_state(task_id: str) -> tuple[str, bool]:
    task = BackgroundTask.objects.get(pk=task_id)
    return task.status, task.cancel_requested


# --- REST ----------------------------------------------------------------------------------------
@dataclass
class Call:
    method: str
    url: str
    body: Any = None
    run_id: str | None = None  # a run the request may change
    task_id: str | None = None


async def rest_call(row: str, world: World) -> Call:
    """The request of a row; writes get a fresh target so each cell starts from the same state."""
    thread, memory = world.thread, {"thread": world.thread, "resource": "sec-user"}
    match row:
        case "GET agents":
            return Call("GET", "/api/agents/")
        case "POST agent stream":
            return Call("POST", f"/api/agents/{TARGET}/stream", {"messages": "hello", "memory": memory})
        case "POST agent generate":
            return Call("POST", f"/api/agents/{TARGET}/generate", {"messages": "hello", "memory": memory})
        case "GET suspended-runs":
            return Call("GET", f"/api/agents/{TARGET}/suspended-runs")
        case "GET all suspended-runs":
            return Call("GET", "/api/suspended-runs")
        case "GET all suspended-runs of a":
            return Call("GET", f"/api/suspended-runs?agentId={TARGET}")
        case "POST approve" | "POST decline":
            run_id = await email_run(thread)
            return Call("POST", f"/api/agents/{TARGET}/runs/{run_id}/{row.split()[1]}", {}, run_id=run_id)
        case "POST resume":
            run_id = await ask_run(thread)
            body = {"resumeData": {"answer": "Paris"}}
            return Call("POST", f"/api/agents/{TARGET}/runs/{run_id}/resume", body, run_id=run_id)
        case "GET run":
            return Call("GET", f"/api/runs/{world.email_run}")
        case "GET run steps":
            return Call("GET", f"/api/runs/{world.email_run}/steps")
        case "GET run step":
            return Call("GET", f"/api/runs/{world.email_run}/steps/{world.step_id}")
        case "GET run stream":
            return Call("GET", f"/api/runs/{world.email_run}/stream")
        case "POST run cancel":
            run_id = await email_run(thread)
            return Call("POST", f"/api/runs/{run_id}/cancel", {}, run_id=run_id)
        case "GET thread messages":
            return Call("GET", f"/api/threads/{thread}/messages")
        case "GET decisions":
            return Call("GET", "/api/decisions")
        case "GET background-tasks":
            return Call("GET", "/api/background-tasks")
        case "POST background-task cancel":
            task_id = await pending_task(world.done_run)
            return Call("POST", f"/api/background-tasks/{task_id}/cancel", {}, task_id=task_id)
        case "GET schema":
            return Call("GET", "/api/schema/")
        case "GET docs":
            return Call("GET", "/api/docs/")
    raise AssertionError(row)


def shows_target(row: str, body: dict, world: World) -> bool:
    """Whether a 200 list answer contains the target (support-agent's agent, runs, messages, …)."""
    match row:
        case "GET agents":
            return TARGET in [a["id"] for a in body["data"]]
        case "GET suspended-runs" | "GET all suspended-runs" | "GET all suspended-runs of a":
            return world.email_run in [r["runId"] for r in body["runs"]]
        case "GET thread messages":
            return bool(body["data"])
        case "GET decisions":
            return world.done_run in [d["runId"] for d in body["data"]]
        case "GET background-tasks":
            return world.task_id in [t["id"] for t in body["data"]]
    raise AssertionError(row)


async def rest_cell(row: str, expected: str, not_found_code: str, user: User | None, world: World) -> str | None:
    """Play one cell; return what went wrong, or None."""
    token = await token_of(user)
    client = AsgiClient({"authorization": f"Token {token}"} if token else {})
    call = await rest_call(row, world)
    runs_before = await target_run_count()
    state_before = await run_state(call.run_id) if call.run_id else None
    task_before = await task_state(call.task_id) if call.task_id else None
    response = await client.request(call.method, call.url, json_body=call.body)
    raw = await response.read()
    status, want_status = response.status_code, int(expected[:3])
    if status != want_status:
        return f"status {status}, wanted {expected}: {raw[:200]!r}"
    is_json = response.headers.get("content-type", "").startswith("application/json")
    body = json.loads(raw) if is_json else None
    if status >= 400:
        want_code = {401: "NOT_AUTHENTICATED", 403: "PERMISSION_DENIED", 404: not_found_code}[status]
        if body["error"]["code"] != want_code:
            return f"error {body['error']['code']}, wanted {want_code}"
    if expected.endswith(("+", "-")) and shows_target(row, body, world) != expected.endswith("+"):
        return f"target {'missing from' if expected.endswith('+') else 'leaked into'} the answer"
    allowed = status < 400
    starts = row in ("POST agent stream", "POST agent generate")
    if starts and (await target_run_count() > runs_before) != allowed:
        return "a run was started" if not allowed else "no run was started"
    if call.run_id:
        if allowed:
            await rested(call.run_id)
            after = await run_state(call.run_id)
            if row == "POST run cancel" and after[0] != "cancelled":
                return f"run is {after[0]} after cancel"
            if row != "POST run cancel" and after[1] != 1:
                return f"{after[1]} decisions after an allowed decision"
        elif (after := await run_state(call.run_id)) != state_before or after[0] != "suspended":
            return f"a refused write changed the run: {state_before} -> {after}"
    if call.task_id:
        after_task = await task_state(call.task_id)
        if allowed and not after_task[1]:
            return "the task was not asked to stop"
        if not allowed and after_task != task_before:
            return f"a refused cancel changed the task: {task_before} -> {after_task}"
    return None


@pytest.mark.parametrize(("row", "cells", "not_found_code"), REST, ids=[r[0] for r in REST])
async def test_rest(row, cells, not_found_code, scoped):
    users = await make_principals()
    world = await build_world()
    failures = {}
    for principal in PRINCIPALS:
        if problem := await rest_cell(row, cells[principal], not_found_code, users[principal], world):
            failures[principal] = problem
    assert not failures, f"{row}: {failures}"


# --- websockets ----------------------------------------------------------------------------------
async def ws_connect(path: str, user: User | None) -> tuple[WebsocketCommunicator, bool]:
    token = await token_of(user)
    headers = [ORIGIN] + ([(b"authorization", f"Token {token}".encode())] if token else [])
    comm = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await comm.connect(timeout=5)
    return comm, connected


async def expect_error(comm: WebsocketCommunicator, expected: str) -> str | None:
    """``CODE`` (an error frame) or ``CODE/close`` (an error frame, then that close code)."""
    code, _, close = expected.partition("/")
    frame = await comm.receive_json_from(timeout=5)
    if frame.get("type") != "error" or frame["error"]["code"] != code:
        return f"got {frame}, wanted error {code}"
    if close:
        message = await comm.receive_output(timeout=5)
        if message != {"type": "websocket.close", "code": int(close)} and message.get("code") != int(close):
            return f"got {message}, wanted close {close}"
    return None


async def read_until_finish(comm: WebsocketCommunicator) -> list[dict]:
    chunks = []
    while True:
        chunk = await comm.receive_json_from(timeout=10)
        chunks.append(chunk)
        if chunk.get("type") in ("finish", "error"):
            return chunks


async def ws_cell(row: str, expected: str, user: User | None, world: World) -> str | None:
    if row == "ws/approvals/":
        return await feed_cell(expected, user, world)
    action = row.split()[-1] if row.startswith("ws/agents/") else None
    run_id = None
    if action in ("approve", "decline"):
        run_id = await email_run(world.thread)
    elif action == "resume":
        run_id = await ask_run(world.thread)
    before = await run_state(run_id) if run_id else None
    runs_before = await target_run_count()
    path = f"/ws/runs/{world.email_run}/" if action is None else f"/ws/agents/{TARGET}/"
    comm, connected = await ws_connect(path, user)
    try:
        if not connected:
            return "handshake refused"
        if "/" in expected:  # refused at connect
            return await expect_error(comm, expected)
        if action is None:
            first = await comm.receive_json_from(timeout=5)
            return None if first.get("seq") == 1 else f"got {first}, wanted the replay"
        frame: dict[str, Any] = {"action": action}
        if action == "stream":
            frame |= {"messages": "hello", "memory": {"thread": world.thread, "resource": "sec-user"}}
        else:
            frame["runId"] = run_id
        if action == "resume":
            frame["resumeData"] = {"answer": "Paris"}
        await comm.send_json_to(frame)
        if expected != "chunks" and (problem := await expect_error(comm, expected)):
            return problem
        if expected == "chunks":
            chunks = await read_until_finish(comm)
            if chunks[-1]["type"] != "finish":
                return f"the stream ended with {chunks[-1]}"
    finally:
        await comm.disconnect()
    allowed = expected == "chunks"
    if action == "stream" and (await target_run_count() > runs_before) != allowed:
        return "a run was started" if not allowed else "no run was started"
    if run_id:
        if allowed:
            await rested(run_id)
            if (await run_state(run_id))[1] != 1:
                return "no decision was recorded"
        elif (after := await run_state(run_id)) != before or after[0] != "suspended":
            return f"a refused decision changed the run: {before} -> {after}"
    return None


async def feed_cell(expected: str, user: User | None, world: World) -> str | None:
    """A new support-agent call, then a marker everyone may see (a support-supervisor call, an agent
    outside the mapping): the feed must tell of the first before the marker, or not at all."""
    comm, connected = await ws_connect("/ws/approvals/", user)
    if expected == "refused":
        return None if not connected else "the feed accepted the socket"
    if not connected:
        return "handshake refused"
    try:
        run_id = await email_run(world.thread)
        marker, _ = await start(
            "support-supervisor",
            tool_line("agent-billing-agent", {"message": tool_line("refund", {"orderId": "o-1", "amount": 5})}),
            thread=new_thread(),
        )
        seen = False
        while True:
            frame = await comm.receive_from(timeout=5)
            seen = seen or f'data-run-id="{run_id}"' in frame
            if f'data-run-id="{marker.run_id}"' in frame:
                break
    finally:
        await comm.disconnect()
    if seen != (expected == "event"):
        return "the feed leaked the call" if seen else "the feed missed the call"
    return None


@pytest.mark.parametrize(("row", "cells", "_"), WEBSOCKETS, ids=[r[0] for r in WEBSOCKETS])
async def test_websocket(row, cells, _, scoped):
    users = await make_principals()
    world = await build_world()
    failures = {}
    for principal in PRINCIPALS:
        if problem := await ws_cell(row, cells[principal], users[principal], world):
            failures[principal] = problem
    assert not failures, f"{row}: {failures}"


# --- dashboard -----------------------------------------------------------------------------------
def dashboard_cell(row: str, expected: str, user: User | None, world: World) -> str | None:
    client = Client()
    if user is not None:
        client.force_login(user)
    run_id = tool_call_id = None
    if row.startswith("decide"):
        kind = row.split()[1]
        run_id = async_to_sync(ask_run if kind == "resume" else email_run)(world.thread)
        tool_call_id = SuspendedToolCall.objects.get(run_id=run_id).tool_call_id
        before = async_to_sync(run_state)(run_id)
        data = {"action": kind} | ({"resume__answer": "Paris"} if kind == "resume" else {})
        response = client.post(f"/approvals/runs/{run_id}/calls/{tool_call_id}/decide", data)
    else:
        url = {
            "inbox": "/approvals/",
            "thread": f"/approvals/threads/{world.thread}/",
            "run": f"/approvals/runs/{world.email_run}/",
            "history": "/approvals/history/",
        }[row]
        response = client.get(url)
    status = response.status_code
    if status != int(expected[:3]):
        return f"status {status}, wanted {expected}"
    if expected == "302 login" and not response["Location"].startswith("/accounts/login/"):
        return f"redirected to {response['Location']}"
    if expected == "302 run" and response["Location"] != f"/approvals/runs/{run_id}/":
        return f"redirected to {response['Location']}"
    if expected.endswith(("+", "-")):
        page = response.content.decode()
        marker = {
            "inbox": f'data-thread-id="{world.thread}"',
            "thread": f'data-tool-call-id="{SuspendedToolCall.objects.get(run_id=world.email_run).tool_call_id}"',
            "history": world.done_run,
        }[row]
        if (marker in page) != expected.endswith("+"):
            return f"target {'missing from' if expected.endswith('+') else 'leaked into'} the page"
    if run_id:
        if status == 302 and expected == "302 run":
            wait_rested(run_id)
            if async_to_sync(run_state)(run_id)[1] != 1:
                return "no decision was recorded"
        elif (after := async_to_sync(run_state)(run_id)) != before or after[0] != "suspended":
            return f"a refused decision changed the run: {before} -> {after}"
    return None


@pytest.mark.parametrize(("row", "cells", "method"), DASHBOARD, ids=[r[0] for r in DASHBOARD])
def test_dashboard(row, cells, method, scoped):
    users = async_to_sync(make_principals)()
    world = async_to_sync(build_world)()
    failures = {}
    for principal in PRINCIPALS:
        if problem := dashboard_cell(row, cells[principal], users[principal], world):
            failures[principal] = problem
    assert not failures, f"{row}: {failures}"


# --- Python API (docs/runs.md#the-python-api): decided_by -------------------------------------------
PYTHON = table("""
| approve_tool_call(decided_by) | anonymous         | viewer            | other             | reviewer | superuser |
|-------------------------------|-------------------|-------------------|-------------------|----------|-----------|
| a support-agent call          | PERMISSION_DENIED | PERMISSION_DENIED | PERMISSION_DENIED | decided  | decided   |
""")


@pytest.mark.parametrize(("row", "cells", "note"), PYTHON, ids=[r[0] for r in PYTHON])
async def test_python_api_decided_by(row, cells, note, scoped):
    from django.contrib.auth.models import AnonymousUser

    users = await make_principals()
    thread = new_thread()
    failures = {}
    for principal in PRINCIPALS:
        run_id = await email_run(thread)
        before = await run_state(run_id)
        person = users[principal] or AnonymousUser()
        try:
            await collect(
                get_agent(TARGET).approve_tool_call(run_id=run_id, decided_by=Decider.person(person, via="python"))
            )
            got = "decided"
        except AgentRunError as exc:
            got = exc.code
        if got != cells[principal]:
            failures[principal] = f"got {got}, wanted {cells[principal]}"
        elif got != "decided" and await run_state(run_id) != before:
            failures[principal] = "a refused decision changed the run"
    assert not failures, failures

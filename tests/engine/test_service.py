"""One decision service behind every door (issue 9): the Python API, REST, the ``ws/agents`` socket, the
dashboard and the admin decide the same call the same way — identical decision records (but ``via``),
identical continuations, one side effect each — and none of them drives the run itself."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client
from rest_framework.authtoken.models import Token

from agentrun import AgentRunError, get_agent
from agentrun.asgi import application
from agentrun.core.access import REVIEWERS, ensure_groups
from agentrun.core.models import Decision, RunChunk, Snapshot, SuspendedToolCall, ToolEffect
from agentrun.engine import dispatch
from agentrun.engine.service import Decider, DecisionCommand, DecisionRequest, decide
from tests.helpers.asgi import AsgiClient
from tests.helpers.decisions import decide_call
from tests.helpers.runs import EMAIL, rested, start, tool_line
from tests.helpers.users import make_user

pytestmark = pytest.mark.django_db(transaction=True)

CSRF = "c" * 32  # an unmasked CSRF secret: the cookie and the header agree


@pytest.fixture
async def rita() -> User:
    @sync_to_async
    def make() -> User:
        ensure_groups()
        user = make_user("rita", password="pw-rita-12345", is_staff=True, is_superuser=True, group=None)
        user.groups.add(Group.objects.get(name=REVIEWERS))
        Token.objects.create(user=user)
        return user

    return await make()


async def suspended(thread: str) -> tuple[str, str]:
    stream, chunks = await start("support-agent", tool_line("send-email", EMAIL), thread=thread, resource="cust-9")
    [approval] = [c for c in chunks if c["type"] == "tool-call-approval"]
    return stream.run_id, approval["payload"]["toolCallId"]


def _batch(run_id: str, requests: list[DecisionRequest]) -> DecisionCommand:
    return DecisionCommand(
        agent_id="support-agent", run_id=run_id, requests=tuple(requests), decider=Decider.system(), batch=True
    )


# --- the doors -----------------------------------------------------------------------------------
async def by_python(user: User, run_id: str, call_id: str) -> None:
    stream = await get_agent("support-agent").approve_tool_call(
        run_id=run_id, tool_call_id=call_id, reason="checked", decided_by=Decider.person(user, via="python")
    )
    await stream.collect()


async def by_rest(user: User, run_id: str, call_id: str) -> None:
    token = await Token.objects.aget(user=user)
    client = AsgiClient({"authorization": f"Token {token.key}"})
    response = await client.post(
        f"/api/agents/support-agent/runs/{run_id}/approve", {"toolCallId": call_id, "reason": "checked"}
    )
    assert response.status_code == 202, await response.read()


async def by_websocket(user: User, run_id: str, call_id: str) -> None:
    token = await Token.objects.aget(user=user)
    comm = WebsocketCommunicator(
        application, f"/ws/agents/support-agent/?token={token.key}", headers=[(b"origin", b"http://localhost")]
    )
    assert (await comm.connect())[0]
    await comm.send_json_to({"action": "approve", "runId": run_id, "toolCallId": call_id, "reason": "checked"})
    while (frame := await comm.receive_json_from(timeout=10))["type"] != "finish":
        assert frame["type"] != "error", frame
    await comm.disconnect()


async def _session_client(user: User) -> AsgiClient:
    client = Client()
    await sync_to_async(client.force_login)(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}; csrftoken={CSRF}"
    return AsgiClient({"cookie": cookie, "x-csrftoken": CSRF})


async def _form_post(client: AsgiClient, url: str, form: dict[str, Any]) -> Any:
    body = "&".join(f"{quote(k)}={quote(str(v))}" for k, v in form.items()).encode()
    return await client.request(
        "POST",
        url,
        headers={"content-type": "application/x-www-form-urlencoded", "content-length": str(len(body))},
        raw_body=body,
    )


async def by_dashboard(user: User, run_id: str, call_id: str) -> None:
    client = await _session_client(user)
    url = f"/approvals/runs/{quote(run_id)}/calls/{quote(call_id)}/decide"
    response = await _form_post(client, url, {"action": "approve", "reason": "checked"})
    assert response.status_code in (200, 302), await response.read()


async def by_admin(user: User, run_id: str, call_id: str) -> None:
    client = await _session_client(user)
    pk = await SuspendedToolCall.objects.filter(run_id=run_id, tool_call_id=call_id).values_list("pk", flat=True).aget()
    form = {"action": "approve_selected_calls", "_selected_action": pk, "reason": "checked"}
    confirmation = await _form_post(client, "/admin/agentrun/suspendedtoolcall/", form)
    page = (await confirmation.read()).decode()
    assert confirmation.status_code == 200 and "Nothing is decided until you confirm" in page, page
    [fingerprint] = re.findall(rf'name="fingerprint-{pk}" value="([0-9a-f]+)"', page)
    form |= {"post": "yes", f"fingerprint-{pk}": fingerprint}
    response = await _form_post(client, "/admin/agentrun/suspendedtoolcall/", form)
    assert response.status_code == 302, await response.read()


DOORS: dict[str, tuple[Callable[[User, str, str], Awaitable[None]], str]] = {
    "python": (by_python, "python"),
    "rest": (by_rest, "api"),
    "websocket": (by_websocket, "websocket"),
    "dashboard": (by_dashboard, "dashboard"),
    "admin": (by_admin, "dashboard"),
}

RECORD_FIELDS = ["agent_id", "tool_name", "kind", "args", "edited_args", "resume_data", "reason", "decided_by_username"]
ID = re.compile(r"\b(run|call|msg|step|dec|thread)_[0-9a-z]+\b|\bdoors-[a-z-]+")


def normalized(chunks: list[dict]) -> list[tuple[str, str]]:
    """Chunks with their ids blanked: what two continuations of equal calls must share."""
    return [(c["type"], ID.sub("<id>", str(c["payload"]))) for c in chunks]


@pytest.mark.parametrize("door", list(DOORS))
async def test_every_door_records_the_same_decision_and_runs_the_same_continuation(rita, door):
    reference_run, reference_call = await suspended(f"doors-ref-{door}")
    await by_python(rita, reference_run, reference_call)
    run_id, call_id = await suspended(f"doors-{door}")
    after = (await RunChunk.objects.filter(run_id=run_id).order_by("-seq").afirst()).seq

    decide, via = DOORS[door]
    await decide(rita, run_id, call_id)
    run = await rested(run_id)

    assert run.status == "completed"

    @sync_to_async
    def record(run_id: str) -> tuple[list[dict], list[dict]]:
        decisions = list(Decision.objects.filter(run_id=run_id).values(*RECORD_FIELDS, "via", "decided_by_id"))
        chunks = [c.to_chunk() for c in RunChunk.objects.filter(run_id=run_id).order_by("seq")]
        return decisions, chunks

    [ours], chunks = await record(run_id)
    [theirs], reference_chunks = await record(reference_run)
    assert ours["via"] == via and ours["decided_by_id"] == rita.pk
    assert {k: ours[k] for k in RECORD_FIELDS} == {k: theirs[k] for k in RECORD_FIELDS}
    assert ours["reason"] == "checked" and ours["decided_by_username"] == "rita"
    continuation = [c for c in chunks if c["seq"] > after]
    reference_after = len(chunks) - len(continuation)
    assert normalized(continuation) == normalized(reference_chunks[reference_after:])
    assert [c["type"] for c in continuation][:2] == ["start", "tool-result"]
    assert await ToolEffect.objects.filter(run_id=run_id).acount() == 1


async def test_the_decision_and_its_continuation_commit_together(monkeypatch):
    """The continuation is queued inside the decision's transaction: a decision that fails queues nothing,
    and a queue that fails leaves no decision."""
    queued: list[tuple[str, str]] = []
    monkeypatch.setattr(dispatch, "enqueue_continuation", lambda agent_id, run_id: queued.append((agent_id, run_id)))
    run_id, call_id = await suspended("tx-1")
    with pytest.raises(AgentRunError):
        await sync_to_async(decide_call)(
            agent_id="support-agent", run_id=run_id, kind="approve", args={"to": 1}, tool_call_id=call_id
        )
    assert queued == []

    def broken_queue(agent_id: str, run_id: str) -> None:
        raise RuntimeError("the task queue is down")

    monkeypatch.setattr(dispatch, "enqueue_continuation", broken_queue)
    with pytest.raises(RuntimeError):
        await sync_to_async(decide_call)(agent_id="support-agent", run_id=run_id, kind="approve")
    assert await Decision.objects.filter(run_id=run_id).acount() == 0
    assert await Snapshot.objects.filter(run_id=run_id).aexists()
    assert await SuspendedToolCall.objects.filter(run_id=run_id, status="open").acount() == 1


async def test_a_batch_is_all_or_nothing_and_names_the_failing_item():
    message = "\n".join([tool_line("send-email", EMAIL), tool_line("delete-record", {"table": "t", "id": 7})])
    stream, chunks = await start("support-agent", message, thread="batch-1")
    email_id, delete_id = [c["payload"]["toolCallId"] for c in chunks if c["type"] == "tool-call-approval"]
    bad = [
        DecisionRequest(kind="approve", tool_call_id=email_id),
        DecisionRequest(kind="resume", tool_call_id=delete_id, resume_data={}),
    ]
    with pytest.raises(AgentRunError) as err:
        await sync_to_async(decide)(_batch(stream.run_id, bad))
    assert err.value.code == "WRONG_DECISION_KIND" and err.value.details["index"] == 1
    assert await Decision.objects.filter(run_id=stream.run_id).acount() == 0

    good = [
        DecisionRequest(kind="approve", tool_call_id=email_id),
        DecisionRequest(kind="decline", tool_call_id=delete_id, reason="keep it"),
    ]
    outcome = await sync_to_async(decide)(_batch(stream.run_id, good))
    assert outcome.batch_dict() == {
        "runId": stream.run_id,
        "decisions": [
            {"toolCallId": email_id, "decision": "approve"},
            {"toolCallId": delete_id, "decision": "decline"},
        ],
        "status": "in_progress",
    }
    run = await rested(stream.run_id)
    assert run.status == "completed"
    assert await ToolEffect.objects.filter(run_id=stream.run_id).acount() == 1


async def test_parallel_calls_racing_each_loser_is_told_its_own_calls_winner():
    """Two calls of one run, decided at once by different people, then each decided again: the loser of
    each call learns who decided that call (not whoever decided the run last)."""
    message = "\n".join([tool_line("send-email", EMAIL), tool_line("send-email", dict(EMAIL, to="bo@example.com"))])
    stream, chunks = await start("support-agent", message, thread="race-2")
    first, second = [c["payload"]["toolCallId"] for c in chunks if c["type"] == "tool-call-approval"]

    def decide(call_id: str, who: str) -> Any:
        try:
            return decide_call(
                agent_id="support-agent",
                run_id=stream.run_id,
                tool_call_id=call_id,
                kind="approve",
                decider=Decider.system(who),
            )
        except AgentRunError as exc:
            return exc
        finally:
            connection.close()  # each racer is a thread with a connection of its own

    results = await asyncio.gather(
        sync_to_async(decide, thread_sensitive=False)(first, "ann"),
        sync_to_async(decide, thread_sensitive=False)(second, "bob"),
    )
    assert not any(isinstance(r, AgentRunError) for r in results)
    losers = await asyncio.gather(
        sync_to_async(decide, thread_sensitive=False)(first, "cy"),
        sync_to_async(decide, thread_sensitive=False)(second, "di"),
    )
    assert [(e.code, e.details["toolCallId"], e.details["decidedBy"]) for e in losers] == [
        ("TOOL_CALL_ALREADY_DECIDED", first, "ann"),
        ("TOOL_CALL_ALREADY_DECIDED", second, "bob"),
    ]
    await rested(stream.run_id)


async def test_when_the_database_refuses_a_second_decision_the_loser_is_told_that_calls_winner():
    """The unique constraint is the last line where row locks are not enforced: its fallback must name the
    decision of the call that was raced for, not the run's latest decision (another call's)."""
    message = "\n".join([tool_line("send-email", EMAIL), tool_line("send-email", dict(EMAIL, to="bo@example.com"))])
    stream, chunks = await start("support-agent", message, thread="race-3")
    first, second = [c["payload"]["toolCallId"] for c in chunks if c["type"] == "tool-call-approval"]

    @sync_to_async
    def racer_committed_without_the_lock() -> None:
        # Ann's decision on the first call exists, yet the call still reads as open (she raced past the lock);
        # then Bob decides the second call: the run's latest decision is Bob's.
        call = SuspendedToolCall.objects.get(run_id=stream.run_id, tool_call_id=first)
        Decision.objects.create(
            run_id=stream.run_id,
            agent_id="support-agent",
            thread_id="race-3",
            tool_call_id=first,
            tool_name="send-email",
            suspension=call.suspension,
            kind="decline",
            decided_by_username="ann",
            via="api",
        )
        decide_call(
            agent_id="support-agent",
            run_id=stream.run_id,
            tool_call_id=second,
            kind="approve",
            decider=Decider.system("bob"),
        )

    await racer_committed_without_the_lock()
    with pytest.raises(AgentRunError) as err:
        await sync_to_async(decide_call)(
            agent_id="support-agent",
            run_id=stream.run_id,
            tool_call_id=first,
            kind="approve",
            decider=Decider.system("cy"),
        )
    assert err.value.code == "TOOL_CALL_ALREADY_DECIDED"
    assert (err.value.details["toolCallId"], err.value.details["decidedBy"]) == (first, "ann")

"""Websockets: replay after a seq then live chunks, across suspensions, and decisions over a socket."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels.testing import WebsocketCommunicator

from agentrun.asgi import application
from agentrun.core import fanout
from agentrun.core.fanout import RunPublisher, run_group, ws_text
from agentrun.core.models import RunChunk, ToolEffect
from agentrun.engine.agents import get_agent
from agentrun.engine.chunklog import ChunkLog
from tests.helpers.asgi import ORIGIN, communicator, receive_until
from tests.helpers.runs import EMAIL_LINE as EMAIL
from tests.helpers.users import reviewer_token

pytestmark = pytest.mark.django_db(transaction=True)


async def test_subscriber_mid_run_gets_replay_then_live_then_close_when_final():
    token = await reviewer_token()
    agent = get_agent("support-agent")
    stream = await agent.stream(EMAIL, memory={"thread": "ws-1", "resource": "u1"})
    first = await stream.collect()
    assert first[-1]["type"] == "finish" and first[-1]["payload"]["finishReason"] == "suspended"

    after = 3
    comm = communicator(f"/ws/runs/{stream.run_id}/?after={after}", token)
    connected, _ = await comm.connect()
    assert connected
    replay = await receive_until(comm, lambda f: f["type"] == "finish")
    assert [c["seq"] for c in replay] == [c["seq"] for c in first if c["seq"] > after]
    assert replay == [c for c in first if c["seq"] > after]

    # The run rests suspended: the socket stays open. A decision elsewhere continues it.
    assert await comm.receive_nothing(timeout=0.3)
    cont = await agent.approve_tool_call(run_id=stream.run_id)
    await cont.collect()
    live = await receive_until(comm, lambda f: f["type"] == "finish")
    seqs = [c["seq"] for c in replay + live]
    assert seqs == list(range(after + 1, seqs[-1] + 1)), "contiguous, no gap, no duplicate"
    assert any(c["type"] == "tool-result" and c["payload"]["toolName"] == "send-email" for c in live)
    assert "".join(c["payload"]["text"] for c in live if c["type"] == "text-delta").startswith("send-email:")
    out = await comm.receive_output(timeout=5)
    assert out == {"type": "websocket.close", "code": 1000}


async def test_approval_over_agent_socket_reaches_the_run_subscriber():
    token = await reviewer_token()
    agent = get_agent("support-agent")
    stream = await agent.stream(EMAIL, memory={"thread": "ws-2", "resource": "u1"})
    await stream.collect()

    watcher = communicator(f"/ws/runs/{stream.run_id}/?after=0", token)
    assert (await watcher.connect())[0]
    await receive_until(watcher, lambda f: f["type"] == "finish")

    decider = communicator("/ws/agents/support-agent/", token)
    assert (await decider.connect())[0]
    await decider.send_json_to({"action": "approve", "runId": stream.run_id})
    decided = await receive_until(decider, lambda f: f["type"] == "finish")
    assert decided[-1]["payload"]["finishReason"] == "stop"

    seen = await receive_until(watcher, lambda f: f["type"] == "finish")
    assert [c["seq"] for c in seen] == [c["seq"] for c in decided]
    assert (await watcher.receive_output(timeout=5))["code"] == 1000
    assert await ToolEffect.objects.filter(run_id=stream.run_id, tool_name="send-email").acount() == 1

    # The same call again: an error frame, and the socket stays usable.
    await decider.send_json_to({"action": "approve", "runId": stream.run_id})
    error = await decider.receive_json_from(timeout=5)
    assert error["type"] == "error" and error["error"]["code"] == "TOOL_CALL_ALREADY_DECIDED"
    await decider.send_to(text_data="{not json")
    assert (await decider.receive_json_from(timeout=5))["error"]["code"] == "INVALID_REQUEST"
    await decider.send_json_to({"action": "stream", "messages": "hello again"})
    frames = await receive_until(decider, lambda f: f["type"] == "finish")
    assert "".join(f["payload"]["text"] for f in frames if f["type"] == "text-delta") == "Echo: hello again"
    await decider.disconnect()
    await watcher.disconnect()


async def test_subscriber_joining_while_run_produces_misses_nothing():
    token = await reviewer_token()
    agent = get_agent("support-agent")
    words = " ".join(f"w{i}" for i in range(400))
    stream = await agent.stream(f"/sleep 50\n{words}", memory={"thread": "ws-3"})
    comm = communicator(f"/ws/runs/{stream.run_id}/?after=0", token)
    assert (await comm.connect())[0]
    produced = await stream.collect()
    got = await receive_until(comm, lambda f: f["type"] == "finish")
    assert got == produced
    assert (await comm.receive_output(timeout=5))["code"] == 1000
    assert await RunChunk.objects.filter(run_id=stream.run_id).acount() == len(produced)


async def test_socket_without_credentials_is_refused():
    agent = get_agent("support-agent")
    stream = await agent.stream("hi", memory={"thread": "ws-4"})
    await stream.collect()
    anonymous = WebsocketCommunicator(application, f"/ws/runs/{stream.run_id}/", headers=ORIGIN)
    assert (await anonymous.connect())[0]
    frame = await anonymous.receive_json_from(timeout=5)
    assert frame["error"]["code"] == "NOT_AUTHENTICATED"


@sync_to_async
def session_cookie(username: str) -> bytes:
    """A signed-in browser's session cookie (a reviewer's)."""
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.get(username=username))
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def test_a_token_client_without_origin_is_accepted_a_foreign_origin_and_a_bare_cookie_are_not():
    """docs/api.md#websockets: programs send no Origin and authenticate with a token; browsers keep the check."""
    agent = get_agent("support-agent")
    stream = await agent.stream("hi there", memory={"thread": "ws-origin"})
    produced = await stream.collect()
    token = await reviewer_token("otto")
    path = f"/ws/runs/{stream.run_id}/"
    for offered in (
        {"path": f"{path}?token={token}", "headers": []},
        {"path": path, "headers": [(b"authorization", f"Token {token}".encode())]},
        {"path": path, "headers": [(b"authorization", f"Bearer {token}".encode())]},
    ):
        program = WebsocketCommunicator(application, offered["path"], headers=offered["headers"])
        assert (await program.connect())[0], offered
        assert await receive_until(program, lambda f: f["type"] == "finish") == produced
        assert (await program.receive_output(timeout=5))["code"] == 1000
    # A foreign Origin is refused even with a good token; so is an Origin of "null".
    for origin in (b"http://evil.example", b"null", b""):
        foreign = WebsocketCommunicator(application, f"{path}?token={token}", headers=[(b"origin", origin)])
        assert not (await foreign.connect())[0], origin
    # A session cookie is a browser's credential: without Origin it is refused at the handshake...
    cookie = await session_cookie("otto")
    browser = WebsocketCommunicator(application, path, headers=[(b"cookie", cookie), *ORIGIN])
    assert (await browser.connect())[0]  # (the same cookie with an allowed Origin is fine)
    assert await receive_until(browser, lambda f: f["type"] == "finish") == produced
    bare = WebsocketCommunicator(application, path, headers=[(b"cookie", cookie)])
    assert not (await bare.connect())[0]
    # ...and a token that is no token does not let it ride along: only the token authenticates.
    riding = WebsocketCommunicator(application, f"{path}?token=not-a-token", headers=[(b"cookie", cookie)])
    assert (await riding.connect())[0]
    assert (await riding.receive_json_from(timeout=5))["error"]["code"] == "NOT_AUTHENTICATED"
    await asyncio.sleep(0)


async def test_the_approvals_feed_takes_a_token_client_without_origin():
    token = await reviewer_token("feeder")
    program = WebsocketCommunicator(application, f"/ws/approvals/?token={token}")
    assert (await program.connect())[0]
    await program.disconnect()
    anonymous = WebsocketCommunicator(application, "/ws/approvals/?token=nope")
    assert not (await anonymous.connect())[0]


async def test_a_client_that_disconnects_does_not_stop_the_run():
    token = await reviewer_token()
    comm = communicator("/ws/agents/support-agent/", token)
    assert (await comm.connect())[0]
    await comm.send_json_to({"action": "stream", "messages": "/sleep 300\nstill here", "memory": {"thread": "ws-5"}})
    start = await comm.receive_json_from(timeout=5)
    await comm.disconnect()
    from agentrun.core.models import Run

    for _ in range(100):
        run = await Run.objects.aget(pk=start["runId"])
        if run.status == Run.Status.COMPLETED:
            break
        await asyncio.sleep(0.05)
    assert run.status == Run.Status.COMPLETED
    texts = [c.payload["text"] async for c in RunChunk.objects.filter(run_id=run.id, type="text-delta").order_by("seq")]
    assert "".join(texts) == "Echo: /sleep 300\nstill here"


async def _three_subscribers_after_a_run(thread: str) -> tuple[Any, int, list[WebsocketCommunicator]]:
    """A support-agent run read to its suspension, and three ``ws/runs`` subscribers after its last seq."""
    token = await reviewer_token()
    stream = await get_agent("support-agent").stream(EMAIL, memory={"thread": thread})
    last = (await stream.collect())[-1]["seq"]
    comms = [communicator(f"/ws/runs/{stream.run_id}/?after={last}", token) for _ in range(3)]
    for comm in comms:
        assert (await comm.connect())[0]
    return stream, last, comms


async def _all_got_the_log_and_stay_open(
    run_id: str, last: int, texts: list[str], comms: list[WebsocketCommunicator]
) -> None:
    """What the subscribers got after the first chunk is the log after it; none is closed as behind."""
    logged = RunChunk.objects.filter(run_id=run_id, seq__gt=last + 1).order_by("seq")
    assert [json.loads(t) for t in texts] == [c.to_chunk() async for c in logged]
    for comm in comms:
        assert await comm.receive_nothing(timeout=0.3), "kept open: none of them is behind"
        await comm.disconnect()


async def _deliver_while_busy(group: str, messages: list[dict]) -> None:
    """The messages reach this process while its event loop is blocked (a busy process): none of its
    tasks runs between them, so its subscribers find them all waiting at once."""
    layer = get_channel_layer()
    if isinstance(layer, InMemoryChannelLayer):
        # Sent together: every message is queued before the process runs any other task.
        await asyncio.gather(*(layer.group_send(group, message) for message in messages))
        return

    def publish() -> None:
        async def send_all() -> None:
            for message in messages:
                await layer.group_send(group, message)

        asyncio.run(send_all())  # a loop of its own: the layer keeps a connection per loop

    publisher = threading.Thread(target=publish)
    publisher.start()
    publisher.join()  # the loop does nothing meanwhile ...
    time.sleep(0.3)  # ... nor while the messages reach this process's socket


async def test_a_busy_process_closes_no_subscriber_that_keeps_up(settings):
    """The web process is too busy to run its subscribers while a run publishes three bursts, each far
    more than AGENTRUN_WS_MAX_LAG: they are behind only because the process was, their clients read
    everything they are sent, and none is closed 4008 (the old rule closed every one). Each gets every
    chunk, in order, the same frames."""
    settings.AGENTRUN_WS_MAX_LAG = 5
    stream, last, comms = await _three_subscribers_after_a_run("ws-busy")
    publisher = RunPublisher(stream.run_id)
    log = ChunkLog(stream.run_id, last + 1, [publisher])
    log.emit("text-delta", {"id": "msg_busy", "text": "first"})
    await sync_to_async(log.flush_sync)()
    await publisher.aclose()
    for comm in comms:
        assert (await comm.receive_json_from(timeout=10))["seq"] == last + 1

    quiet = ChunkLog(stream.run_id, last + 2, [])  # logged here, published below
    bursts = [[quiet.emit("text-delta", {"id": "msg_busy", "text": f"b{b}w{i}"}) for i in range(40)] for b in range(3)]
    await sync_to_async(quiet.flush_sync)()
    await _deliver_while_busy(
        run_group(stream.run_id), [{"type": "run.frames", "frames": [ws_text(c) for c in burst]} for burst in bursts]
    )

    texts: list[list[str]] = [[] for _ in comms]
    for comm, got in zip(comms, texts, strict=True):
        while len(got) < 120:
            frame = await comm.receive_output(timeout=10)
            assert frame["type"] == "websocket.send", f"closed after {len(got)} of 120 chunks: {frame}"
            got.append(frame["text"])
    assert texts[0] == texts[1] == texts[2]
    await _all_got_the_log_and_stay_open(stream.run_id, last, texts[0], comms)


async def test_a_subscriber_whose_client_stopped_reading_is_told_while_its_send_waits(monkeypatch):
    """``ws/runs`` sends what it was given and waits while the client's connection is full: a client that
    stopped reading would hold that send, and the socket, for as long as it stalls. The subscription
    says so meanwhile (``on_stall``, with the seq to resume after) once more than ``max_lag`` chunks wait
    and the connection stayed full, so the consumer stops waiting and closes 4008."""
    monkeypatch.setattr(fanout, "CLIENT_STALL_SECONDS", 0.2)
    stream = await get_agent("support-agent").stream(EMAIL, memory={"thread": "ws-stalled"})
    last = (await stream.collect())[-1]["seq"]
    publisher = RunPublisher(stream.run_id)
    log = ChunkLog(stream.run_id, last + 1, [publisher])
    stalled: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    batches = fanout.subscribe_batches(
        stream.run_id, last, max_lag=5, client_full=lambda: True, on_stall=stalled.set_result
    )
    first = asyncio.ensure_future(anext(batches))
    await asyncio.sleep(0.2)  # joined
    log.emit("text-delta", {"id": "msg_stall", "text": "first"})
    await publisher.aclose()
    assert [c["seq"] for c in await first] == [last + 1]
    # Its consumer is sending that batch to a client that reads nothing, and never comes back for more.
    for burst in range(4):
        for i in range(10):
            log.emit("text-delta", {"id": "msg_stall", "text": f"b{burst}w{i}"})
        await publisher.aclose()
        await asyncio.sleep(0.1)
    assert await asyncio.wait_for(stalled, 5) == last + 1, "resume after the last seq it was given"
    await batches.aclose()


async def test_subscribers_that_keep_up_get_the_same_frames_of_a_burst_and_are_not_closed_as_behind(settings):
    """A run publishes far more chunks at once than AGENTRUN_WS_MAX_LAG (a driver sends what it made
    while it did not yield): every subscriber that keeps up gets them all, the same frames in the same
    order, and none is closed 4008 — only a reader slower than the run is too far behind."""
    settings.AGENTRUN_WS_MAX_LAG = 5
    stream, last, comms = await _three_subscribers_after_a_run("ws-burst")
    publisher = RunPublisher(stream.run_id)
    log = ChunkLog(stream.run_id, last + 1, [publisher])

    async def publish(words: list[str]) -> None:
        for word in words:
            log.emit("text-delta", {"id": "msg_burst", "text": word})
        await sync_to_async(log.flush_sync)()
        await publisher.aclose()  # one message for all of them

    await publish(["first"])
    for comm in comms:
        assert (await comm.receive_json_from(timeout=10))["seq"] == last + 1
    await publish([f"w{i}" for i in range(40)])
    frames = [[await comm.receive_output(timeout=10) for _ in range(40)] for comm in comms]
    assert all(f["type"] == "websocket.send" for each in frames for f in each), "none closed"
    texts = [[f["text"] for f in each] for each in frames]
    assert texts[0] == texts[1] == texts[2], "the same frames, byte for byte, to every subscriber"
    await _all_got_the_log_and_stay_open(stream.run_id, last, texts[0], comms)


async def test_an_agent_id_holding_a_slash_works_on_its_socket():
    """An agent id may hold "/" (and spaces, "%", unicode): a client sends it as %2F, the server decodes
    the path before routing, and the agent's socket still finds the agent."""
    from agentrun import Agent

    odd = "team/a b%ü"
    Agent(id=odd, model="directive")
    token = await reviewer_token()
    comm = communicator(f"/ws/agents/{odd}/", token)
    assert (await comm.connect())[0]
    await comm.send_json_to({"action": "stream", "messages": "hello", "memory": {"thread": "ws-odd-agent"}})
    frames = await receive_until(comm, lambda f: f.get("type") == "finish")
    assert frames[0]["type"] == "start" and frames[0]["payload"]["agentId"] == odd
    assert "".join(f["payload"]["text"] for f in frames if f["type"] == "text-delta") == "Echo: hello"
    await comm.disconnect()

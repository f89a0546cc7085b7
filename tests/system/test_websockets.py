"""Websockets through the real server (agentrun.server.web): frame limits and slow subscribers."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
import requests
import websockets

from tests.helpers.system import create_reviewer, figures

pytestmark = [pytest.mark.system, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ORIGIN = {"origin": "http://localhost"}
MIB = 1024 * 1024


def agent_socket(port: int, token: str):
    url = f"ws://127.0.0.1:{port}/ws/agents/support-agent/?token={token}"
    return websockets.connect(url, additional_headers=ORIGIN, open_timeout=5, max_size=None)


async def _frame_over_a_mib(port: int, token: str, size: int) -> tuple[dict, int | None, str]:
    async with agent_socket(port, token) as ws:
        # Just under the limit: an ordinary error frame, the socket stays usable.
        near = json.dumps({"action": "nope", "pad": ""})
        await ws.send(json.dumps({"action": "nope", "pad": "x" * (MIB - len(near))}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["error"]["code"] == "INVALID_REQUEST"
        await ws.send(json.dumps({"action": "stream", "messages": "x" * size}))
        answer = json.loads(await asyncio.wait_for(ws.recv(), 10))
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
        return answer, ws.close_code, ws.close_reason


@pytest.mark.parametrize("size", [MIB + 1, 8 * MIB], ids=["1MiB+1", "8MiB"])
def test_a_frame_over_one_mib_gets_payload_too_large_and_a_clean_1009_close(processes, size):
    token = create_reviewer(processes, "ws-limits")
    _, port = processes.daphne("daphne")
    answer, code, reason = asyncio.run(_frame_over_a_mib(port, token, size))
    assert answer == {"type": "error", "error": {"code": "PAYLOAD_TOO_LARGE", "message": "A frame is at most 1 MiB."}}
    assert code == 1009, (code, reason)

    # The server is fine: the next client streams a run.
    async def again() -> str:
        async with agent_socket(port, token) as ws:
            await ws.send(json.dumps({"action": "stream", "messages": "still serving"}))
            frames = []
            while not frames or frames[-1]["type"] != "finish":
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            return "".join(f["payload"]["text"] for f in frames if f["type"] == "text-delta")

    processes.worker("worker")
    assert asyncio.run(again()) == "Echo: still serving"


# --- slow subscribers -------------------------------------------------------------------------------
WORDS = 10_000


async def _connect(url: str, port: int, small_buffer: bool):
    """Open a socket (retrying a failed opening handshake, as any client would on a loaded machine)."""
    for attempt in range(5):
        sock = socket.create_connection(("127.0.0.1", port))
        if small_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        try:
            return await websockets.connect(
                url, sock=sock, additional_headers=ORIGIN, max_queue=4, max_size=None, open_timeout=20
            )
        except (OSError, websockets.InvalidHandshake):
            sock.close()
            if attempt == 4:
                raise
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


async def _subscriber(port: int, token: str, run_id: str, slow: bool) -> tuple[list[dict], list[tuple[int, str]]]:
    """Follow the run to its end, reconnecting with ?after=<seq> when closed with 4008. A slow one reads
    one frame every 2 ms through a small receive buffer until its first close, then at full speed."""
    chunks: list[dict] = []
    closes: list[tuple[int, str]] = []
    while not closes or closes[-1][0] != 1000:
        after = chunks[-1]["seq"] if chunks else 0
        url = f"ws://127.0.0.1:{port}/ws/runs/{run_id}/?after={after}&token={token}"
        async with await _connect(url, port, small_buffer=slow and not closes) as ws:
            try:
                async for message in ws:
                    chunks.append(json.loads(message))
                    if slow and not closes:
                        await asyncio.sleep(0.002)
            except websockets.ConnectionClosedError as closed:
                # 4008 arrives as a close frame ("error" to the client library); a reset has none.
                assert closed.rcvd is not None, f"dropped without a close frame after seq {after}: {closed!r}"
            closes.append((ws.close_code, ws.close_reason))
        assert closes[-1][0] in (1000, 4008), closes
        if closes[-1][0] == 4008:
            assert closes[-1][1] == f"resume after={chunks[-1]['seq']}", (closes[-1], chunks[-1]["seq"])
    return chunks, closes


def test_slow_subscribers_of_a_10k_chunk_run_are_closed_cleanly_and_resume_without_loss(processes):
    from agentrun.core.models import RunChunk

    token = create_reviewer(processes, "ws-slow")
    _, port = processes.daphne("daphne", env={"AGENTRUN_WS_MAX_LAG": "500"})
    processes.worker("worker")
    run_id = _start_long_run(port, token)

    async def everyone():
        return await asyncio.gather(*(_subscriber(port, token, run_id, slow=i % 2 == 1) for i in range(10)))

    started = time.monotonic()
    results = asyncio.run(everyone())
    elapsed = time.monotonic() - started
    logged = [c.to_chunk() for c in RunChunk.objects.filter(run_id=run_id).order_by("seq")]
    assert sum(c["type"] == "text-delta" for c in logged) == WORDS
    assert logged[-1]["type"] == "finish"
    for i, (chunks, closes) in enumerate(results):
        assert chunks == logged, f"subscriber {i} (closes {closes}) got {len(chunks)} of {len(logged)} chunks"
        if i % 2 == 1:
            assert closes[0][0] == 4008, f"slow subscriber {i} was not told it fell behind: {closes}"
    resumed = sum(code == 4008 for _, closes in results for code, _ in closes)
    figures(
        f"ws/runs slow subscribers: {len(logged)} chunks x 10 subscribers (5 slow) in {elapsed:.1f} s, "
        f"{resumed} closes with 4008 then resumed, 0 lost, 0 resets"
    )


def _start_long_run(port: int, token: str) -> str:
    text = " ".join(f"w{i}" for i in range(WORDS - 3))  # "Echo: /sleep 3000" + these: 10,000 deltas
    with requests.post(
        f"http://127.0.0.1:{port}/api/agents/support-agent/stream",
        json={"messages": f"/sleep 3000\n{text}"},  # 3 s before the first delta: subscribers join first
        headers={"Authorization": f"Token {token}"},
        stream=True,
        timeout=30,
    ) as sse:
        first = next(line for line in sse.iter_lines(decode_unicode=True) if line.startswith("data:"))
    return json.loads(first[5:])["runId"]


async def _stalled_subscriber(port: int, token: str, run_id: str) -> tuple[list[dict], int | None, str]:
    """Connect, then read nothing (the connection fills up) until the run is over and some seconds
    more; then read everything to the close."""
    from agentrun.core.fanout import CLIENT_STALL_SECONDS
    from agentrun.core.models import Run

    url = f"ws://127.0.0.1:{port}/ws/runs/{run_id}/?after=0&token={token}"
    async with await _connect(url, port, small_buffer=True) as ws:
        while await asyncio.to_thread(lambda: Run.objects.get(pk=run_id).status) != Run.Status.COMPLETED:
            await asyncio.sleep(0.2)
        await asyncio.sleep(CLIENT_STALL_SECONDS + 2)
        chunks = []
        try:
            async for message in ws:
                chunks.append(json.loads(message))
        except websockets.ConnectionClosedError as closed:
            assert closed.rcvd is not None, f"dropped without a close frame after {len(chunks)} chunks: {closed!r}"
        return chunks, ws.close_code, ws.close_reason


def test_a_client_that_stops_reading_is_closed_4008_while_it_stalls(processes):
    """A ws/runs client that stops reading mid-run is told it fell behind (4008) while it stalls, not
    waited for: reading again, it finds the chunks it was sent, then the close with the seq to resume
    after; the log has the rest."""
    from agentrun.core.models import RunChunk

    token = create_reviewer(processes, "ws-stall")
    _, port = processes.daphne("daphne", env={"AGENTRUN_WS_MAX_LAG": "500"})
    processes.worker("worker")
    run_id = _start_long_run(port, token)
    chunks, code, reason = asyncio.run(_stalled_subscriber(port, token, run_id))
    logged = [c.to_chunk() for c in RunChunk.objects.filter(run_id=run_id).order_by("seq")]
    assert (code, reason) == (4008, f"resume after={chunks[-1]['seq']}"), (code, reason, len(chunks))
    assert chunks == logged[: len(chunks)] and len(chunks) < len(logged)


async def _program_without_origin(port: int, token: str) -> tuple[str, str]:
    """A non-browser client (Python ``websockets`` sends no Origin): a token in the header, then in the query."""
    header = {"Authorization": f"Token {token}"}
    url = f"ws://127.0.0.1:{port}/ws/agents/support-agent/"
    async with websockets.connect(url, additional_headers=header, open_timeout=10) as ws:
        assert "origin" not in {k.lower() for k in ws.request.headers}
        await ws.send(json.dumps({"action": "stream", "messages": "no origin here"}))
        frames = []
        while not frames or frames[-1]["type"] != "finish":
            frames.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
        run_id = frames[0]["runId"]
    text = "".join(f["payload"]["text"] for f in frames if f["type"] == "text-delta")
    async with websockets.connect(
        f"ws://127.0.0.1:{port}/ws/runs/{run_id}/?after=0&token={token}", open_timeout=10
    ) as ws:
        replay = []
        while not replay or replay[-1]["type"] != "finish":
            replay.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
        with pytest.raises(websockets.ConnectionClosedOK):
            await asyncio.wait_for(ws.recv(), 10)
    assert replay == frames
    return text, run_id


async def _refused(url: str, **kwargs) -> int:
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(url, open_timeout=10, **kwargs):
            pass
    return refused.value.response.status_code


def test_a_program_without_origin_connects_with_a_token_and_browsers_keep_the_origin_check(processes):
    """docs/api.md#websockets through the real server: no Origin + a token is accepted; a foreign Origin and a
    cookie without Origin are refused at the handshake (HTTP 403)."""
    token = create_reviewer(processes, "ws-program")
    _, port = processes.daphne("daphne")
    processes.worker("worker")
    text, _ = asyncio.run(_program_without_origin(port, token))
    assert text == "Echo: no origin here"
    url = f"ws://127.0.0.1:{port}/ws/agents/support-agent/?token={token}"
    assert asyncio.run(_refused(url, origin="http://evil.example")) == 403
    session = requests.Session()
    login = session.get(f"http://127.0.0.1:{port}/accounts/login/")
    csrf = session.cookies["csrftoken"]
    session.post(
        f"http://127.0.0.1:{port}/accounts/login/",
        data={"username": "ws-program", "password": "pw-12345678", "csrfmiddlewaretoken": csrf},
        headers={"Referer": login.url},
    )
    cookie = "; ".join(f"{k}={v}" for k, v in session.cookies.items())
    assert "sessionid=" in cookie
    bare = f"ws://127.0.0.1:{port}/ws/agents/support-agent/"
    assert asyncio.run(_refused(bare, additional_headers={"Cookie": cookie})) == 403

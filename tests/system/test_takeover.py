"""A worker SIGKILLed mid-continuation: after the takeover the chunk log is well-formed for every reader
(exactly one ``finish`` per segment, docs/api.md#chunks), a subscriber connected through the takeover sees a
coherent stream, and the approved tool's side effect happened once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading

import pytest
import websockets

from tests.helpers.system import ORIGIN, Api, create_reviewer, lease_pid, sse_events, wait_until

pytestmark = [pytest.mark.system, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# Every model call of this run sleeps 3 s first: the continuation's is where its worker dies, after the
# segment logged start, tool-result and step-start (the log is written before each model call).
MESSAGE = '/sleep 3000\n/tool slow-send {"to": "ada@example.com", "seconds": 0.1}'


def segments(chunks: list[dict]) -> list[list[dict]]:
    """The chunks cut at each ``start``; asserts each segment ends with its one ``finish``."""
    out: list[list[dict]] = []
    for chunk in chunks:
        if chunk["type"] == "start":
            out.append([])
        assert out, f"a chunk before any start: {chunk}"
        out[-1].append(chunk)
    for segment in out:
        types = [c["type"] for c in segment]
        assert types.count("finish") == 1 and types[-1] == "finish", types
    return out


class LiveSubscriber(threading.Thread):
    """``ws/runs`` from seq 0 until close 1000, obeying 4008/4009 ``resume after=<seq>`` (on 4009 it
    drops what it got after that seq, as README "Production" tells clients to)."""

    def __init__(self, port: int, token: str, run_id: str) -> None:
        super().__init__(daemon=True)
        self.port, self.token, self.run_id = port, token, run_id
        self.chunks: list[dict] = []
        self.closes: list[tuple[int, str]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._follow())
        except BaseException as exc:  # reported by the test
            self.error = exc

    async def _follow(self) -> None:
        while not self.closes or self.closes[-1][0] != 1000:
            after = self.chunks[-1]["seq"] if self.chunks else 0
            url = f"ws://127.0.0.1:{self.port}/ws/runs/{self.run_id}/?after={after}&token={self.token}"
            async with websockets.connect(url, additional_headers=ORIGIN, open_timeout=10) as ws:
                try:
                    async for message in ws:
                        self.chunks.append(json.loads(message))
                except websockets.ConnectionClosedError as closed:
                    assert closed.rcvd is not None, "dropped without a close frame"
                self.closes.append((ws.close_code, ws.close_reason))
            code, reason = self.closes[-1]
            assert code in (1000, 4008, 4009), self.closes
            if code == 4009:
                resume = int(reason.removeprefix("resume after="))
                self.chunks = [c for c in self.chunks if c["seq"] <= resume]


def test_a_worker_killed_mid_continuation_leaves_a_well_formed_log_for_every_reader(processes):
    from agentrun.core.models import Decision, Run, RunChunk, ToolEffect

    token = create_reviewer(processes, "takeover")
    _, port = processes.daphne("daphne")
    workers = {w.pid: w for w in (processes.worker("worker-1"), processes.worker("worker-2"))}
    api = Api(port, token)

    answer = api.post("/api/agents/slow-agent/generate", {"messages": MESSAGE}).json()
    run_id, call_id = answer["runId"], answer["suspended"][0]["toolCallId"]
    live = LiveSubscriber(port, token, run_id)
    live.start()
    decided = api.post(f"/api/agents/slow-agent/runs/{run_id}/approve", {"toolCallId": call_id})
    assert decided.status_code == 202, decided.text

    def dying_driver() -> int | None:
        # The continuation logged its tool-result and step-start and sleeps in its model call.
        logged = list(RunChunk.objects.filter(run_id=run_id).order_by("seq").values_list("type", flat=True))
        pid = lease_pid(Run.objects.get(pk=run_id).lease_owner)
        return pid if pid in workers and logged.count("start") == 2 and logged[-1] == "step-start" else None

    victim = wait_until(dying_driver, 30, "the continuation to be in its model call")
    os.kill(victim, signal.SIGKILL)
    workers[victim].wait(timeout=10)

    run = api.wait_final(run_id, 40)
    assert run["status"] == "completed", run
    live.join(timeout=30)
    assert not live.is_alive() and live.error is None, live.error

    logged = [c.to_chunk() for c in RunChunk.objects.filter(run_id=run_id).order_by("seq")]
    assert [c["seq"] for c in logged] == list(range(1, len(logged) + 1))
    first, dead, taker = segments(logged)
    assert first[-1]["payload"]["finishReason"] == "suspended"
    # The dead driver's segment, closed by the taker with the documented finish.
    assert [c["type"] for c in dead] == ["start", "tool-result", "step-start", "finish"]
    assert dead[-1]["payload"]["finishReason"] == "error"
    assert dead[-1]["payload"]["error"]["code"] == "driver_lost"
    assert taker[-1]["payload"]["finishReason"] == "stop"
    assert "".join(c["payload"]["text"] for c in taker if c["type"] == "text-delta").startswith("slow-send:")
    assert ToolEffect.objects.filter(run_id=run_id).count() == 1, "the side effect happened once"
    assert Decision.objects.filter(run_id=run_id).count() == 1
    assert [c["payload"]["toolCallId"] for c in logged if c["type"] == "tool-result"] == [call_id]

    # Every reader sees that log: the live subscriber, a websocket replay, SSE, and ?after= anywhere.
    assert live.chunks == logged, live.closes
    replayed = asyncio.run(_replay(port, token, run_id, 0))
    assert replayed == logged
    middle = dead[-1]["seq"] - 1
    assert asyncio.run(_replay(port, token, run_id, middle)) == logged[middle:]
    with api.get(f"/api/runs/{run_id}/stream", headers={"Accept": "text/event-stream"}, stream=True) as sse:
        streamed = [json.loads(data) for _id, event, data in sse_events(sse) if event == "chunk"]
    assert streamed == logged


async def _replay(port: int, token: str, run_id: str, after: int) -> list[dict]:
    url = f"ws://127.0.0.1:{port}/ws/runs/{run_id}/?after={after}&token={token}"
    async with websockets.connect(url, additional_headers=ORIGIN, open_timeout=10) as ws:
        chunks = [json.loads(m) async for m in ws]
        assert ws.close_code == 1000
    return chunks

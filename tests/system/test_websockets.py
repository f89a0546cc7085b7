"""Websockets through the real server (agentrun.daphne_ws): frame limits and slow subscribers."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from tests.system.conftest import create_reviewer

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

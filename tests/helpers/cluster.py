"""Clients of a cluster of web processes, as the system scenarios use them (test_scenario, test_outages):
REST that retries like a careful client, and websocket subscribers that reconnect like the README says."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable

import requests
import websockets

ORIGIN = {"origin": "http://localhost"}
RETRIED = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)
FINAL_CLOSE = 1000


class Cluster:
    """The web processes as clients see them: a request that cannot connect is retried on the other; a
    503 ``SERVICE_UNAVAILABLE`` (the database or Redis away) is retried after its ``Retry-After``."""

    def __init__(self, ports: list[int], token: str, end: float) -> None:
        self.ports = ports
        self.token = token
        self.end = end
        self.local = threading.local()
        self.retries = Counter()
        self.unavailable = Counter()  # 503s, by whether they were the contract's (envelope + Retry-After)

    def _session(self) -> requests.Session:
        if not hasattr(self.local, "session"):
            self.local.session = requests.Session()
            self.local.session.headers["Authorization"] = f"Token {self.token}"
        return self.local.session

    def request(self, method: str, path: str, prefer: int = 0, **kwargs) -> requests.Response:
        for attempt in itertools.count():
            port = self.ports[(prefer + attempt) % len(self.ports)]
            try:
                response = self._session().request(method, f"http://127.0.0.1:{port}{path}", timeout=30, **kwargs)
            except RETRIED:
                self.retries[method] += 1
                del self.local.session  # a fresh connection next time
                if time.monotonic() > self.end:
                    raise
                time.sleep(0.05 * min(attempt, 10))
                continue
            if response.status_code != 503 or time.monotonic() > self.end:
                return response
            contractual = (
                response.headers.get("Retry-After", "").isdigit()
                and response.headers.get("Content-Type") == "application/json"
                and response.json()["error"]["code"] == "SERVICE_UNAVAILABLE"
            )
            self.unavailable["SERVICE_UNAVAILABLE" if contractual else response.text[:80]] += 1
            time.sleep(min(float(response.headers.get("Retry-After") or 1), 5))
        raise AssertionError("unreachable")


class Subscribers:
    """Websocket watchers of a sample of runs, alternating servers, reconnecting with ``?after=<last seq>``;
    on 4009 ``resume after=<seq>`` (a takeover replaced chunks they were shown live) they drop what they
    got after that seq, as README "Production" tells clients to.

    ``log_end(run_id)``: the last seq of the run's log; given, a socket that sent nothing for
    ``idle_seconds`` while the log went further is counted ``silent`` (and reconnected)."""

    def __init__(
        self,
        cluster: Cluster,
        run_ids: list[str],
        log_end: Callable[[str], int] | None = None,
        idle_seconds: float = 10,
    ) -> None:
        self.cluster = cluster
        self.run_ids = run_ids
        self.log_end = log_end
        self.idle_seconds = idle_seconds
        self.chunks: dict[str, list[dict]] = {r: [] for r in run_ids}
        self.reconnects = Counter()
        self.closes: Counter = Counter()
        self.silent: Counter = Counter()
        self.errors: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._all(),), daemon=True)

    async def _all(self) -> None:
        await asyncio.gather(*(self._watch(i, r) for i, r in enumerate(self.run_ids)))

    async def _frames(self, run_id: str, ws) -> bool:  # noqa: ANN001 - a websockets connection
        """Take the socket's chunks until it closes (ConnectionClosed) or goes silent; False after an
        error frame (recorded: the watch ends)."""
        got = self.chunks[run_id]
        while True:
            try:
                message = await asyncio.wait_for(ws.recv(), self.idle_seconds if self.log_end else None)
            except TimeoutError:
                after = got[-1]["seq"] if got else 0
                if await asyncio.to_thread(self.log_end, run_id) > after:
                    self.silent[run_id] += 1  # open, sending nothing, while the run went on
                    await ws.close()
                    return True
                continue
            frame = json.loads(message)
            if frame.get("type") == "error":
                self.errors.append(f"{run_id}: {frame}")
                return False
            got.append(frame)

    async def _watch(self, index: int, run_id: str) -> None:
        got = self.chunks[run_id]
        for attempt in itertools.count():
            if time.monotonic() > self.cluster.end:
                self.errors.append(f"{run_id}: still watching at the deadline")
                return
            port = self.cluster.ports[(index + attempt) % len(self.cluster.ports)]
            after = got[-1]["seq"] if got else 0
            url = f"ws://127.0.0.1:{port}/ws/runs/{run_id}/?after={after}&token={self.cluster.token}"
            try:
                async with websockets.connect(url, additional_headers=ORIGIN, open_timeout=5) as ws:
                    try:
                        if not await self._frames(run_id, ws):
                            return
                    except websockets.ConnectionClosed:
                        pass  # 1011/1013/4008/4009 and a server gone away: the code below says what to do
                    self.closes[ws.close_code] += 1
                    if ws.close_code == 4009:
                        resume = int(ws.close_reason.removeprefix("resume after="))
                        got[:] = [c for c in got if c["seq"] <= resume]
                    final = got and got[-1]["type"] == "finish" and got[-1]["payload"]["finishReason"] != "suspended"
                    if ws.close_code == FINAL_CLOSE and final:
                        return
            except (OSError, TimeoutError, websockets.ConnectionClosedError, websockets.InvalidHandshake):
                pass
            self.reconnects[run_id] += 1
            await asyncio.sleep(0.2)

    def start(self) -> None:
        self.thread.start()

    def join(self, seconds: float) -> None:
        self.thread.join(seconds)
        assert not self.thread.is_alive(), "subscribers did not finish"

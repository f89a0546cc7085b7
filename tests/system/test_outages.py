"""Issue 25, with real processes and real services failing: 2 daphne + 2 agentrun workers on a
PostgreSQL cluster and a redis-server of the test's own. Runs suspend through REST on both web
processes; every open call gets 3 racing approvals spread over both; meanwhile PostgreSQL is restarted
(``pg_ctl restart -m fast``), Redis is SIGKILLed and started again 2 s later, and a worker SIGKILLs
itself right after a tool result commits (the fault point ``tool-result-committed``,
``agentrun/engine/faults.py``). Websocket subscribers watch a sample of the runs and each server's
reviewers' feed.

Nothing approved is lost (one decision, one effect, one tool-result per call; no tool-error), every
chunk log is well-formed, every socket is live or closed with a code, REST answers the outages with the
contract's 503 (never a 500). Prints one line of figures (``outages: …``).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed

import pytest
import requests
import websockets

from tests.helpers.cluster import ORIGIN, Cluster, Subscribers
from tests.helpers.system import create_reviewer, figures, wait_until

pytestmark = [pytest.mark.system, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RUNS = 80
RACERS = 3
SAMPLE = 12
THREADS = 16
BUDGET_SECONDS = 110  # the whole scenario, processes and services included
REDIS_DOWN_SECONDS = 2.0  # how long Redis stays away (the fault's length, not a wait for anything)
FAULT = "tool-result-committed"
EMAIL = '/tool send-email {{"to": "c{n}@example.com", "subject": "Order {n}", "body": "Shipped."}}'


class Feeds:
    """The reviewers' live feed (``ws/approvals/``) on each server, reconnecting as the pages do
    (0.5 s): how its sockets ended, and handshakes refused."""

    def __init__(self, ports: list[int], token: str) -> None:
        self.urls = [f"ws://127.0.0.1:{port}/ws/approvals/?token={token}" for port in ports]
        self.closes: Counter = Counter()
        self.refused: Counter = Counter()
        self.opened = 0
        self.stopping = False
        self.sockets: set = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._all(),), daemon=True)

    async def _all(self) -> None:
        await asyncio.gather(*(self._watch(url) for url in self.urls))

    async def _watch(self, url: str) -> None:
        while not self.stopping:
            try:
                async with websockets.connect(url, additional_headers=ORIGIN, open_timeout=10) as ws:
                    self.opened += 1
                    self.sockets.add(ws)
                    try:
                        async for _ in ws:
                            pass
                    except websockets.ConnectionClosed:
                        pass
                    self.sockets.discard(ws)
                    if not self.stopping:
                        self.closes[ws.close_code] += 1
            except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
                self.refused[type(exc).__name__] += 1
            await asyncio.sleep(0.5)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        async def close_all() -> None:
            self.stopping = True
            for ws in list(self.sockets):
                await ws.close()

        asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(10)
        self.thread.join(10)


def test_racing_decisions_through_a_database_restart_a_redis_restart_and_a_worker_killed_after_a_result(
    processes, private_postgres, private_redis
):
    started = time.monotonic()
    pg, redis = private_postgres, private_redis
    processes.env.update(DATABASE_URL=pg.url, REDIS_URL=redis.url)
    processes.manage("migrate", "--noinput")
    token = create_reviewer(processes, "outage-reviewer")
    _, port_a = processes.daphne("daphne-a")
    _, port_b = processes.daphne("daphne-b")
    processes.worker("worker-1")
    victim = processes.worker("worker-2", env={"AGENTRUN_FAULT": FAULT})
    cluster = Cluster([port_a, port_b], token, end=started + BUDGET_SECONDS)

    def sql(query: str, *args) -> list[tuple]:
        with pg.connect() as conn:
            return conn.execute(query, args).fetchall()

    def log_end(run_id: str) -> int:
        return sql("SELECT coalesce(max(seq), 0) FROM agentrun_runchunk WHERE run_id = %s", run_id)[0][0]

    # 1. Runs suspend, started through both web processes.
    def start(n: int) -> tuple[str, str]:
        body = {"messages": EMAIL.format(n=n), "memory": {"thread": f"out-{n}"}}
        answer = cluster.request("POST", "/api/agents/support-agent/generate", prefer=n, json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "suspended", answer.text
        return answer.json()["runId"], answer.json()["suspended"][0]["toolCallId"]

    with ThreadPoolExecutor(THREADS) as pool:
        runs = list(pool.map(start, range(RUNS)))
    run_ids = [r for r, _ in runs]
    calls = {c: r for r, c in runs}

    # 2. Subscribers of a sample of the runs, and each server's reviewers' feed.
    subscribers = Subscribers(cluster, run_ids[:: RUNS // SAMPLE][:SAMPLE], log_end=log_end)
    subscribers.start()
    feeds = Feeds([port_a, port_b], token)
    feeds.start()
    wait_until(lambda: feeds.opened >= 2, 20, "the feeds to open")

    # 3. Racing approvals over both servers; the faults meanwhile. A retried request carries the same
    #    Idempotency-Key, so a decision committed just before its answer was lost counts once.
    outcomes: Counter = Counter()
    unexpected: list[str] = []
    lock = threading.Lock()

    def approve(run_id: str, call_id: str, racer: int, barrier: threading.Barrier, key: str) -> None:
        barrier.wait()
        response = cluster.request(
            "POST",
            f"/api/agents/support-agent/runs/{run_id}/approve",
            prefer=racer,
            json={"toolCallId": call_id},
            headers={"Idempotency-Key": key},
        )
        with lock:
            if response.status_code == 202:
                outcomes["won"] += 1
            elif response.status_code in (404, 409) and response.json()["error"]["code"] in (
                "TOOL_CALL_ALREADY_DECIDED",
                "RUN_NOT_SUSPENDED",
                "RUN_NOT_FOUND",
            ):
                outcomes["rejected"] += 1
            else:
                unexpected.append(f"{response.status_code} {response.text[:200]}")

    def database_answers(port: int) -> bool:
        try:
            body = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()
        except (requests.RequestException, ValueError):
            return False
        return body["database"]["ok"] and body["channelLayer"]["ok"]

    def recovered_after(back: float) -> float:
        """Seconds from the service answering again until both web processes' /healthz say so."""
        wait_until(lambda: all(database_answers(p) for p in (port_a, port_b)), 30, "/healthz to recover", 0.05)
        return time.monotonic() - back

    faults: dict[str, float] = {}
    with ThreadPoolExecutor(THREADS) as pool:
        futures = []
        for i, (run_id, call_id) in enumerate(runs):
            barrier = threading.Barrier(RACERS, timeout=60)
            for racer in range(RACERS):
                key = f"{run_id}-{racer}-{uuid.uuid4().hex[:8]}"
                futures.append(pool.submit(approve, run_id, call_id, i + racer, barrier, key))
        for done, future in enumerate(as_completed(futures), start=1):
            future.result()
            if victim.poll() is not None and "worker killed" not in faults:
                faults["worker killed"] = 0.0  # the fault point fired: a fresh worker takes its place
                processes.worker("worker-2-restarted")
            if done == len(futures) // 5:
                pg.restart()  # returns once PostgreSQL accepts connections again
                faults["postgres restart"] = recovered_after(time.monotonic())
            if done == 2 * len(futures) // 5:
                redis.kill()
                time.sleep(REDIS_DOWN_SECONDS)
                redis.start()
                faults["redis restart"] = recovered_after(time.monotonic())
    decided_at = time.monotonic()

    # 4. Every run completes.
    def unfinished() -> int:
        return sql("SELECT count(*) FROM agentrun_run WHERE id = ANY(%s) AND status <> 'completed'", run_ids)[0][0]

    wait_until(lambda: unfinished() == 0, max(5.0, cluster.end - time.monotonic()), "every run to complete", 0.5)
    if victim.poll() is not None and "worker killed" not in faults:
        faults["worker killed"] = 0.0
    subscribers.join(max(5.0, cluster.end - time.monotonic()))
    feeds.stop()

    # 5. The checks: nothing approved lost, every log well-formed, every socket accounted for.
    decisions = Counter(t for (t,) in sql("SELECT tool_call_id FROM agentrun_decision WHERE run_id = ANY(%s)", run_ids))
    effects = Counter(t for (t,) in sql("SELECT tool_call_id FROM agentrun_tooleffect WHERE run_id = ANY(%s)", run_ids))
    logs: dict[str, list[dict]] = {r: [] for r in run_ids}
    rows = sql("SELECT run_id, seq, type, payload FROM agentrun_runchunk WHERE run_id = ANY(%s) ORDER BY seq", run_ids)
    for run_id, seq, type_, payload in rows:
        logs[run_id].append({"seq": seq, "type": type_, "payload": payload})
    malformed = {r: problems for r, log in logs.items() if (problems := log_problems(log))}
    lost = [c for c in calls if decisions[c] != 1 or effects[c] != 1]
    announced = ("tool-result", "tool-output-denied")
    results = Counter(c["payload"]["toolCallId"] for log in logs.values() for c in log if c["type"] in announced)
    unannounced = [c for c in calls if results[c] != 1]
    errors = [c for log in logs.values() for c in log if c["type"] == "tool-error"]
    killed_after_result = sum(1 for log in logs.values() if takeover_after(log, "tool-result"))
    mismatched = [
        r
        for r, got in subscribers.chunks.items()
        if [(c["seq"], c["type"], c["payload"]) for c in got] != [(c["seq"], c["type"], c["payload"]) for c in logs[r]]
    ]
    names = ["daphne-a", "daphne-b", "worker-1", "worker-2", "worker-2-restarted"]
    server_logs = {name: processes.log(name) for name in names if (processes.logdir / f"{name}.log").exists()}
    never_retrieved = [n for n, text in server_logs.items() if "Task exception was never retrieved" in text]
    server_errors = [n for n, text in server_logs.items() if "Internal Server Error" in text]
    tracebacks = {n: text.count("Traceback") for n, text in server_logs.items()}
    seconds = time.monotonic() - started
    figures(
        f"outages: runs={RUNS} decisions attempted={len(futures)} won={outcomes['won']} "
        f"rejected={outcomes['rejected']} faults={sorted(faults)} "
        f"healthz_recovered_after_postgres={faults.get('postgres restart', -1):.2f}s "
        f"after_redis={faults.get('redis restart', -1):.2f}s unavailable_answers={dict(cluster.unavailable)} "
        f"retried_requests={sum(cluster.retries.values())} lost={len(lost)} unannounced={len(unannounced)} "
        f"malformed_logs={len(malformed)} taken_over_after_a_result={killed_after_result} "
        f"subscribers={len(subscribers.run_ids)} closes={dict(subscribers.closes)} "
        f"silent={sum(subscribers.silent.values())} "
        f"feed_closes={dict(feeds.closes)} feed_refused={dict(feeds.refused)} tracebacks={tracebacks} "
        f"decide_seconds={decided_at - started:.1f} seconds={seconds:.1f}"
    )

    assert victim.returncode == -9, "the fault point killed the worker (SIGKILL)"
    assert sorted(faults) == ["postgres restart", "redis restart", "worker killed"]
    assert not unexpected, unexpected[:5]
    assert outcomes["won"] == RUNS and outcomes["won"] + outcomes["rejected"] == RUNS * RACERS
    assert set(cluster.unavailable) <= {"SERVICE_UNAVAILABLE"}, cluster.unavailable  # 503s: the contract's
    assert not lost, f"approved actions lost or doubled: {lost[:5]}"
    assert not unannounced, f"decided calls without exactly one result chunk: {unannounced[:5]}"
    assert not errors, f"an infrastructure error became a tool's result: {errors[:2]}"
    assert not malformed, f"malformed chunk logs: {list(malformed.items())[:3]}"
    assert killed_after_result >= 1, "a run was taken over right after its tool result committed"
    assert not subscribers.errors, subscribers.errors[:5]
    assert not subscribers.silent, f"sockets open and silent while their run went on: {subscribers.silent}"
    assert not mismatched, f"subscribers saw something other than the log: {mismatched[:3]}"
    assert feeds.closes[1013] >= 2, f"each feed closed 1013 while Redis was away: {feeds.closes}"
    assert not feeds.refused, f"feed handshakes refused: {feeds.refused}"
    assert not never_retrieved and not server_errors, (never_retrieved, server_errors)
    assert seconds < BUDGET_SECONDS


def log_problems(log: list[dict]) -> list[str]:
    """What makes a chunk log malformed: a gap, a segment without exactly one finish at its end."""
    problems = []
    seqs = [c["seq"] for c in log]
    if seqs != list(range(1, len(seqs) + 1)):
        problems.append(f"seqs {seqs}")
    types = [c["type"] for c in log]
    starts = [i for i, t in enumerate(types) if t == "start"]
    for i, begin in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(types)
        if types[begin:end].count("finish") != 1 or types[end - 1] != "finish":
            problems.append(f"segment at seq {begin + 1}: {types[begin:end]}")
    if starts and starts[0] != 0:
        problems.append(f"chunks before the first start: {types[: starts[0]]}")
    return problems


def takeover_after(log: list[dict], type_: str) -> bool:
    """A chunk of ``type_`` directly followed by a taker's ``driver_lost`` finish."""
    return any(
        a["type"] == type_ and b["type"] == "finish" and (b["payload"].get("error") or {}).get("code") == "driver_lost"
        for a, b in zip(log, log[1:], strict=False)
    )

"""The production scenario of issue 6, with real processes: 2 daphne + 2 agentrun workers on PostgreSQL
and Redis. 300 runs suspend through REST on both web processes; every open call gets 3 racing approvals
spread over both; meanwhile a worker is SIGKILLed and a daphne restarted, while websocket subscribers
on both servers watch a sample of the runs. Nothing decided is lost or applied twice.

Prints one line of figures (``scenario: runs=… decisions attempted=… won=… …``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed

import pytest

from agentrun.core.models import Decision, Run, RunChunk, ToolEffect
from tests.helpers.cluster import Cluster, Subscribers
from tests.helpers.system import create_reviewer, figures, wait_until

pytestmark = [pytest.mark.system, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RUNS = 300
RACERS = 3
SAMPLE = 20
THREADS = 24
BUDGET_SECONDS = 240  # the whole scenario; it usually takes well under half of this
EMAIL = '/tool send-email {{"to": "c{n}@example.com", "subject": "Order {n}", "body": "Shipped."}}'


def lease_holder_pids(run_ids: list[str]) -> Counter:
    owners = Run.objects.filter(pk__in=run_ids, lease_owner__isnull=False).values_list("lease_owner", flat=True)
    return Counter(int(o.split(":")[1]) for o in owners if not o.startswith("dispatch:"))  # host:pid:…


def test_300_runs_racing_decisions_worker_killed_daphne_restarted(processes):
    started = time.monotonic()
    token = create_reviewer(processes, "scenario-reviewer")
    daphne_a, port_a = processes.daphne("daphne-a")
    _, port_b = processes.daphne("daphne-b")
    workers = [processes.worker("worker-1"), processes.worker("worker-2")]
    cluster = Cluster([port_a, port_b], token, end=started + BUDGET_SECONDS)

    # 1. 300 runs suspend, started through both web processes.
    def start(n: int) -> tuple[str, str]:
        body = {"messages": EMAIL.format(n=n), "memory": {"thread": f"scn-{n}", "resource": f"customer-{n % 7}"}}
        response = cluster.request("POST", "/api/agents/support-agent/generate", prefer=n, json=body)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["status"] == "suspended", answer
        return answer["runId"], answer["suspended"][0]["toolCallId"]

    with ThreadPoolExecutor(THREADS) as pool:
        runs = list(pool.map(start, range(RUNS)))
    run_ids = [r for r, _ in runs]
    calls = {c: r for r, c in runs}
    assert len(set(run_ids)) == RUNS
    listed = cluster.request("GET", "/api/agents/support-agent/suspended-runs").json()
    assert listed["total"] == RUNS

    # 2. Websocket subscribers on both servers for a sample of the runs, from seq 1.
    sample = run_ids[:: RUNS // SAMPLE][:SAMPLE]
    subscribers = Subscribers(cluster, sample)
    subscribers.start()

    # 3. Three racing approvals per call, over both servers. A retried request carries the same
    #    Idempotency-Key, so a decision committed just before its server went away is counted once.
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
        body = response.json()
        with lock:
            if response.status_code == 202:
                outcomes["won"] += 1
            elif response.status_code in (404, 409) and body["error"]["code"] in (
                "TOOL_CALL_ALREADY_DECIDED",
                "RUN_NOT_SUSPENDED",
                "RUN_NOT_FOUND",
            ):
                outcomes["rejected"] += 1
                outcomes[body["error"]["code"]] += 1
            else:
                unexpected.append(f"{response.status_code} {response.text[:200]}")

    faults: list[str] = []
    with ThreadPoolExecutor(THREADS) as pool:
        futures = []
        for i, (run_id, call_id) in enumerate(runs):
            barrier = threading.Barrier(RACERS, timeout=60)
            for racer in range(RACERS):
                key = f"{run_id}-{racer}-{uuid.uuid4().hex[:8]}"
                futures.append(pool.submit(approve, run_id, call_id, i + racer, barrier, key))
        for done, future in enumerate(as_completed(futures), start=1):
            future.result()
            if done == len(futures) // 4 and not faults:
                # Kill the worker driving the most continuations right now (SIGKILL: no cleanup at all).
                holders = lease_holder_pids(run_ids)
                victim = next((w for w in workers if holders.get(w.pid)), workers[0])
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait(timeout=10)
                faults.append("worker SIGKILL")
            if done == len(futures) // 2 and len(faults) == 1:
                # Restart a web process on its port: clients meanwhile retry on the other one.
                processes.kill(daphne_a, signal.SIGTERM)
                daphne_a, _ = processes.daphne("daphne-a-restarted", port=port_a)
                faults.append("daphne restart")
    decided_at = time.monotonic()

    # 4. Every run completes: the surviving worker takes over what the killed one held.
    def unfinished() -> int:
        return Run.objects.filter(pk__in=run_ids).exclude(status=Run.Status.COMPLETED).count()

    wait_until(
        lambda: unfinished() == 0, max(5.0, cluster.end - time.monotonic()), "every run to complete", interval=0.5
    )

    def status(run_id: str) -> str:
        return cluster.request("GET", f"/api/runs/{run_id}", prefer=hash(run_id)).json()["status"]

    with ThreadPoolExecutor(THREADS) as pool:
        statuses = Counter(pool.map(status, run_ids))
    subscribers.join(max(5.0, cluster.end - time.monotonic()))

    # 5. The figures and the checks.
    decisions = Counter(Decision.objects.filter(run_id__in=run_ids).values_list("tool_call_id", flat=True))
    effects = Counter(ToolEffect.objects.filter(run_id__in=run_ids).values_list("tool_call_id", flat=True))
    lost = sum(1 for c in calls if decisions[c] == 0) + sum(1 for c in calls if effects[c] == 0)
    duplicated = sum(n - 1 for n in decisions.values() if n > 1) + sum(n - 1 for n in effects.values() if n > 1)
    gaps = 0
    mismatched = []
    for run_id, got in subscribers.chunks.items():
        seqs = [c["seq"] for c in got]
        if seqs != list(range(1, len(seqs) + 1)):
            gaps += 1
        logged = [c.to_chunk() for c in RunChunk.objects.filter(run_id=run_id).order_by("seq")]
        if got != logged:
            mismatched.append(
                f"{run_id}: saw {[(c['seq'], c['type']) for c in got]} logged {[(c['seq'], c['type']) for c in logged]}"
            )
    listing = cluster.request("GET", "/api/agents/support-agent/suspended-runs").json()
    seconds = time.monotonic() - started
    figures(
        f"scenario: runs={RUNS} decisions attempted={len(futures)} won={outcomes['won']} "
        f"rejected={outcomes['rejected']} (already_decided={outcomes['TOOL_CALL_ALREADY_DECIDED']} "
        f"not_suspended={outcomes['RUN_NOT_SUSPENDED']} finished={outcomes['RUN_NOT_FOUND']}) "
        f"faults={len(faults)} ({', '.join(faults)}) retried_requests={sum(cluster.retries.values())} "
        f"side_effects={sum(effects.values())} lost={lost} duplicated={duplicated} "
        f"subscribers={len(sample)} reconnects={sum(subscribers.reconnects.values())} "
        f"closes={dict(subscribers.closes)} gaps={gaps} "
        f"listing_total={listing['total']} decide_seconds={decided_at - started:.1f} seconds={seconds:.1f}"
    )

    assert not unexpected, unexpected[:5]
    assert faults == ["worker SIGKILL", "daphne restart"]
    assert statuses == {"completed": RUNS}
    assert outcomes["won"] == RUNS and outcomes["won"] + outcomes["rejected"] == RUNS * RACERS
    assert set(decisions) == set(calls) and set(decisions.values()) == {1}, "exactly one decision per call"
    assert set(effects) == set(calls) and set(effects.values()) == {1}, "every approved effect exactly once"
    assert lost == 0 and duplicated == 0
    assert not subscribers.errors, subscribers.errors[:5]
    assert gaps == 0
    assert not mismatched, "subscribers saw something other than the log:\n" + "\n".join(mismatched[:3])
    assert listing["total"] == 0
    assert seconds < BUDGET_SECONDS

"""SIGTERM drains in bounded time (AGENTRUN_DRAIN_SECONDS) and loses nothing: a web process stopped
under a load of REST decisions, and a worker stopped in the middle of a long tool call."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid

import pytest
import requests

from tests.helpers.system import SLOW, Api, create_reviewer, figures, lease_pid, wait_until

pytestmark = [pytest.mark.system, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

DRAIN = 3
EMAIL = '/tool send-email {"to": "ada@example.com", "subject": "Hi", "body": "Hello"}'
RUNS = 120


async def suspended_runs(count: int) -> list[str]:
    from agentrun.engine.agents import get_agent

    agent = get_agent("support-agent")
    ids = []
    for i in range(count):
        stream = await agent.stream(EMAIL, memory={"thread": f"drain-{i}"})
        await stream.collect()
        ids.append(stream.run_id)
    return ids


def test_sigterm_under_decision_load_drains_in_bounded_time_and_every_decision_completes(processes):
    from agentrun.core.models import Decision, Run

    token = create_reviewer(processes, "drain")
    drain = {"AGENTRUN_DRAIN_SECONDS": str(DRAIN)}
    server_a, port_a = processes.daphne("daphne-a", env=drain)
    _, port_b = processes.daphne("daphne-b", env=drain)
    processes.worker("worker-1")
    processes.worker("worker-2")
    run_ids = asyncio.run(suspended_runs(RUNS))

    answers: dict[str, list[int | str]] = {run_id: [] for run_id in run_ids}
    sent = threading.Semaphore(0)

    def decide(batch: list[str]) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Token {token}"
        for run_id in batch:
            key = str(uuid.uuid4())  # a retry on the other server is the same request
            for port in (port_a, port_b):
                try:
                    response = session.post(
                        f"http://127.0.0.1:{port}/api/agents/support-agent/runs/{run_id}/approve",
                        json={},
                        headers={"Idempotency-Key": key},
                        timeout=30,
                    )
                except requests.ConnectionError:
                    answers[run_id].append(f"cut off by {port}")
                    continue  # what a load balancer does: the next server
                answers[run_id].append(response.status_code)
                break
            sent.release()

    deciders = [threading.Thread(target=decide, args=(run_ids[i::8],)) for i in range(8)]
    for thread in deciders:
        thread.start()
    for _ in range(RUNS // 3):
        sent.acquire(timeout=60)
    stopped = time.monotonic()
    server_a.send_signal(signal.SIGTERM)
    server_a.wait(timeout=DRAIN + 10)
    took = time.monotonic() - stopped
    for thread in deciders:
        thread.join(timeout=60)
    assert took < DRAIN + 2 + 1.5, f"the web process took {took:.1f} s to stop (drain {DRAIN} s + 2 s)"
    assert server_a.returncode == 0

    # Every decision answered was accepted, once; every recorded decision's continuation ran.
    assert all(a and a[-1] in (202, 409) for a in answers.values()), answers

    def all_completed():
        return Run.objects.filter(pk__in=run_ids, status=Run.Status.COMPLETED).count() == RUNS

    wait_until(all_completed, 60, "every approved run to complete")
    assert Decision.objects.filter(run_id__in=run_ids).count() == RUNS
    cut = sum(isinstance(a, str) for answer in answers.values() for a in answer)
    figures(
        f"drain: web process under {RUNS} REST decisions stopped {took:.1f} s after SIGTERM "
        f"(AGENTRUN_DRAIN_SECONDS={DRAIN}); {cut} requests retried on the other server; 0 decisions lost"
    )


def test_sigterm_to_a_worker_in_a_long_tool_call_leaves_within_the_drain_and_the_run_completes(processes):
    from agentrun.core.models import Decision, Run, RunChunk, ToolEffect

    token = create_reviewer(processes, "drain-worker")
    drain = {"AGENTRUN_DRAIN_SECONDS": str(DRAIN)}
    _, port = processes.daphne("daphne", env=drain)
    workers = {w.pid: w for w in (processes.worker("worker-1", env=drain), processes.worker("worker-2", env=drain))}
    api = Api(port, token)
    answer = api.post("/api/agents/slow-agent/generate", {"messages": SLOW.format(seconds=30)}).json()
    run_id, call_id = answer["runId"], answer["suspended"][0]["toolCallId"]
    assert api.post(f"/api/agents/slow-agent/runs/{run_id}/approve", {"toolCallId": call_id}).status_code == 202

    def driver() -> int | None:
        pid = lease_pid(Run.objects.get(pk=run_id).lease_owner)
        return pid if pid in workers and ToolEffect.objects.filter(tool_call_id=call_id).exists() else None

    victim = wait_until(driver, 30, "a worker to run the 30 s tool")
    stopped = time.monotonic()
    os.kill(victim, signal.SIGTERM)
    workers[victim].wait(timeout=DRAIN + 10)
    took = time.monotonic() - stopped
    assert took < DRAIN + 1.5, f"the worker took {took:.1f} s to leave"

    # Its lease was expired on the way out: the other worker takes the run over at once.
    run = api.wait_final(run_id, 60)
    assert run["status"] == "completed", run
    assert ToolEffect.objects.filter(run_id=run_id).count() == 1
    assert Decision.objects.filter(run_id=run_id).count() == 1
    finishes = [c.payload for c in RunChunk.objects.filter(run_id=run_id, type="finish").order_by("seq")]
    assert finishes[-1]["finishReason"] == "stop"
    figures(f"drain: worker in a 30 s tool call left {took:.1f} s after SIGTERM (AGENTRUN_DRAIN_SECONDS={DRAIN})")

"""``/metrics`` in the production topology (docs/operations.md "Metrics"): two web processes and a worker
count into one ``PROMETHEUS_MULTIPROC_DIR``; each web process answers for all of them, once."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
from asgiref.sync import sync_to_async
from django_tasks_db.models import DBTaskResult
from prometheus_client.parser import text_string_to_metric_families

from agentrun.core.models import Run, SuspendedToolCall
from agentrun.engine.agents import get_agent
from tests.system.test_processes import EMAIL, reviewer_token

pytestmark = [pytest.mark.system, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

SCRAPE_TOKEN = "scrape-me-please"


async def eventually(predicate, seconds: float = 30, what: str = "the condition"):  # noqa: ANN001, ANN201
    for _ in range(int(seconds / 0.05)):
        if value := await sync_to_async(predicate)():
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def scrape(port: int, token: str | None = SCRAPE_TOKEN) -> dict[tuple[str, tuple], float]:
    """Every sample of ``/metrics``: (name, sorted labels) → value."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def decide(port: int, token: str, run_id: str, tool_call_id: str, kind: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/agents/support-agent/runs/{run_id}/{kind}",
        data=json.dumps({"toolCallId": tool_call_id}).encode(),
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status


def route_count(samples: dict, route_end: str) -> float:
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == "agentrun_http_request_duration_seconds_count" and dict(labels)["route"].endswith(route_end)
    )


async def test_two_web_processes_and_a_worker_are_counted_once_whichever_is_scraped(processes, tmp_path):
    shared = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus"), "AGENTRUN_METRICS_TOKEN": SCRAPE_TOKEN}
    token = await reviewer_token()
    _, port_a = processes.daphne("web-a", env=shared)
    _, port_b = processes.daphne("web-b", env=shared)
    processes.worker("worker", interval=0.2, env=shared)

    runs = []
    for i in range(5):
        stream = await get_agent("support-agent").stream(EMAIL, memory={"thread": f"sys-metrics-{i}"})
        assert (await stream.collect())[-1]["payload"]["finishReason"] == "suspended"
        runs.append((stream.run_id, (await SuspendedToolCall.objects.aget(run_id=stream.run_id)).tool_call_id))
    risk = (await SuspendedToolCall.objects.aget(run_id=runs[0][0])).risk

    # Three approvals through web A, one decline through web B; one call left waiting.
    for run_id, call_id in runs[:3]:
        assert await sync_to_async(decide)(port_a, token, run_id, call_id, "approve") == 202
    assert await sync_to_async(decide)(port_b, token, *runs[3], "decline") == 202
    await eventually(
        lambda: Run.objects.filter(pk__in=[r for r, _ in runs[:4]], status="completed").count() == 4,
        what="the worker to carry out the four decisions",
    )
    # Tasks a busy machine queued twice (a recovery re-dispatch) are no-ops, but count until taken.
    await eventually(
        lambda: not DBTaskResult.objects.ready().filter(queue_name="default").exists(),
        what="the worker to take every task due",
    )

    agent_tool = (("agent", "support-agent"), ("tool", "send-email"))
    for port in (port_a, port_b):
        samples = await sync_to_async(scrape)(port)
        approve = ("agentrun_decisions_total", tuple(sorted((*agent_tool, ("kind", "approve"), ("via", "api")))))
        decline = ("agentrun_decisions_total", tuple(sorted((*agent_tool, ("kind", "decline"), ("via", "api")))))
        assert samples[approve] == 3  # counted by web A, seen from both
        assert samples[decline] == 1  # counted by web B, seen from both
        assert samples[("agentrun_time_to_decision_seconds_count", agent_tool)] == 4
        # Counted by the worker, which carried the decisions out: the runs it completed.
        completed = ("agentrun_runs_finished_total", (("agent", "support-agent"), ("status", "completed")))
        assert samples[completed] == 4
        assert samples[("agentrun_decision_latency_seconds_count", (("agent", "support-agent"),))] == 4
        # Read from the database by the scraped process: the call still waiting, the queues, the worker.
        assert samples[("agentrun_waiting_calls", (("agent", "support-agent"), ("risk", risk)))] == 1
        assert samples[("agentrun_task_queue_depth", (("queue", "default"),))] == 0
        assert samples[("agentrun_workers_alive", (("role", "worker"),))] == 1
        # Requests are counted by the process that served them, and seen from both.
        assert route_count(samples, "/approve") == 3
        assert route_count(samples, "/decline") == 1

    with pytest.raises(urllib.error.HTTPError) as refused:
        await sync_to_async(scrape)(port_a, token="not-the-token")
    assert refused.value.code == 401

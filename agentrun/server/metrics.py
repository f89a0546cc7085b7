"""``GET /metrics``: the Prometheus text format (docs/operations.md "Metrics", deploy/README.md).

Off (404) unless ``AGENTRUN_METRICS_TOKEN`` is set; then only ``Authorization: Bearer <that token>``
gets it (401 otherwise). Two sources, in one answer:

- what the processes counted (``agentrun.core.metrics``): with ``PROMETHEUS_MULTIPROC_DIR``, every
  process's files added up (``MultiProcessCollector``), so any web process answers for all of them on
  this machine; without it, this process's own registry;
- what the database knows, read once per scrape by the scraped process (``DatabaseCollector``): calls
  waiting (the ``WaitingCallCount`` counters, never a count of the calls), calls past their approval
  timeout, the oldest wait, task queues, workers alive. A few indexed queries whatever the volume.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count, Min, Sum
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from agentrun.core import workers
from agentrun.core.models import Snapshot, SuspendedToolCall, WaitingCallCount

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TASKS_DB_BACKEND = "django_tasks_db.DatabaseBackend"


def waiting_calls() -> dict[tuple[str, str], int]:
    """(agent, risk) → calls waiting for a person, from the counters."""
    rows = WaitingCallCount.objects.values("agent_id", "risk").annotate(n=Sum("calls")).order_by()
    return {(r["agent_id"], r["risk"]): r["n"] for r in rows if r["n"]}


def oldest_waits(agent_ids: list[str]) -> dict[str, float]:
    """agent → seconds its longest-waiting run has waited (one index lookup per agent)."""
    now = timezone.now()
    oldest = {}
    for agent_id in agent_ids:
        since = Snapshot.objects.filter(agent_id=agent_id).aggregate(m=Min("suspended_at"))["m"]
        if since is not None:
            oldest[agent_id] = (now - since).total_seconds()
    return oldest


def overdue_calls() -> dict[str, int]:
    """agent → open calls whose approval timeout has passed and that the sweep has not handled yet (on the
    partial index ``suspended_call_timeout``: only due calls are read)."""
    due = SuspendedToolCall.objects.filter(status=SuspendedToolCall.Status.OPEN, timeout_at__lte=timezone.now())
    rows = due.values("run__agent_id").annotate(n=Count("*")).order_by()
    return {r["run__agent_id"]: r["n"] for r in rows}


def task_queues() -> dict[str, tuple[int, float]]:
    """queue → (tasks due and not started, seconds the oldest of them has been due), with the database
    task backend (the embedded one keeps its tasks in memory: nothing to report)."""
    if settings.TASKS["default"]["BACKEND"] != TASKS_DB_BACKEND:
        return {}
    from django_tasks_db.models import DBTaskResult

    now = timezone.now()
    ready = DBTaskResult.objects.ready().order_by()  # READY, run_after passed: on the backend's partial index
    rows = ready.values("queue_name").annotate(n=Count("*"), since=Min("enqueued_at"))
    queues = {q: (0, 0.0) for q in settings.TASKS["default"].get("QUEUES", ["default"])}
    for row in rows:
        queues[row["queue_name"]] = (row["n"], max((now - row["since"]).total_seconds(), 0.0))
    return queues


class DatabaseCollector(Collector):
    """The gauges the database answers, read at each scrape."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        waiting = GaugeMetricFamily(
            "agentrun_waiting_calls", "Calls waiting for a person, by agent and risk.", labels=["agent", "risk"]
        )
        counts = waiting_calls()
        for (agent, risk), n in sorted(counts.items()):
            waiting.add_metric([agent, risk], n)
        yield waiting
        oldest = GaugeMetricFamily(
            "agentrun_oldest_wait_seconds", "How long the agent's longest-waiting run has waited.", labels=["agent"]
        )
        for agent, seconds in sorted(oldest_waits(sorted({a for a, _ in counts})).items()):
            oldest.add_metric([agent], seconds)
        yield oldest
        overdue = GaugeMetricFamily(
            "agentrun_calls_past_timeout",
            "Open calls whose approval timeout has passed (the sweep applies it within seconds).",
            labels=["agent"],
        )
        for agent, n in sorted(overdue_calls().items()):
            overdue.add_metric([agent], n)
        yield overdue
        depth = GaugeMetricFamily("agentrun_task_queue_depth", "Tasks due and not started.", labels=["queue"])
        age = GaugeMetricFamily(
            "agentrun_task_queue_oldest_seconds", "How long the oldest task due has waited.", labels=["queue"]
        )
        for queue, (n, seconds) in sorted(task_queues().items()):
            depth.add_metric([queue], n)
            age.add_metric([queue], seconds)
        yield depth
        yield age
        alive = GaugeMetricFamily(
            "agentrun_workers_alive", "Processes that swept recently (see /healthz), by role.", labels=["role"]
        )
        roles: dict[str, int] = {"worker": 0, "server": 0}
        for worker in workers.recent_workers():
            roles[worker["role"]] = roles.get(worker["role"], 0) + 1
        for role, n in sorted(roles.items()):
            alive.add_metric([role], n)
        yield alive


_database = CollectorRegistry(auto_describe=False)
_database.register(DatabaseCollector())


def exposition() -> bytes:
    """Every metric family, in the Prometheus text format."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        counted = CollectorRegistry(auto_describe=False)
        multiprocess.MultiProcessCollector(counted)
    else:
        counted = REGISTRY
    return generate_latest(counted) + generate_latest(_database)


def _authorized(request: HttpRequest, token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    token = settings.AGENTRUN_METRICS_TOKEN
    if not token:
        raise Http404("metrics are off (AGENTRUN_METRICS_TOKEN is not set)")
    if not _authorized(request, token):
        response = HttpResponse("Authorization: Bearer <AGENTRUN_METRICS_TOKEN> required\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE)


urlpatterns = [path("metrics", metrics_view, name="metrics")]

"""What this process counts for ``GET /metrics`` (docs/operations.md "Metrics"): Prometheus counters,
histograms and gauges of the official ``prometheus_client``.

Multiprocess mode: with ``PROMETHEUS_MULTIPROC_DIR`` set (``scripts/production.sh`` and the supervisor
set it and empty it at start), each process writes its values to files in that directory and any
process's ``/metrics`` adds up every process's files, so a decision made in one web process is counted
once whichever process is scraped. The variable must be set before this module is first imported
(``prometheus_client`` picks its mode then). Without it (the embedded default), one process, in memory.

What the database knows (calls waiting, queue depths, workers alive) is not counted here: the scraped
process reads it at scrape time (``agentrun.server.metrics``), once, whoever wrote it.

Counts follow commits: an increment is made when the transaction that recorded the fact commits
(``transaction.on_commit``; at once outside a transaction), so a rolled-back decision is not counted.
"""

from __future__ import annotations

import os
from datetime import datetime

from django.db import transaction
from django.utils import timezone

if multiproc_dir := os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.makedirs(multiproc_dir, exist_ok=True)

from prometheus_client import Counter, Gauge, Histogram  # noqa: E402 - after the directory exists

# How long a call waited for its decision, in seconds: the time-to-decision histogram's buckets, and the
# buckets of ``DecisionRollup.wait_bucket`` (frozen in migration 0012_operations: change both or neither).
WAIT_BUCKETS = (
    1,
    2,
    5,
    10,
    20,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    14400,
    28800,
    43200,
    86400,
    172800,
    604800,
)
# Who decided automatically (a policy, the system): not a person's time to decision.
AUTOMATIC_VIAS = frozenset({"system", "policy"})

DECISIONS = Counter(
    "agentrun_decisions", "Decisions recorded, by agent, tool, kind and via.", ["agent", "tool", "kind", "via"]
)
TIME_TO_DECISION = Histogram(
    "agentrun_time_to_decision_seconds",
    "From a call starting to wait to a person's decision on it.",
    ["agent", "tool"],
    buckets=WAIT_BUCKETS,
)
DECISION_LATENCY = Histogram(
    "agentrun_decision_latency_seconds",
    "From a decision to its continuation carrying it out (the continuation's first chunks).",
    ["agent"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
RUNS_FINISHED = Counter("agentrun_runs_finished", "Runs that reached a final status.", ["agent", "status"])
ESCALATIONS = Counter("agentrun_escalations", "Calls a timeout policy escalated to other reviewers.", ["agent", "tool"])
WEBHOOK_DELIVERIES = Counter(
    "agentrun_webhook_deliveries",
    "Webhook delivery attempts by outcome: delivered, retry (failed, attempted again), failed (gave up).",
    ["outcome"],
)
EMAIL_NOTICES = Counter(
    "agentrun_email_notices",
    "Emails to reviewers by outcome: sent, retry (failed, attempted again), failed (gave up).",
    ["outcome"],
)
WEBSOCKET_CONNECTIONS = Gauge(
    "agentrun_websocket_connections",
    "Websocket connections open, by route.",
    ["route"],
    multiprocess_mode="livesum",  # the live processes' sum: a dead process's connections are gone
)
HTTP_REQUEST_DURATION = Histogram(
    "agentrun_http_request_duration_seconds",
    "HTTP requests by route (the URL pattern), method and status class, until the response starts.",
    ["route", "method", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


def _after_commit(count: object) -> None:
    transaction.on_commit(count)  # type: ignore[arg-type]


def decision_recorded(
    *, agent_id: str, tool_name: str, kind: str, via: str, decided_at: datetime, waiting_since: datetime | None
) -> None:
    """A decision was written (in the caller's transaction): counted when it commits; a person's
    decision on a call that waited also gives its time to decision."""

    def count() -> None:
        DECISIONS.labels(agent_id, tool_name, kind, via).inc()
        if waiting_since is not None and via not in AUTOMATIC_VIAS:
            TIME_TO_DECISION.labels(agent_id, tool_name).observe(max((decided_at - waiting_since).total_seconds(), 0))

    _after_commit(count)


def continuation_started(*, agent_id: str, decided_at: datetime) -> None:
    """A continuation is carrying out a decision made at ``decided_at``."""
    DECISION_LATENCY.labels(agent_id).observe(max((timezone.now() - decided_at).total_seconds(), 0))


def run_finished(*, agent_id: str, status: str) -> None:
    _after_commit(lambda: RUNS_FINISHED.labels(agent_id, status).inc())


def escalated(*, agent_id: str, tool_name: str) -> None:
    _after_commit(lambda: ESCALATIONS.labels(agent_id, tool_name).inc())


def webhook_attempted(outcome: str) -> None:
    WEBHOOK_DELIVERIES.labels(outcome).inc()


def email_attempted(outcome: str, count: int = 1) -> None:
    EMAIL_NOTICES.labels(outcome).inc(count)

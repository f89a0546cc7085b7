"""Operations figures (docs/performance.md, docs/operations.md): the metrics page at N decisions, the
retention's prune batch and the reviewers' inbox with thousands of waiting threads. In the suite's
process, on its seeded database.

Decisions: N of them (the suite's N) are written once per seeded database in SQL (``INSERT … SELECT
generate_series``, 100,000 a statement, so the rollup trigger counts them as any writer's), spread over
5 agents, 8 tools and 90 days, waits from 1 s to ~6 h, kinds and vias mixed.
Pruning: ``PRUNE_EVENTS`` handled outbox events 40 days old are written, then the sweep's round
(``retention.prune_once``, a batch of ``AGENTRUN_PRUNE_BATCH`` a kind) is timed while they go, and once
nothing is due (the cost every sweep pays).
"""

from __future__ import annotations

import time

PRUNE_EVENTS = 20_000
CHUNK = 100_000

DECISIONS_SQL = """
INSERT INTO agentrun_decision (id, agent_id, thread_id, tool_call_id, tool_name, suspension, kind, edited_args,
    decided_by_username, via, decided_at, run_id, details, risk, waiting_since)
SELECT 'dec_bench_' || g, 'bench-agent-' || (g %% 5), 'bench-thread', 'bench-call-' || g, 'bench-tool-' || (g %% 8), 0,
    CASE g %% 10 WHEN 0 THEN 'decline' WHEN 1 THEN 'expire' ELSE 'approve' END,
    CASE WHEN g %% 13 = 0 THEN '{}'::jsonb END, 'bench',
    CASE g %% 7 WHEN 0 THEN 'api' WHEN 1 THEN 'link' WHEN 2 THEN 'policy' ELSE 'dashboard' END,
    d.at, %(run)s, CASE WHEN g %% 7 = 2 THEN '{"policy": "timeout"}'::jsonb END, 'medium',
    d.at - make_interval(secs => exp(((g::bigint * 7919) %% 1000) / 100.0))
FROM generate_series(%(start)s, %(stop)s) AS g,
     LATERAL (SELECT now() - make_interval(days => g %% 90, secs => g %% 86400) AS at) AS d
"""


INBOX_THREADS = 5_000


def _timed(fn, repeat: int) -> list[float]:  # noqa: ANN001
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(1000 * (time.perf_counter() - started))
    return samples


def seed_decisions(n: int, report=print) -> None:  # noqa: ANN001
    from django.db import connection

    from agentrun.core.models import Decision, Run

    have = Decision.objects.filter(decided_by_username="bench").count()
    run_id = Run.objects.values_list("id", flat=True).first()
    for start in range(have, n, CHUNK):
        stop = min(start + CHUNK, n) - 1
        with connection.cursor() as cursor:
            cursor.execute(DECISIONS_SQL, {"run": run_id, "start": start, "stop": stop})
        report(f"decisions: {stop + 1:,} of {n:,}")


def metrics_page(n: int, repeat: int, spread) -> dict:  # noqa: ANN001
    """The page's reads (``build_report``: the rollup, the counters, the longest waits) at N decisions."""
    from agentrun.core.models import DecisionRollup
    from approvals.metrics import build_report

    seed_decisions(n)
    build_report(hidden=frozenset(), days=30)  # warm up
    return {
        "metrics_page_30d": spread(_timed(lambda: build_report(hidden=frozenset(), days=30), repeat)),
        "metrics_page_90d": spread(_timed(lambda: build_report(hidden=frozenset(), days=90), repeat)),
        "rollup_rows": DecisionRollup.objects.count(),
    }


def prune(repeat: int, spread) -> dict:  # noqa: ANN001
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from agentrun.core import retention
    from agentrun.core.models import OutboxEvent

    old = timezone.now() - timedelta(days=40)
    OutboxEvent.objects.bulk_create(
        [
            OutboxEvent(type="run.completed", agent_id="bench", run_id="r", data={}, created_at=old, handled_at=old)
            for _ in range(PRUNE_EVENTS)
        ],
        batch_size=5000,
    )
    busy = _timed(retention.prune_once, min(repeat, PRUNE_EVENTS // settings.AGENTRUN_PRUNE_BATCH))
    retention.prune_all()
    idle = _timed(retention.prune_once, repeat)
    return {
        "prune_batch": spread(busy) | {"batch": settings.AGENTRUN_PRUNE_BATCH, "due": PRUNE_EVENTS},
        "prune_idle": spread(idle),
    }


def inbox_first_page(repeat: int, spread, username: str) -> dict:  # noqa: ANN001
    """The inbox's first page (``GET /approvals/``: view, selectors, template; Django's test client, so
    server time without the network) with the seeded runs spread over ``INBOX_THREADS`` threads (fewer
    if N is smaller). The spreading happens in a transaction that is rolled back afterwards."""
    from django.contrib.auth.models import User
    from django.db import connection, transaction
    from django.test import Client

    from agentrun.core.models import Run

    client = Client(HTTP_HOST="localhost")
    client.force_login(User.objects.get(username=username))
    threads = min(INBOX_THREADS, Run.objects.count())
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO agentrun_thread (id, resource_id, created_at, metadata) "
            "SELECT 'bench-inbox-' || t, NULL, now(), '{}'::jsonb FROM generate_series(0, %s) t",
            [threads - 1],
        )
        cursor.execute(
            "UPDATE agentrun_run r SET thread_id = 'bench-inbox-' || mod(o.n, %s) "
            "FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM agentrun_run) o WHERE r.id = o.id",
            [threads],
        )
        cursor.execute("ANALYZE agentrun_run")

        def get() -> None:
            response = client.get("/approvals/")
            assert response.status_code == 200, response.status_code
            assert f"of {threads:,} threads waiting".replace(",", "") in response.content.decode().replace(",", "")

        get()  # warm up
        cpu = time.process_time()
        samples = _timed(get, repeat)
        cpu = 1000 * (time.process_time() - cpu) / repeat  # this process's share: view and template
        transaction.set_rollback(True)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE agentrun_run")
    return {"inbox_first_page": spread(samples) | {"threads": threads, "python_cpu_ms": cpu}}

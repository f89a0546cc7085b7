"""N suspended runs on PostgreSQL, faithfully: one real run made by the engine, cloned in SQL.

The template is a ``support-agent`` run that suspended on ``send-email`` (run, steps, messages, chunk
log, snapshot, open call: every row the engine wrote). Clone ``g`` (1 … N-1) copies each of those rows
with the ids suffixed ``-g`` (inside JSON payloads too), every timestamp ``g`` seconds earlier, and the
run on thread ``bench-thread-<g mod N/10>`` (10 runs a thread) owned by ``bench-user-<thread mod
N/1000>`` (1,000 runs a resource). Rows are inserted by ``INSERT … SELECT … generate_series``, a batch a
transaction; the database's own triggers (the listing counters) see them like any insert.

One database per N (``<prefix>_<N>``), kept: a rerun finds it seeded (``bench_seed`` says so) and only
migrates it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

SEED_VERSION = 1
BATCH = 100_000
RUNS_PER_THREAD = 10
RUNS_PER_RESOURCE = 1_000
EMAIL_LINE = '/tool send-email {"to": "ann@example.com", "subject": "Your order", "body": "It shipped."}'


def database_name(prefix: str, n: int) -> str:
    return f"{prefix}_{n}"


def ensure_database(admin_url: str, name: str) -> bool:
    """Create the database unless it exists; True when it was created."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return False
        conn.execute(f'CREATE DATABASE "{name}"')
        return True


def drop_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def seeded(n: int) -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('bench_seed') IS NOT NULL")
        if not cursor.fetchone()[0]:
            return False
        cursor.execute("SELECT n, version FROM bench_seed")
        return cursor.fetchone() == (n, SEED_VERSION)


async def _template_run() -> str:
    from agentrun.engine.agents import get_agent

    stream = await get_agent("support-agent").stream(
        EMAIL_LINE, memory={"thread": "bench-thread-0", "resource": "bench-user-0"}
    )
    chunks = await stream.collect()
    assert chunks[-1]["payload"]["finishReason"] == "suspended", chunks[-1]
    return stream.run_id


def _models() -> list:
    from agentrun.core.models import Message, Run, RunChunk, RunStep, Snapshot, SuspendedToolCall

    return [Run, RunStep, Message, RunChunk, Snapshot, SuspendedToolCall]  # parents before children


def _template_ids(run_id: str) -> list[str]:
    """Every id of the template's rows, as it may appear in a column or a JSON payload."""
    from agentrun.core.models import Message, RunStep, SuspendedToolCall

    ids = [run_id]
    ids += RunStep.objects.filter(run_id=run_id).values_list("id", flat=True)
    ids += Message.objects.filter(run_id=run_id).values_list("id", flat=True)
    ids += SuspendedToolCall.objects.filter(run_id=run_id).values_list("tool_call_id", flat=True)
    return sorted(set(ids), key=len, reverse=True)  # longest first: no id is a prefix of a replaced one


def _select(model, ids: list[str], threads: int, resources: int) -> tuple[list[str], list[str]]:  # noqa: ANN001
    """The columns of ``model`` to insert and the expression of each, for clone ``g``."""
    from django.db import models

    from agentrun.core.models import Thread

    thread = f"'bench-thread-' || mod(g, {threads})"
    resource = f"'bench-user-' || mod(mod(g, {threads}), {resources})"
    columns, expressions = [], []
    for field in model._meta.concrete_fields:
        column = field.column
        if isinstance(field, models.AutoField):
            continue  # a new serial
        if isinstance(field, models.DateTimeField):
            expression = f"{column} - g * interval '1 second'"
        elif column == "thread_id" or (field.is_relation and field.related_model is Thread):
            expression = thread
        elif column == "resource_id":
            expression = resource
        elif isinstance(field, models.JSONField):
            text = f"{column}::text"
            for old in ids:
                text = f"replace({text}, '{old}', '{old}-' || g)"
            expression = f"({text})::jsonb"
        elif (
            (field.primary_key and isinstance(field, models.CharField))
            # A reference to one of agentrun's rows (text ids), not to a user (an integer).
            or (field.is_relation and isinstance(field.target_field, models.CharField))
            or column.endswith("tool_call_id")
            or column == "inner_run_id"
        ):
            expression = f"{column} || '-' || g"  # NULL stays NULL
        else:
            expression = column
        columns.append(column)
        expressions.append(expression)
    return columns, expressions


def seed(n: int, report: Callable[[str], None] = print) -> None:
    """Fill the configured (empty, migrated) PostgreSQL database with ``n`` suspended runs."""
    from django.db import connection, transaction

    from agentrun.core.models import Run

    started = time.perf_counter()
    template = asyncio.run(_template_run())
    ids = _template_ids(template)
    threads = max(1, n // RUNS_PER_THREAD)
    resources = max(1, n // RUNS_PER_RESOURCE)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO agentrun_thread (id, resource_id, created_at, metadata) "
            f"SELECT 'bench-thread-' || t, 'bench-user-' || mod(t, {resources}), now(), '{{}}'::jsonb "
            f"FROM generate_series(1, {threads - 1}) t"
        )
    for first in range(1, n, BATCH):
        last = min(n - 1, first + BATCH - 1)
        with transaction.atomic(), connection.cursor() as cursor:
            for model in _models():
                columns, expressions = _select(model, ids, threads, resources)
                key = "id" if model is Run else "run_id"
                cursor.execute(
                    f"INSERT INTO {model._meta.db_table} ({', '.join(columns)}) "
                    f"SELECT {', '.join(expressions)} FROM {model._meta.db_table} "
                    f"CROSS JOIN generate_series({first}, {last}) AS g WHERE {key} = %s",
                    [template],
                )
        report(f"  seeded {last + 1:,} of {n:,} runs ({time.perf_counter() - started:.0f} s)")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_seed (n bigint, version int)")
        cursor.execute("DELETE FROM bench_seed")
        cursor.execute("INSERT INTO bench_seed VALUES (%s, %s)", [n, SEED_VERSION])
    assert Run.objects.filter(status=Run.Status.SUSPENDED).count() == n

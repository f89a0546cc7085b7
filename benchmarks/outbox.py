"""Figures for the events outbox: what webhooks cost the engine per run, with and without a subscriber.

    .venv/bin/python benchmarks/outbox.py              # embedded default (SQLite)
    DATABASE_URL=postgres://… .venv/bin/python benchmarks/outbox.py --runs 300

Each mode runs in a fresh process on a throw-away database. A run here is a whole approval cycle
through the Python API: it suspends on send-email, is approved, and completes (three state changes:
run.suspended, toolcall.decided, run.completed). Counted: wall time per run and database queries per
run, every thread included. With a subscriber the delivery itself is left out (the enqueueing of
the event's handling is a no-op): the figure is what the engine pays, which is all that is on its path.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("nobody subscribes", "an endpoint subscribes to every event")


def count_queries() -> dict:
    from django.db import connections
    from django.db.backends.signals import connection_created

    counter = {"n": 0}
    lock = threading.Lock()

    def wrapper(execute, sql, params, many, context):  # noqa: ANN001, ANN202 - Django's signature
        with lock:
            counter["n"] += 1
        return execute(sql, params, many, context)

    def install(connection, **_):  # noqa: ANN001, ANN202
        connection.execute_wrappers.append(wrapper)

    connection_created.connect(install, weak=False)
    for connection in connections.all(initialized_only=True):
        install(connection)
    return counter


async def cycle(index: int) -> None:
    from agentrun.engine.agents import get_agent

    agent = get_agent("support-agent")
    line = '/tool send-email {"to": "ann@example.com", "subject": "s", "body": "b"}'
    stream = await agent.stream(line, memory={"thread": f"bench-outbox-{index}"})
    await stream.collect()
    continuation = await agent.approve_tool_call(run_id=stream.run_id)
    await continuation.collect()


def child(mode: str, runs: int) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)  # a PostgreSQL database is not thrown away
    from django.db import connection

    from agentrun.core.models import OutboxEvent, Run
    from notifications.delivery import notifier
    from notifications.models import WebhookEndpoint

    if mode == MODES[1]:
        WebhookEndpoint.objects.create(url="http://127.0.0.1:9/unused", secret="s")
        notifier.recorded = lambda event_id: None  # the engine's side only

    async def main() -> float:
        await cycle(-1)  # warm up: model, registry, connections
        started = time.perf_counter()
        for index in range(runs):
            await cycle(index)
        return time.perf_counter() - started

    counter = count_queries()
    before = counter["n"], OutboxEvent.objects.count()
    seconds = asyncio.run(main())
    queries, events = counter["n"] - before[0], OutboxEvent.objects.count() - before[1]
    assert Run.objects.filter(status="completed").count() == runs + 1
    print(
        f"{connection.vendor}, {mode}: {runs} approval cycles in {seconds:.2f} s = {1000 * seconds / runs:.1f} ms "
        f"per run; {queries / runs:.1f} queries and {events / runs:.0f} outbox rows per run"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--child", choices=MODES)
    parser.add_argument("--rounds", type=int, default=1, help="each mode this many times, alternately")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.runs)
        return
    for mode in MODES * args.rounds:
        with tempfile.TemporaryDirectory() as data:
            env = dict(os.environ, AGENTRUN_DATA_DIR=data, AGENTRUN_EMBEDDED_SWEEPER="0", PYTHONPATH=str(ROOT))
            subprocess.run([sys.executable, __file__, "--child", mode, "--runs", str(args.runs)], env=env, check=True)


if __name__ == "__main__":
    main()

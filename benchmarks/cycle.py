"""Figures for the decision cycle: suspend → approve → complete, in-process, through the Python API.

    .venv/bin/python benchmarks/cycle.py                       # embedded default (SQLite, throw-away)
    DATABASE_URL=postgres://… .venv/bin/python benchmarks/cycle.py --cycles 50
    .venv/bin/python benchmarks/cycle.py --sql                 # print the statements of one cycle
    .venv/bin/python benchmarks/cycle.py --profile docs/profiles/cycle-sqlite.txt   # where the CPU goes

A cycle is what a user of the Python API does: ``stream()`` a run that calls ``send-email`` and reads it
until it suspends (the *suspend* phase), then ``approve_tool_call()`` and reads the continuation until the
run has completed (the *approve + complete* phase). A phase's time ends with its last chunk read; its
statements include the segment's tail after that (last flush, lease release). Statements are counted
on every database connection (the continuation runs on asgiref's database thread), relay reads
included: all of it is on the user's path. ``measure_cycle(n)`` is the function the benchmark suite
calls.

On PostgreSQL the named database is flushed first: point DATABASE_URL at a throw-away database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EMAIL_LINE = '/tool send-email {"to": "ann@example.com", "subject": "Your order", "body": "It shipped."}'


class StatementLog:
    """Every SQL statement run on any connection of this process while ``recording`` (thread-safe)."""

    def __init__(self) -> None:
        self.statements: list[str] = []
        self.recording = False
        self._lock = threading.Lock()

    def __call__(self, execute, sql, params, many, context):  # noqa: ANN001, ANN204 - Django's wrapper signature
        if self.recording:
            with self._lock:
                self.statements.append(sql)
        return execute(sql, params, many, context)

    def install_here(self) -> None:
        """Also count on the connections this thread has already opened (run it on asgiref's database
        thread, ``await db(log.install_here)()``: the engine's connection there may predate the log)."""
        from django.db import connections

        for connection in connections.all(initialized_only=True):
            if self not in connection.execute_wrappers:
                connection.execute_wrappers.append(self)

    def uninstall_here(self) -> None:
        from django.db import connections

        for connection in connections.all(initialized_only=True):
            if self in connection.execute_wrappers:
                connection.execute_wrappers.remove(self)

    @contextmanager
    def phase(self) -> Iterator[list[str]]:
        """The statements run inside the block."""
        captured: list[str] = []
        with self._lock:
            start = len(self.statements)
        self.recording = True
        try:
            yield captured
        finally:
            self.recording = False
            with self._lock:
                captured.extend(self.statements[start:])


@contextmanager
def statement_log() -> Iterator[StatementLog]:
    """Install a ``StatementLog`` on this thread's connections and every new one, for the block's duration."""
    from django.db.backends.signals import connection_created

    log = StatementLog()

    def install(connection, **_):  # noqa: ANN001, ANN202 - the signal's signature
        if log not in connection.execute_wrappers:
            connection.execute_wrappers.append(log)

    connection_created.connect(install, weak=False)
    log.install_here()
    try:
        yield log
    finally:
        connection_created.disconnect(install)
        # Connections of other threads keep the (inert) wrapper until they close; this thread's go now.
        log.uninstall_here()


async def _settled() -> None:
    """Wait for the work a phase left running after its last chunk reached the reader (the segment's last
    flush and lease release), so that its statements count in that phase and not in the next one."""
    from agentrun.engine import runtime, stream

    current, loop = asyncio.current_task(), asyncio.get_running_loop()
    # This loop's work only: the notifications queue's tasks run on a loop of their own (detached).
    pending = [
        t for t in (*stream._producers, *runtime._tasks) if t is not current and not t.done() and t.get_loop() is loop
    ]
    await asyncio.gather(*pending, return_exceptions=True)


async def one_cycle(log: StatementLog, index: int) -> dict:
    """One cycle; its phases' wall times (ms) and statements."""
    from agentrun.engine.agents import get_agent

    agent = get_agent("support-agent")
    cpu_started = time.process_time()
    started = time.perf_counter()
    with log.phase() as suspend_sql:
        stream = await agent.stream(EMAIL_LINE, memory={"thread": f"bench-cycle-{index}", "resource": "bench-user"})
        await stream.collect()
        suspended = time.perf_counter()
        await _settled()
    assert await stream.finish_reason == "suspended", await stream.finish_reason
    with log.phase() as approve_sql:
        approving = time.perf_counter()
        continuation = await agent.approve_tool_call(run_id=stream.run_id)
        await continuation.collect()
        finished = time.perf_counter()
        await _settled()
    cpu = time.process_time() - cpu_started
    assert await continuation.finish_reason == "stop", await continuation.finish_reason
    return {
        "cpu_ms": 1000 * cpu,
        "suspend_ms": 1000 * (suspended - started),
        "approve_complete_ms": 1000 * (finished - approving),
        "cycle_ms": 1000 * (suspended - started + finished - approving),
        "suspend_sql": suspend_sql,
        "approve_complete_sql": approve_sql,
    }


def _spread(values: list[float]) -> dict:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"median": round(statistics.median(ordered), 2), "p95": round(p95, 2)}


def measure_cycle(n: int = 50, *, keep_sql: bool = False) -> dict:
    """``n`` cycles after one warm-up, on the configured database (Django set up, migrations applied).

    Returns ``{"vendor", "cycles", "cycle_ms", "suspend_ms", "approve_complete_ms", "cpu_ms", "statements"}``:
    each ``*_ms`` a ``{"median", "p95"}`` (``cpu_ms``: this process's CPU time for a cycle, every thread,
    the database server's excluded: what the load of the machine moves least); ``statements`` the median
    count per phase (``suspend``, ``approve_complete``, ``cycle``), plus ``sql`` (the last cycle's
    statements) when ``keep_sql``.
    Must not be called from a running event loop.
    """
    from django.db import connection

    from agentrun.engine.runtime import db

    async def cycles(log: StatementLog) -> list[dict]:
        await db(log.install_here)()
        try:
            await one_cycle(log, -1)  # warm up: model, registry, connections
            return [await one_cycle(log, i) for i in range(n)]
        finally:
            await db(log.uninstall_here)()

    with statement_log() as log:
        results = asyncio.run(cycles(log))
    suspend = [len(r["suspend_sql"]) for r in results]
    approve = [len(r["approve_complete_sql"]) for r in results]
    figures = {
        "vendor": connection.vendor,
        "cycles": n,
        **{
            key: _spread([r[key] for r in results])
            for key in ("cycle_ms", "suspend_ms", "approve_complete_ms", "cpu_ms")
        },
        "statements": {
            "suspend": round(statistics.median(suspend)),
            "approve_complete": round(statistics.median(approve)),
            "cycle": round(statistics.median([s + a for s, a in zip(suspend, approve, strict=True)])),
        },
    }
    if keep_sql:
        last = results[-1]
        figures["sql"] = {"suspend": last["suspend_sql"], "approve_complete": last["approve_complete_sql"]}
    return figures


# Where a profile's self time goes, by the file a function is in (first match wins).
PROFILE_CATEGORIES = [
    ("Django ORM (querysets, compiling, model instances)", ("django/db/models",)),
    ("database driver and Django's cursor (SQL, adapting values)", ("sqlite3", "psycopg", "django/db/backends")),
    ("waiting for the database thread (event loop poll)", ("select.epoll", "selectors.py")),
    (
        "thread hops (asgiref, futures, locks, queues, the loop's self-pipe)",
        ("asgiref", "concurrent/futures", "threading.py", "queue", "_socket.socket", "contextvars"),
    ),
    ("asyncio", ("asyncio",)),
    ("Django templates (the reviewers' feed fragment)", ("django/template",)),
    ("Django, other", ("django/",)),
    ("agentrun.core.fanout (relaying stream, reviewers' feed)", ("agentrun/core/fanout",)),
    ("agentrun, other", ("agentrun/",)),
    ("JSON", ("json",)),
    ("audit receipts (Ed25519, RFC 8785)", ("rfc8785", "cryptography", "hashlib", "_sha")),
    ("Python builtins (getattr, isinstance, …)", ("~:<built-in", "~:<method")),
]


def profile_report(stats: object, cycles: int) -> str:
    """A ``pstats.Stats`` as text: self time per cycle by category, trips to the database thread,
    and the functions with the most cumulative time."""
    import io
    import pstats

    assert isinstance(stats, pstats.Stats)
    raw: dict = stats.stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, callers)}
    by_category: dict[str, float] = {}
    total = 0.0
    trips = 0
    for (file, _line, name), (_cc, calls, tottime, _ct, _callers) in raw.items():
        where = f"{file}:{name}"
        category = next((c for c, marks in PROFILE_CATEGORIES if any(m in where for m in marks)), "other")
        by_category[category] = by_category.get(category, 0.0) + tottime
        total += tottime
        if file.endswith("asgiref/sync.py") and name == "thread_handler":
            trips += calls
    lines = [f"self time per cycle by category ({cycles} cycles, {1000 * total / cycles:.2f} ms profiled a cycle):"]
    for category, seconds in sorted(by_category.items(), key=lambda item: -item[1]):
        lines.append(f"  {1000 * seconds / cycles:7.2f} ms  {100 * seconds / total:5.1f}%  {category}")
    lines.append(f"trips to asgiref's database thread a cycle: {trips / cycles:.1f}")
    out = io.StringIO()
    stats.stream = out  # type: ignore[attr-defined]
    stats.sort_stats("cumulative").print_stats(60)
    lines += ["", "# top functions by cumulative time (every thread)", out.getvalue()]
    return "\n".join(lines)


def profile_cycles(n: int, path: str) -> None:
    """``n`` cycles (after a warm-up) under cProfile, which on Python 3.12 sees every thread; the
    report (``profile_report``) written to ``path``."""
    import cProfile
    import pstats

    measure_cycle(5)  # warm up
    profiler = cProfile.Profile()
    profiler.enable()
    figures = measure_cycle(n)
    profiler.disable()
    from django.db import connection

    header = (
        f"# cProfile of benchmarks/cycle.py --profile ({n} cycles after a warm-up), {connection.vendor}; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; profiled CPU a cycle "
        f"{figures['cpu_ms']['median']} ms (median; cProfile slows everything down)\n"
    )
    Path(path).write_text(header + profile_report(pstats.Stats(profiler), n + 1) + "\n")


def _setup() -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)  # a PostgreSQL database is not thrown away


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--sql", action="store_true", help="print the statements of the last cycle")
    parser.add_argument("--profile", metavar="FILE", help="profile the cycles (cProfile) and write a report to FILE")
    args = parser.parse_args()
    if "DATABASE_URL" not in os.environ and "AGENTRUN_DATA_DIR" not in os.environ:
        # The embedded default on a throw-away SQLite file, in a child process that owns it.
        with tempfile.TemporaryDirectory() as data:
            env = dict(os.environ, AGENTRUN_DATA_DIR=data, PYTHONPATH=str(ROOT))
            subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env, check=True)
        return
    os.environ.setdefault("AGENTRUN_EMBEDDED_SWEEPER", "0")
    sys.path.insert(0, str(ROOT))
    _setup()
    if args.profile:
        profile_cycles(args.cycles, str(Path(args.profile).resolve()))
        return
    figures = measure_cycle(args.cycles, keep_sql=args.sql)
    if args.sql:
        for phase, statements in figures.pop("sql").items():
            print(f"--- {phase}: {len(statements)} statements")
            for sql in statements:
                print("   ", sql[:220])
    s = figures["statements"]
    from benchmarks.machine import describe

    print(
        f"[{describe()}, load average {os.getloadavg()[0]:.2f}] "
        f"{figures['vendor']}: {args.cycles} cycles, suspend → approve → complete: "
        f"median {figures['cycle_ms']['median']} ms (p95 {figures['cycle_ms']['p95']}), "
        f"CPU {figures['cpu_ms']['median']} ms (p95 {figures['cpu_ms']['p95']}); "
        f"suspend {figures['suspend_ms']['median']} ms / {s['suspend']} statements, "
        f"approve + complete {figures['approve_complete_ms']['median']} ms / {s['approve_complete']} statements"
    )


if __name__ == "__main__":
    main()

"""Throughput of the whole topology: decisions per second end to end, approve over REST → run completed.

    .venv/bin/python benchmarks/topology.py                      # 200 runs a round, 2 then 3 workers
    .venv/bin/python benchmarks/topology.py --runs 400 --workers 2 3 --clients 8 --json figures.json
    .venv/bin/python benchmarks/topology.py --profile docs/profiles     # + py-spy flame graphs (pip install py-spy)

The production topology on PostgreSQL + Redis: two daphne servers (web A, web B) and ``--workers``
``manage.py agentrun_worker`` processes on the tasks database backend, a Redis channel layer. In a
database of its own (``<BENCH_DB_PREFIX>_topology``, dropped at the end), ``benchmarks/seed.py`` clones
a suspended ``support-agent`` run (waiting on ``send-email``) once per decision to make; then, for each
worker count, the processes are started, a few runs are approved to warm them up, and ``--runs`` runs are
approved by ``--clients`` concurrent REST clients (keep-alive, a ``Reviewers`` token, half of them on
each server). The round ends when every one of them has completed (its ``completed_at``, written by a
worker's continuation): decisions/s = runs / (last ``completed_at`` − first approve sent).

CPU: each process's user + system time over the round (``/proc/<pid>/stat``), grouped as web (both
daphnes), workers, PostgreSQL (the backends connected to this database: ``pg_stat_activity``), Redis
(``redis-server``: shared with whatever else uses that server) and the client (this process); in cores
(CPU seconds per second of the round) and in CPU ms per decision. The machine's busy time over the round
(``/proc/stat``, every process) and the load average say how much else ran meanwhile.

Environment as ``benchmarks/suite.py``: ``BENCH_PG`` (or ``DATABASE_URL``), ``BENCH_REDIS_URL`` (or
``REDIS_URL``), ``BENCH_DB_PREFIX``. A benchmark, not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.seed import drop_database, ensure_database, seed  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
WARM_UP = 10
GROUPS = ("web", "worker", "postgres", "redis", "client")


def _url(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(("postgresql", parts.netloc, f"/{dbname}", "", ""))


# --- CPU from /proc ----------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads); None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15 of stat(5))


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / TICK, sum(values) / TICK


def redis_pids() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "comm").read_text().strip() == "redis-server":
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def postgres_pids(dbname: str) -> list[int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [dbname])
        return [row[0] for row in cursor.fetchall()]


class CpuMeter:
    """CPU seconds per group between ``start()`` and ``stop()``; a process first seen at the stop (a
    pooled connection opened during the round) counts whole."""

    def __init__(self, groups: dict[str, list[int]], dbname: str) -> None:
        self.groups = groups
        self.dbname = dbname

    def _sample(self) -> dict[str, dict[int, float]]:
        groups = {**self.groups, "postgres": postgres_pids(self.dbname), "redis": redis_pids()}
        sample = {name: {pid: cpu_seconds(pid) for pid in pids} for name, pids in groups.items()}
        return {name: {pid: s for pid, s in pids.items() if s is not None} for name, pids in sample.items()}

    def start(self) -> None:
        self.before = self._sample()
        self.client_before = time.process_time()
        self.machine_before = machine_busy()
        self.wall_before = time.perf_counter()

    def stop(self) -> dict:
        after = self._sample()
        wall = time.perf_counter() - self.wall_before
        used = {
            name: sum(s - self.before.get(name, {}).get(pid, 0.0) for pid, s in pids.items())
            for name, pids in after.items()
        }
        used["client"] = time.process_time() - self.client_before
        busy, total = machine_busy()
        machine = {
            "busy_cores": (busy - self.machine_before[0]) / wall,
            "cores": os.cpu_count(),
            "total_cores": (total - self.machine_before[1]) / wall,
        }
        return {"seconds": used, "wall": wall, "machine": machine}


# --- one round ---------------------------------------------------------------------------------------
def _approve(session, url: str) -> tuple[float, float]:  # noqa: ANN001 - a requests.Session
    started = time.perf_counter()
    sent = time.time()
    answer = session.post(url, json={})
    assert answer.status_code == 202, answer.text[:300]
    return sent, 1000 * (time.perf_counter() - started)


def _wait_completed(run_ids: list[str], timeout: float = 300) -> float:
    """The last ``completed_at`` (epoch seconds) once every run has completed."""
    from django.db.models import Max

    from agentrun.core.models import Run

    runs = Run.objects.filter(pk__in=run_ids)
    give_up = time.monotonic() + timeout
    while runs.exclude(status=Run.Status.COMPLETED).exists():
        if time.monotonic() > give_up:
            left = runs.exclude(status=Run.Status.COMPLETED).count()
            raise RuntimeError(f"{left} of {len(run_ids)} runs not completed after {timeout:.0f} s")
        time.sleep(0.05)
    return runs.aggregate(last=Max("completed_at"))["last"].timestamp()


def _profilers(targets: dict[str, int], where: Path | None) -> list:
    """``py-spy record`` (``pip install py-spy``) on each target process, a flame graph each in ``where``."""
    import shutil
    import subprocess

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if where is None or not Path(spy).exists():
        return []
    where.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(pid),
                "--rate",
                "250",
                "--nonblocking",
                "--output",
                str(where / f"{name}.svg"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in targets.items()
    ]


def _stop_profilers(profilers: list) -> None:
    import signal

    for spy in profilers:
        spy.send_signal(signal.SIGINT)  # py-spy writes its flame graph when interrupted
    for spy in profilers:
        spy.wait(timeout=60)


def one_round(
    env: dict[str, str],
    token: str,
    dbname: str,
    run_ids: list[str],
    workers: int,
    clients: int,
    profile: Path | None = None,
) -> dict:
    import threading

    import requests

    from tests.helpers.system import Processes

    warm, measured = run_ids[:WARM_UP], run_ids[WARM_UP:]
    with tempfile.TemporaryDirectory() as logs:
        procs = Processes(env, Path(logs))
        try:
            web_a, port_a = procs.daphne("web-a")
            web_b, port_b = procs.daphne("web-b")
            worker_procs = [procs.worker(f"worker-{i}", interval=1) for i in range(workers)]
            local = threading.local()

            def approve(i_run: tuple[int, str]) -> tuple[float, float]:
                if not hasattr(local, "session"):
                    local.session = requests.Session()
                    local.session.headers["Authorization"] = f"Token {token}"
                i, run_id = i_run
                port = port_a if i % 2 else port_b
                return _approve(
                    local.session, f"http://127.0.0.1:{port}/api/agents/support-agent/runs/{run_id}/approve"
                )

            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(approve, enumerate(warm)))
                _wait_completed(warm)
                meter = CpuMeter(
                    {"web": [web_a.pid, web_b.pid], "worker": [p.pid for p in worker_procs]},
                    dbname,
                )
                targets = {f"{workers}-workers-web-a": web_a.pid, f"{workers}-workers-worker-0": worker_procs[0].pid}
                profilers = _profilers(targets, profile)
                load_before = os.getloadavg()
                meter.start()
                answers = list(pool.map(approve, enumerate(measured)))
                last = _wait_completed(measured)
                cpu = meter.stop()
                load_after = os.getloadavg()
                _stop_profilers(profilers)
        except BaseException:
            for log in sorted(Path(logs).glob("*.log")):
                print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
        finally:
            procs.stop()
    first = min(sent for sent, _ in answers)
    elapsed = last - first
    n = len(measured)
    seconds = cpu["seconds"]
    return {
        "workers": workers,
        "clients": clients,
        "decisions": n,
        "elapsed_s": elapsed,
        "decisions_per_s": n / elapsed,
        "approve_ms": {
            "median": statistics.median(ms for _, ms in answers),
            "p95": sorted(ms for _, ms in answers)[round(0.95 * (n - 1))],
        },
        "cpu_cores": {name: seconds.get(name, 0.0) / cpu["wall"] for name in GROUPS},
        "cpu_ms_per_decision": {name: 1000 * seconds.get(name, 0.0) / n for name in GROUPS},
        "machine": cpu["machine"],
        "load": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
    }


def bottleneck(r: dict) -> str:
    """The group that used the most CPU per decision, and whether the machine's cores were full."""
    per = r["cpu_ms_per_decision"]
    top = max(("web", "worker", "postgres"), key=per.get)
    cores = r["cpu_cores"]
    full = r["machine"]["busy_cores"] >= 0.9 * r["machine"]["cores"]
    # One worker drives one continuation at a time: workers near one core each are saturated.
    workers_busy = cores["worker"] / r["workers"]
    return (
        f"{top} ({per[top]:.1f} CPU ms a decision; workers {workers_busy:.2f} cores each; "
        f"machine {r['machine']['busy_cores']:.2f} of {r['machine']['cores']} cores busy" + (", full)" if full else ")")
    )


def measure_topology(
    pg: str, redis: str, prefix: str, *, runs: int, workers: list[int], clients: int, profile: Path | None = None
) -> dict:
    """Every round in a fresh database; Django is set up here on it."""
    admin = _url(pg, "postgres")
    dbname = f"{prefix}_topology"
    drop_database(admin, dbname)
    ensure_database(admin, dbname)
    os.environ |= {"DATABASE_URL": _url(pg, dbname), "AGENTRUN_EMBEDDED_SWEEPER": "0", "SECRET_KEY": "bench"}
    os.environ.pop("REDIS_URL", None)  # seeding: in-memory layer, in-process tasks
    os.environ.pop("AGENTRUN_TASK_BACKEND", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    from agentrun.core.models import Snapshot
    from benchmarks.suite import reviewer_token

    try:
        call_command("migrate", verbosity=0)
        per_round = runs + WARM_UP
        seed(per_round * len(workers), report=lambda line: print(line, file=sys.stderr))
        token = reviewer_token()
        run_ids = list(
            Snapshot.objects.filter(agent_id="support-agent").order_by("run_id").values_list("run_id", flat=True)
        )
        env = dict(
            os.environ,
            REDIS_URL=redis,
            AGENTRUN_TASK_BACKEND="django_tasks_db.DatabaseBackend",
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
        )
        rounds = []
        for i, count in enumerate(workers):
            ids = run_ids[i * per_round : (i + 1) * per_round]
            result = one_round(env, token, dbname, ids, count, clients, profile)
            result["bottleneck"] = bottleneck(result)
            rounds.append(result)
            print(describe(result), file=sys.stderr)
    finally:
        connections.close_all()
        drop_database(admin, dbname)
    return {"rounds": rounds}


def describe(r: dict) -> str:
    cores = ", ".join(f"{name} {r['cpu_cores'][name]:.2f}" for name in GROUPS)
    per = ", ".join(f"{name} {r['cpu_ms_per_decision'][name]:.1f}" for name in GROUPS)
    return (
        f"2 web + {r['workers']} workers, {r['clients']} clients: {r['decisions_per_s']:.0f} decisions/s "
        f"({r['decisions']} in {r['elapsed_s']:.2f} s; approve answered in {r['approve_ms']['median']:.1f} ms, "
        f"p95 {r['approve_ms']['p95']:.1f}); cores: {cores}; CPU ms a decision: {per}; "
        f"bottleneck: {r['bottleneck']}; load {r['load']['before'][0]} → {r['load']['after'][0]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_TOPOLOGY_RUNS", 200)))
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--profile", type=Path, help="flame graphs (py-spy) of web A and a worker, in this folder")
    args = parser.parse_args()
    pg = os.environ.get("BENCH_PG") or os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
    if not pg.startswith(("postgres://", "postgresql://")):
        pg = "postgres://postgres@127.0.0.1:5432/postgres"
    redis = os.environ.get("BENCH_REDIS_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    prefix = os.environ.get("BENCH_DB_PREFIX", "agentrun_bench")
    figures = measure_topology(
        pg, redis, prefix, runs=args.runs, workers=args.workers, clients=args.clients, profile=args.profile
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

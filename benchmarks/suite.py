"""The benchmark suite (issue 12): one table of figures, measured the way a user meets them.

    make bench                         # N = 10,000 suspended runs
    BENCH_N=1000000 make bench         # the big one (seeding takes a while, once)
    .venv/bin/python benchmarks/suite.py --n 10000 --json figures.json

PostgreSQL and Redis, as in production. The N suspended runs are seeded once per N in a database of
their own (``benchmarks/seed.py``: a real run cloned in SQL), kept for reruns. The REST and websocket
rows go through real processes: two daphne servers (web A, web B) and an ``agentrun_worker``, on the
tasks database backend and a Redis channel layer, with keep-alive HTTP and real sockets from this
process. The decision cycle is measured in-process (``benchmarks/cycle.py``) on a throw-away database of
each vendor. Benchmarks are figures, not tests: nothing here passes or fails (the smoke test in
tests/system/test_benchmarks.py only checks that every row gets a number).

Environment: ``BENCH_N``; ``BENCH_PG`` (a PostgreSQL URL: its server is used, default
``DATABASE_URL``'s or the local one); ``BENCH_DB_PREFIX`` (``agentrun_bench``); ``BENCH_REDIS_URL``
(default ``REDIS_URL``); ``BENCH_REPEAT``, ``BENCH_LATENCY_RUNS``, ``BENCH_WORDS``, ``BENCH_CYCLES``
(sample sizes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import machine, operations, queries  # noqa: E402
from benchmarks.seed import EMAIL_LINE, database_name, drop_database, ensure_database, seed, seeded  # noqa: E402

REFERENCE_N = 10_000
UNPAGED_RUNS = 50_000
SUBSCRIBERS = 10
PAGE = {"perPage": "20", "page": "0"}  # "the first page" everywhere below
ORIGIN = {"origin": "http://localhost"}


def spread(values: list[float]) -> dict:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"median": statistics.median(ordered), "p95": p95, "n": len(ordered)}


def timed(fn, repeat: int) -> dict:  # noqa: ANN001 - any callable
    fn()  # warm up
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(1000 * (time.perf_counter() - started))
    return spread(samples)


def server_url(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(("postgresql", parts.netloc, f"/{dbname}", "", ""))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- in-process ----------------------------------------------------------------------------------
def python_listing(repeat: int) -> dict:
    from agentrun.core.selectors import list_suspended_runs

    return {
        "python_unfiltered": timed(
            lambda: list_suspended_runs(agent_id="support-agent", per_page=PAGE["perPage"], page=PAGE["page"]), repeat
        )
    }


def reviewer_token() -> str:
    from django.contrib.auth.models import Group, User
    from rest_framework.authtoken.models import Token

    from agentrun.core.access import REVIEWERS, ensure_groups

    ensure_groups()
    user, _ = User.objects.get_or_create(username="bench-reviewer")
    user.groups.add(Group.objects.get(name=REVIEWERS))
    return Token.objects.get_or_create(user=user)[0].key


# --- through the processes -----------------------------------------------------------------------
class Topology:
    """Production topology: web A and web B (daphne) and a worker, on this database and Redis."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        from tests.helpers.system import Processes

        self.procs = Processes(env, logdir)

    def __enter__(self) -> Topology:
        self.a, self.port_a = self.procs.daphne("web-a")
        self.b, self.port_b = self.procs.daphne("web-b")
        self.procs.worker("worker", interval=1)
        return self

    def __exit__(self, *exc: object) -> None:
        self.procs.stop()


def rest_listing(top: Topology, token: str, repeat: int) -> dict:
    import requests

    from agentrun.core.models import Snapshot

    newest = Snapshot.objects.filter(agent_id="support-agent").order_by("-created_at", "-run_id").first()
    base = f"http://127.0.0.1:{top.port_a}/api/agents/support-agent/suspended-runs"
    with requests.Session() as http:
        http.headers["Authorization"] = f"Token {token}"

        def get(params: dict, url: str = base) -> None:
            response = http.get(url, params=params)
            assert response.status_code == 200, response.text[:300]

        return {
            "rest_floor": timed(lambda: get({}, f"http://127.0.0.1:{top.port_a}/api/agents/"), repeat),
            "rest_unfiltered": timed(lambda: get(PAGE), repeat),
            "rest_thread": timed(lambda: get({**PAGE, "threadId": newest.thread_id}), repeat),
            "rest_resource": timed(lambda: get({**PAGE, "resourceId": newest.resource_id}), repeat),
        }


def rest_unpaged(top: Topology, token: str, n: int) -> dict:
    """The unpaged listing of min(N, 50k) runs (a fromDate bound picks the newest): first byte, total, RSS."""
    import requests

    from agentrun.core.models import Snapshot
    from agentrun.core.timeutil import iso

    matching = min(n, UNPAGED_RUNS)
    bound = (
        Snapshot.objects.filter(agent_id="support-agent")
        .order_by("-created_at", "-run_id")
        .values_list("created_at", flat=True)[matching - 1]
    )
    url = f"http://127.0.0.1:{top.port_a}/api/agents/support-agent/suspended-runs"
    before = rss_mib(top.a.pid)
    peak = {"rss": before}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak["rss"] = max(peak["rss"], rss_mib(top.a.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    body = bytearray()
    started = time.perf_counter()
    with requests.get(
        url, params={"fromDate": iso(bound)}, headers={"Authorization": f"Token {token}"}, stream=True
    ) as r:
        assert r.status_code == 200, r.text[:300]
        first = None
        for piece in r.raw.stream(65536, decode_content=True):
            first = first or time.perf_counter()
            body += piece
    total = time.perf_counter() - started
    done.set()
    sampler.join()
    page = json.loads(body)
    time.sleep(0.5)
    return {
        "unpaged": {
            "runs": len(page["runs"]),
            "total_field": page["total"],
            "first_byte_ms": 1000 * (first - started),
            "total_s": total,
            "rss_peak_growth_mib": peak["rss"] - before,
            "rss_kept_mib": rss_mib(top.a.pid) - before,
        }
    }


async def _frames(ws, until_finish: bool = True) -> list[tuple[float, dict]]:  # noqa: ANN001
    frames = []
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
        frames.append((time.perf_counter(), frame))
        assert frame.get("type") != "error", frame
        if until_finish and frame["type"] == "finish":
            return frames


async def approve_latency(top: Topology, token: str, runs: int) -> dict:
    """Approve over REST on web B → the first continuation chunk on a ws/runs subscriber on web A."""
    import requests
    import websockets

    http_a, http_b = requests.Session(), requests.Session()
    for http in (http_a, http_b):
        http.headers["Authorization"] = f"Token {token}"
    samples = []
    for i in range(runs + 1):  # the first is a warm-up
        body = {"messages": EMAIL_LINE, "memory": {"thread": f"bench-live-{uuid.uuid4().hex}"}}
        made = await asyncio.to_thread(
            http_a.post, f"http://127.0.0.1:{top.port_a}/api/agents/support-agent/generate", json=body
        )
        assert made.status_code == 200 and made.json()["status"] == "suspended", made.text[:300]
        run_id = made.json()["runId"]
        url = f"ws://127.0.0.1:{top.port_a}/ws/runs/{run_id}/?after=0&token={token}"
        async with websockets.connect(url, additional_headers=ORIGIN) as ws:
            replay = await _frames(ws)  # up to the finish of the suspension: live from here
            assert replay[-1][1]["payload"]["finishReason"] == "suspended"
            reader = asyncio.create_task(_frames(ws))
            started = time.perf_counter()
            answer = await asyncio.to_thread(
                http_b.post, f"http://127.0.0.1:{top.port_b}/api/agents/support-agent/runs/{run_id}/approve", json={}
            )
            assert answer.status_code == 202, answer.text[:300]
            continuation = await reader
            assert continuation[-1][1]["payload"]["finishReason"] == "stop", continuation[-1]
        if i:
            samples.append(1000 * (continuation[0][0] - started))
    http_a.close()
    http_b.close()
    return {"approve_to_chunk": spread(samples)}


async def fanout(top: Topology, token: str, words: int) -> dict:
    """A run of ``words`` text-delta chunks to 10 ws/runs subscribers, half on each server."""
    import websockets

    from agentrun.core.models import Run

    text = " ".join(f"w{i}" for i in range(words))
    driver_url = f"ws://127.0.0.1:{top.port_b}/ws/agents/support-agent/?token={token}"
    async with websockets.connect(driver_url, additional_headers=ORIGIN, max_size=None) as driver:
        message = f"/sleep 1500\n{text}"  # the subscribers join before the first token: all of it is live
        await driver.send(json.dumps({"action": "stream", "messages": message, "memory": {"thread": "bench-fanout"}}))
        run_id = json.loads(await driver.recv())["runId"]
        drained = asyncio.create_task(_frames(driver))

        async def subscriber(port: int) -> dict:
            after, deltas, first, last, finish, resumed = 0, 0, None, None, None, 0
            while finish is None:
                url = f"ws://127.0.0.1:{port}/ws/runs/{run_id}/?after={after}&token={token}"
                try:
                    async with websockets.connect(url, additional_headers=ORIGIN, max_size=None) as ws:
                        async for raw in ws:
                            frame = json.loads(raw)
                            after = frame.get("seq", after)
                            if frame["type"] == "text-delta":
                                deltas += 1
                                first = first or time.perf_counter()
                                last = time.perf_counter()
                            elif frame["type"] == "finish":
                                finish = time.time()
                                break
                except websockets.ConnectionClosedError:
                    # Closed 4008 (too far behind) or dropped: resume after the last chunk, as a client does.
                    resumed += 1
                    if resumed > 20:
                        raise
            return {"deltas": deltas, "seconds": (last or 0) - (first or 0), "finish": finish, "resumed": resumed}

        results = await asyncio.gather(*(subscriber(top.port_a if i % 2 else top.port_b) for i in range(SUBSCRIBERS)))
        await drained
    completed_at = (await Run.objects.aget(pk=run_id)).completed_at.timestamp()
    return {
        "fanout": {
            "words": words,
            "rates": [r["deltas"] / r["seconds"] if r["seconds"] else float("inf") for r in results],
            "behind_s": [max(0.0, r["finish"] - completed_at) for r in results],
            "deltas": [r["deltas"] for r in results],
            "resumed": [r["resumed"] for r in results],
        }
    }


async def fanout_one_daphne(top: Topology, words: int) -> dict:
    """``words`` text-delta chunks to 10, then 100 ``ws/runs`` subscribers all on web A, the run started
    over REST on web B (``benchmarks/stream_fanout.py``, lean clients; docs/performance.md "Fan-out
    (third pass)")."""
    from benchmarks.stream_fanout import measure_subscribers

    return {"fanout_one_daphne": [await measure_subscribers(top.port_a, top.port_b, n, words) for n in (10, 100)]}


# --- children ------------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> dict:
    """Run in a process of its own: Django set up on the database the environment names."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if args.cycles_child:
        from benchmarks.cycle import measure_cycle

        return measure_cycle(args.cycles_child)
    raise SystemExit("nothing to do")


def run_child(extra: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, *extra], env=env, cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(extra)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cycles(config: dict, count: int) -> dict:
    """suspend → approve → complete in-process (benchmarks/cycle.py), on SQLite and on PostgreSQL."""
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    base |= {"AGENTRUN_EMBEDDED_SWEEPER": "0", "PYTHONPATH": str(ROOT)}
    base.pop("AGENTRUN_TASK_BACKEND", None)
    figures = {}
    with tempfile.TemporaryDirectory() as data:
        figures["cycle_sqlite"] = run_child(["--cycles-child", str(count)], base | {"AGENTRUN_DATA_DIR": data})
    name = f"{config['prefix']}_cycle"
    drop_database(config["admin"], name)
    ensure_database(config["admin"], name)
    try:
        env = base | {"DATABASE_URL": server_url(config["pg"], name)}
        figures["cycle_postgresql"] = run_child(["--cycles-child", str(count)], env)
    finally:
        drop_database(config["admin"], name)
    return figures


def topology(config: dict, redis: str, runs: int) -> dict:
    """Decisions/s end to end with 2 web + 2, then 3 workers (``benchmarks/topology.py``), in a process
    and a database of their own."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "AGENTRUN_TASK_BACKEND")}
    env |= {"BENCH_PG": config["pg"], "BENCH_REDIS_URL": redis, "BENCH_DB_PREFIX": config["prefix"]}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "topology.py"), "--runs", str(runs)],
        env=env | {"PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks/topology.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return {"topology": json.loads(done.stdout.strip().splitlines()[-1])}


def topology_rows(f: dict, row) -> list[str]:  # noqa: ANN001 - table()'s row()
    lines = []
    for r in f.get("topology", {}).get("rounds", []):
        cores = r["cpu_cores"]
        split = ", ".join(f"{name} {cores[name]:.2f}" for name in ("web", "worker", "postgres", "redis", "client"))
        lines.append(
            row(
                f"decisions/s end to end (approve over REST → run completed), 2 web + {r['workers']} workers, "
                f"{r['clients']} clients",
                f"{r['decisions_per_s']:.0f}/s; CPU cores: {split}; bottleneck: {r['bottleneck']}",
                "a figure; the bottleneck named",
                None,
            )
        )
    return lines


# --- the table -----------------------------------------------------------------------------------
def ms(figure: dict) -> str:
    return f"{figure['median']:.1f} ms (p95 {figure['p95']:.1f})"


def table(n: int, f: dict, load: dict) -> str:
    """Markdown: every row of issue 12's table (and the REST floor), with its target and whether it is met."""

    def row(what: str, measured: str, target: str, met: bool | None) -> str:
        return f"| {what} | {measured} | {target} | {'—' if met is None else ('met' if met else 'NOT met')} |"

    size = f"{n:,}"
    lines = [
        f"agentrun benchmarks: N = {size} suspended runs; PostgreSQL {f['pg_version']}, Redis; "
        f"{load['cpus']} CPUs, load average {load['before']} before, {load['after']} after; {load['speed']}",
        "",
        "| what | measured | target | |",
        "|---|---|---|---|",
    ]
    floor = f["rest_floor"]
    lines.append(row("REST request floor: authenticated GET /api/agents/", ms(floor), "a few ms", floor["median"] <= 5))
    un = f["rest_unfiltered"]
    lines.append(
        row(f"REST listing, {size} suspended runs, unfiltered first page", ms(un), "≤ 10 ms", un["median"] <= 10)
    )
    ratio, reference = f["ratio"], f"{f['reference_n']:,}"
    lines.append(
        row(
            f"REST listing, t({size}) / t({reference}), unfiltered first page",
            f"{ratio:.2f}" + (f" (N is {reference})" if n == f["reference_n"] else ""),
            "≤ 1.5",
            ratio <= 1.5,
        )
    )
    for key, by in (("rest_thread", "thread"), ("rest_resource", "resource")):
        lines.append(row(f"REST listing, {size}, by {by}, first page", ms(f[key]), "≤ 10 ms", f[key]["median"] <= 10))
    py = f["python_unfiltered"]
    lines.append(
        row(f"Python `list_suspended_runs`, {size}, unfiltered first page", ms(py), "≤ 3 ms", py["median"] <= 3)
    )
    u = f["unpaged"]
    what = f"REST listing, no paging, {u['runs']:,} matching runs"
    lines.append(row(f"{what}: first byte", f"{u['first_byte_ms']:.0f} ms", "≤ 100 ms", u["first_byte_ms"] <= 100))
    lines.append(
        row(
            f"{what}: daphne RSS growth (kept after)",
            f"{u['rss_peak_growth_mib']:.0f} MiB ({u['rss_kept_mib']:.0f} MiB)",
            "≤ 50 MiB",
            u["rss_peak_growth_mib"] <= 50,
        )
    )
    lines.append(row(f"{what}: total", f"{u['total_s']:.2f} s", "≤ 2 s", u["total_s"] <= 2))
    # The third pass's targets (docs/performance.md, "Decision cycle and topology (third pass)").
    for vendor, target in (("sqlite", 10), ("postgresql", 15)):
        c = f[f"cycle_{vendor}"]
        lines.append(
            row(
                f"suspend → approve → complete, in-process, {'SQLite' if vendor == 'sqlite' else 'PostgreSQL'}",
                f"{ms(c['cycle_ms'])}, CPU {ms(c['cpu_ms'])}, {c['statements']['cycle']} SQL statements",
                f"≤ {target} ms",
                c["cycle_ms"]["median"] <= target,
            )
        )
    page = f["metrics_page_30d"]
    lines.append(
        row(
            f"`/approvals/metrics/` reads at N decisions ({f['rollup_rows']:,} rollup rows), 30 days",
            f"{ms(page)}; 90 days {ms(f['metrics_page_90d'])}",
            "≤ 200 ms",
            page["p95"] <= 200,
        )
    )
    inbox = f["inbox_first_page"]
    lines.append(
        row(
            f"`/approvals/` inbox, first page, {inbox['threads']:,} waiting threads (server time)",
            f"{ms(inbox)}; Python CPU {inbox['python_cpu_ms']:.0f} ms",
            "< 300 ms",
            inbox["median"] < 300,
        )
    )
    batch = f["prune_batch"]
    lines.append(
        row(
            f"sweep's prune round, a batch of {batch['batch']:,} of {batch['due']:,} events due / nothing due",
            f"{ms(batch)} / {ms(f['prune_idle'])}",
            "no long lock",
            True,
        )
    )
    a = f["approve_to_chunk"]
    lines.append(
        row(
            "approve over REST on web B → first continuation chunk on a `ws/runs` subscriber on web A",
            ms(a),
            "≤ 30 ms median, ≤ 60 ms p95",
            a["median"] <= 30 and a["p95"] <= 60,
        )
    )
    fan = f["fanout"]
    slowest, behind = min(fan["rates"]), max(fan["behind_s"])
    lines.append(
        row(
            f"chunks/s to each of {SUBSCRIBERS} `ws/runs` subscribers ({fan['words']:,} chunks), the slowest",
            f"{slowest:,.0f} chunks/s (fastest {max(fan['rates']):,.0f}; {sum(fan['resumed'])} resumed)",
            "≥ 5,000 each",
            slowest >= 5000,
        )
    )
    lines.append(row("… the subscriber furthest behind at the run's end", f"{behind:.2f} s", "≤ 1 s", behind <= 1))
    for many in f["fanout_one_daphne"]:
        target, slowest = (10_000 if many["subscribers"] <= 10 else 1_000), min(many["rates"])
        lines.append(
            row(
                f"chunks/s to each of {many['subscribers']} `ws/runs` subscribers on one daphne "
                f"({many['words']:,} chunks), the slowest; closed 4008",
                f"{slowest:,.0f} chunks/s (fastest {max(many['rates']):,.0f}); {many['closed_4008']} closed 4008",
                f"≥ {target:,} each, none closed 4008",
                slowest >= target and many["closed_4008"] == 0,
            )
        )
    lines += topology_rows(f, row)
    lines += queries.rows(n, f, row)  # the third pass's floor, unpaged listing, date totals
    return "\n".join(lines)


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- main ----------------------------------------------------------------------------------------
def open_seeded(pg: str, name: str, n: int) -> str:
    """This process on the seeded database ``name`` (seeded with ``n`` runs once, migrated every time):
    Django with the in-memory layer and in-process tasks (the template run). The reviewer's token."""
    os.environ |= {"DATABASE_URL": server_url(pg, name), "AGENTRUN_EMBEDDED_SWEEPER": "0", "SECRET_KEY": "bench"}
    os.environ.pop("REDIS_URL", None)
    os.environ.pop("AGENTRUN_TASK_BACKEND", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if not seeded(n):
        print(f"seeding {n:,} suspended runs into {name} (once; reruns reuse it)", file=sys.stderr)
        call_command("flush", interactive=False, verbosity=0)  # a seed that was interrupted
        seed(n, report=lambda line: print(line, file=sys.stderr))
    return reviewer_token()


def topology_env(redis: str) -> dict[str, str]:
    """The environment of the servers and the worker: Redis channel layer, tasks in the database."""
    return dict(
        os.environ,
        REDIS_URL=redis,
        AGENTRUN_TASK_BACKEND="django_tasks_db.DatabaseBackend",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=int(os.environ.get("BENCH_N", REFERENCE_N)))
    parser.add_argument("--repeat", type=int, default=int(os.environ.get("BENCH_REPEAT", 50)))
    parser.add_argument("--latency-runs", type=int, default=int(os.environ.get("BENCH_LATENCY_RUNS", 30)))
    parser.add_argument("--words", type=int, default=int(os.environ.get("BENCH_WORDS", 10_000)))
    parser.add_argument("--cycles", type=int, default=int(os.environ.get("BENCH_CYCLES", 30)))
    parser.add_argument("--reference-n", type=int, default=REFERENCE_N, help="N of the ratio's denominator")
    parser.add_argument("--topology-runs", type=int, default=int(os.environ.get("BENCH_TOPOLOGY_RUNS", 200)))
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--drop", action="store_true", help="drop the seeded database(s) at the end")
    parser.add_argument("--only-rest-unfiltered", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cycles-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cycles_child:
        print(json.dumps(child(args)))
        return

    pg = os.environ.get("BENCH_PG") or os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
    if not pg.startswith(("postgres://", "postgresql://")):
        pg = "postgres://postgres@127.0.0.1:5432/postgres"
    redis = os.environ.get("BENCH_REDIS_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    config = {
        "pg": pg,
        "admin": server_url(pg, "postgres"),
        "prefix": os.environ.get("BENCH_DB_PREFIX", "agentrun_bench"),
    }
    load = {"cpus": os.cpu_count(), "before": loadavg(), "speed": machine.describe()}
    name = database_name(config["prefix"], args.n)
    ensure_database(config["admin"], name)

    token = open_seeded(pg, name, args.n)
    from django.db import connection

    figures: dict = {"n": args.n, "pg_version": connection.pg_version // 10000}
    figures |= python_listing(args.repeat)
    figures |= operations.metrics_page(args.n, args.repeat, spread)
    figures |= operations.prune(args.repeat, spread)
    figures |= operations.inbox_first_page(args.repeat, spread, "bench-reviewer")
    figures |= queries.in_process(args.n, token, args.repeat)  # request floor, unpaged, date totals
    env = topology_env(redis)
    with tempfile.TemporaryDirectory() as logs, Topology(env, Path(logs)) as top:
        try:
            figures |= rest_listing(top, token, args.repeat)
            if args.only_rest_unfiltered:
                print(json.dumps(figures["rest_unfiltered"]))
                return
            figures |= rest_unpaged(top, token, args.n)
            figures |= queries.through_daphne(top, token, args.repeat, env)
            figures |= asyncio.run(approve_latency(top, token, args.latency_runs))
            figures |= asyncio.run(fanout(top, token, args.words))
            figures |= asyncio.run(fanout_one_daphne(top, args.words))
        except BaseException:
            for log in sorted(Path(logs).glob("*.log")):
                print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
    figures["reference_n"] = args.reference_n
    if args.n == args.reference_n:
        figures["ratio"] = 1.0
    else:
        reference = run_child(
            ["--n", str(args.reference_n), "--repeat", str(args.repeat), "--only-rest-unfiltered"],
            dict(os.environ, BENCH_PG=pg, BENCH_DB_PREFIX=config["prefix"]),
        )
        figures["rest_unfiltered_reference"] = reference
        figures["ratio"] = figures["rest_unfiltered"]["median"] / reference["median"]
    figures |= cycles(config, args.cycles)
    figures |= topology(config, redis, args.topology_runs)
    load["after"] = loadavg()
    figures["load"] = load
    print(table(args.n, figures, load))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str))
    if args.drop:
        from django.db import connections

        connections.close_all()
        drop_database(config["admin"], name)
        if args.n != args.reference_n:
            drop_database(config["admin"], database_name(config["prefix"], args.reference_n))


if __name__ == "__main__":
    main()

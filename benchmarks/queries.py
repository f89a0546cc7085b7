"""The request floor, the unpaged listing and date-bounded totals
(docs/performance.md#request-floor-unpaged-listing-date-totals-third-pass).
Rows of ``benchmarks/suite.py``; alone, on the suite's seeded database, in-process rows and the request floor only:

    .venv/bin/python benchmarks/queries.py --n 10000      # BENCH_PG, BENCH_REDIS_URL, BENCH_DB_PREFIX as the suite

- **Request floor**, split: the authenticated ``GET /api/agents/`` through agentrun's daphne (the suite's
  ``rest_floor`` row, once the servers and the worker are done starting: ``settle``), and web A's CPU time
  per request over 500 in a row (``floor_cpu``); the same request in-process (Django's test client:
  middleware, DRF, the view, no server); and a bare ASGI app answering the same bytes under the same
  daphne (what daphne alone costs).
- **Unpaged listing**, in-process: every run of ``stream_suspended_runs`` (min(N, 50k) newest runs, as the
  suite's REST row picks them) encoded as the REST answer's bytes; µs a run.
- **Date-bounded totals**: the first page with ``fromDate``/``toDate`` bounding the middle 80% of the
  runs (the edges inside a minute, so every kind of bucket and both edges count), in Python and over REST.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

UNPAGED_RUNS = 50_000
AGENTS_BODY = b'{"object":"list","data":[],"firstId":null,"lastId":null,"hasMore":false}'


async def bare_app(scope, receive, send) -> None:  # noqa: ANN001 - the ASGI callable
    """An ASGI app with nothing in it: what daphne costs on its own, per request."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(AGENTS_BODY)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": AGENTS_BODY})


def _timed(fn, repeat: int) -> dict:  # noqa: ANN001
    from benchmarks.suite import timed

    return timed(fn, repeat)


# --- in-process ----------------------------------------------------------------------------------
def in_process(n: int, token: str, repeat: int) -> dict:
    """The floor in-process, the unpaged listing's µs a run, the dated page in Python."""
    from django.test import Client

    from agentrun.api.views import _items
    from agentrun.core.selectors import list_suspended_runs, stream_suspended_runs

    client = Client(HTTP_HOST="localhost", HTTP_AUTHORIZATION=f"Token {token}")

    def floor() -> None:
        assert client.get("/api/agents/").status_code == 200

    start, end = date_bounds()
    dated = {"from_date": start, "to_date": end}
    unpaged_from = unpaged_bound(n)

    def unpaged() -> int:
        """What the server does for an unpaged answer (``listing_response``, ``StreamedListing``), in this
        thread: each batch as its items' JSON."""
        stream = stream_suspended_runs(agent_id="support-agent", from_date=unpaged_from)
        size = 0
        while not stream.done:
            encoded, _ = stream.next_encoded(_items)
            size += len(encoded)
        return size

    unpaged()  # warm up
    runs = min(n, UNPAGED_RUNS)
    samples = []
    for _ in range(3):
        began = time.perf_counter()
        unpaged()
        samples.append(time.perf_counter() - began)
    best = min(samples)
    return {
        "floor_in_process": _timed(floor, repeat),
        "unpaged_in_process": {"runs": runs, "seconds": best, "us_per_run": 1e6 * best / runs},
        "python_dated": _timed(
            lambda: list_suspended_runs(agent_id="support-agent", per_page=20, page=0, **dated), repeat
        ),
    }


def unpaged_bound(n: int) -> str:
    """The ``fromDate`` that selects the newest min(N, 50k) runs (as the suite's REST row does)."""
    from agentrun.core.models import Snapshot
    from agentrun.core.timeutil import iso

    bound = (
        Snapshot.objects.filter(agent_id="support-agent")
        .order_by("-created_at", "-run_id")
        .values_list("created_at", flat=True)[min(n, UNPAGED_RUNS) - 1]
    )
    return iso(bound)


def date_bounds() -> tuple[str, str]:
    """``fromDate``/``toDate`` around the middle 80% of the runs, each edge 17.25 s into a minute."""
    from datetime import timedelta

    from django.db.models import Max, Min

    from agentrun.core.models import Snapshot
    from agentrun.core.timeutil import iso

    span = Snapshot.objects.filter(agent_id="support-agent").aggregate(lo=Min("created_at"), hi=Max("created_at"))
    lo, hi = span["lo"], span["hi"]
    width = hi - lo
    start = (lo + width / 10).replace(second=17, microsecond=250_000)
    end = (hi - width / 10).replace(second=17, microsecond=250_000) + timedelta(microseconds=1)
    return iso(start), iso(end)


# --- through daphne ------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far (user + system), from /proc."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(top, timeout: float = 20.0) -> None:  # noqa: ANN001 - suite.Topology
    """Wait until the topology's processes are done starting (each under 5% of a core for half a
    second): a worker still importing Django took a core from the first rows' requests."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [proc.pid for proc in top.procs.procs if proc.poll() is None]
        before = sum(cpu_seconds(pid) for pid in pids)
        time.sleep(0.5)
        if sum(cpu_seconds(pid) for pid in pids) - before < 0.05 * 0.5 * len(pids):
            return


def floor_cpu(top, token: str, requests_count: int = 500) -> dict:  # noqa: ANN001 - suite.Topology
    """The request floor's server CPU: web A's CPU time per authenticated ``GET /api/agents/`` (user +
    system, all its threads) over ``requests_count`` requests, and their median: what the load of the
    machine does not change much."""
    import requests

    with requests.Session() as http:
        http.headers["Authorization"] = f"Token {token}"
        url = f"http://127.0.0.1:{top.port_a}/api/agents/"
        for _ in range(20):
            assert http.get(url).status_code == 200
        samples = []
        before = cpu_seconds(top.a.pid)
        for _ in range(requests_count):
            started = time.perf_counter()
            assert http.get(url).status_code == 200
            samples.append(1000 * (time.perf_counter() - started))
        used = cpu_seconds(top.a.pid) - before
    samples.sort()
    return {"cpu_ms": 1000 * used / requests_count, "median": samples[len(samples) // 2], "n": requests_count}


def through_daphne(top, token: str, repeat: int, env: dict[str, str]) -> dict:  # noqa: ANN001 - suite.Topology
    """The dated page over REST, and a bare ASGI app under agentrun's daphne (the floor's server share)."""
    import requests

    from tests.helpers.system import BIN, free_port, wait_for_port

    port = free_port()
    args = [str(BIN / "python"), "-m", "agentrun.server.web", "-b", "127.0.0.1", "-p", str(port)]
    bare = subprocess.Popen(
        [*args, "benchmarks.queries:bare_app"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, bare)
        start, end = date_bounds()
        with requests.Session() as http:
            http.headers["Authorization"] = f"Token {token}"

            def get(url: str, params: dict | None = None) -> None:
                response = http.get(url, params=params)
                assert response.status_code == 200, response.text[:300]

            base = f"http://127.0.0.1:{top.port_a}"
            return {
                "floor_cpu": floor_cpu(top, token),
                "bare_asgi": _timed(lambda: get(f"http://127.0.0.1:{port}/api/agents/"), repeat),
                "rest_dated": _timed(
                    lambda: get(
                        f"{base}/api/agents/support-agent/suspended-runs",
                        {"fromDate": start, "toDate": end, "perPage": "20", "page": "0"},
                    ),
                    repeat,
                ),
            }
    finally:
        bare.kill()
        bare.wait(10)


# --- rows ----------------------------------------------------------------------------------------
def rows(n: int, f: dict, row) -> list[str]:  # noqa: ANN001 - suite.table's row()
    from benchmarks.suite import ms

    size = f"{n:,}"
    lines = []
    if "rest_floor" in f:
        floor = f["rest_floor"]
        lines.append(
            row("REST request floor: authenticated GET /api/agents/", ms(floor), "≤ 2.5 ms", floor["median"] <= 2.5)
        )
    lines.append(
        row(
            "… the same request in-process (Django's test client: no server)",
            ms(f["floor_in_process"]),
            "—",
            None,
        )
    )
    if "floor_cpu" in f:
        cpu = f["floor_cpu"]
        lines.append(
            row(
                f"… web A's CPU a request ({cpu['n']} in a row; their median)",
                f"{cpu['cpu_ms']:.2f} ms ({cpu['median']:.1f} ms)",
                "—",
                None,
            )
        )
    if "bare_asgi" in f:
        lines.append(row("… a bare ASGI app under the same daphne (daphne's share)", ms(f["bare_asgi"]), "—", None))
    if "rest_unfiltered" in f:
        un = f["rest_unfiltered"]
        lines.append(row(f"REST listing, {size}, unfiltered first page", ms(un), "≤ 5 ms", un["median"] <= 5))
    u = f["unpaged_in_process"]
    lines.append(
        row(
            f"unpaged listing in-process, {u['runs']:,} runs: every byte of the answer",
            f"{u['seconds']:.3f} s, {u['us_per_run']:.1f} µs a run",
            "≤ 5 µs a run",
            u["us_per_run"] <= 5,
        )
    )
    dated = f"{size}, first page with fromDate/toDate (80% of runs)"
    lines.append(row(f"Python listing, {dated}", ms(f["python_dated"]), "flat in N", None))
    if "rest_dated" in f:
        lines.append(row(f"REST listing, {dated}", ms(f["rest_dated"]), "flat in N", None))
    if "unpaged" in f:
        un = f["unpaged"]
        per_run = 1e6 * un["total_s"] / max(1, un["runs"])
        lines.append(
            row(
                f"REST listing, no paging, {un['runs']:,} runs: total (first byte {un['first_byte_ms']:.0f} ms)",
                f"{un['total_s']:.2f} s, {per_run:.1f} µs a run",
                "≤ 5 µs a run (50k in ≤ 0.3 s)",
                per_run <= 5,
            )
        )
    return lines


def main() -> None:
    import argparse
    import os
    import tempfile

    from benchmarks import suite
    from benchmarks.seed import database_name, ensure_database

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=int(os.environ.get("BENCH_N", suite.REFERENCE_N)))
    parser.add_argument("--repeat", type=int, default=int(os.environ.get("BENCH_REPEAT", 50)))
    parser.add_argument("--no-servers", action="store_true", help="in-process rows only")
    args = parser.parse_args()
    pg = os.environ.get("BENCH_PG") or "postgres://postgres@127.0.0.1:5432/postgres"
    redis = os.environ.get("BENCH_REDIS_URL") or "redis://127.0.0.1:6379/0"
    prefix = os.environ.get("BENCH_DB_PREFIX", "agentrun_bench")
    name = database_name(prefix, args.n)
    load = {"cpus": os.cpu_count(), "before": suite.loadavg()}
    ensure_database(suite.server_url(pg, "postgres"), name)
    token = suite.open_seeded(pg, name, args.n)
    figures = in_process(args.n, token, args.repeat)
    if not args.no_servers:
        env = dict(os.environ, REDIS_URL=redis, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        env["AGENTRUN_TASK_BACKEND"] = "django_tasks_db.DatabaseBackend"
        with tempfile.TemporaryDirectory() as logs, suite.Topology(env, Path(logs)) as top:
            settle(top)
            figures |= suite.rest_listing(top, token, args.repeat)
            figures |= through_daphne(top, token, args.repeat, env)
            figures |= suite.rest_unpaged(top, token, args.n)
    load["after"] = suite.loadavg()

    def row(what: str, measured: str, target: str, met: bool | None) -> str:
        return f"| {what} | {measured} | {target} | {'—' if met is None else ('met' if met else 'NOT met')} |"

    print(f"N = {args.n:,}; {load['cpus']} CPUs, load average {load['before']} before, {load['after']} after\n")
    print("| what | measured | target | |\n|---|---|---|---|")
    print("\n".join(rows(args.n, figures, row)))
    print(json.dumps(figures, default=str), file=sys.stderr)


if __name__ == "__main__":
    main()

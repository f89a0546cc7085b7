"""The one row "approve over REST on web B → first continuation chunk on ws/runs on web A", alone.

    .venv/bin/python benchmarks/approve_latency.py [--runs 30] [--held]

The same topology and measurement as ``benchmarks/suite.py`` (two daphnes, a worker, PostgreSQL and
Redis), without seeding N runs: this row does not depend on N. Environment as for the suite
(``BENCH_PG``, ``BENCH_DB_PREFIX``, ``BENCH_REDIS_URL``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.seed import EMAIL_LINE, drop_database, ensure_database  # noqa: E402
from benchmarks.suite import ORIGIN, Topology, approve_latency, reviewer_token, server_url, topology_env  # noqa: E402


async def held(top: Topology, token: str, runs: int) -> dict:
    """The row, while web A holds a subscription of its own all along (another run's ws/runs socket)."""
    import requests
    import websockets

    made = requests.post(
        f"http://127.0.0.1:{top.port_a}/api/agents/support-agent/generate",
        json={"messages": EMAIL_LINE, "memory": {"thread": "bench-held"}},
        headers={"Authorization": f"Token {token}"},
        timeout=60,
    )
    url = f"ws://127.0.0.1:{top.port_a}/ws/runs/{made.json()['runId']}/?after=0&token={token}"
    async with websockets.connect(url, additional_headers=ORIGIN):
        return await approve_latency(top, token, runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--held", action="store_true", help="hold another ws/runs socket on web A throughout (never idle)"
    )
    args = parser.parse_args()
    pg = os.environ.get("BENCH_PG") or "postgres://postgres@127.0.0.1:5432/postgres"
    redis = os.environ.get("BENCH_REDIS_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    admin = server_url(pg, "postgres")
    name = f"{os.environ.get('BENCH_DB_PREFIX', 'agentrun_bench')}_latency"
    ensure_database(admin, name)
    os.environ |= {"DATABASE_URL": server_url(pg, name), "AGENTRUN_EMBEDDED_SWEEPER": "0", "SECRET_KEY": "bench"}
    os.environ.pop("REDIS_URL", None)
    os.environ.pop("AGENTRUN_TASK_BACKEND", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", verbosity=0)
    token = reviewer_token()
    env = topology_env(redis)
    with tempfile.TemporaryDirectory() as logs, Topology(env, Path(logs)) as top:
        try:
            figures = asyncio.run(held(top, token, args.runs) if args.held else approve_latency(top, token, args.runs))
        except BaseException:
            for log in sorted(Path(logs).glob("*.log")):
                print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
    print(json.dumps(figures))
    connections.close_all()
    drop_database(admin, name)


if __name__ == "__main__":
    main()

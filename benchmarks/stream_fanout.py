"""Figures for the stream fan-out: chunks/s to one websocket subscriber, and chunk-log round trips.

    .venv/bin/python benchmarks/stream_fanout.py            # embedded default, then Redis
    .venv/bin/python benchmarks/stream_fanout.py --words 20000

Each mode runs in a fresh process on a throw-away SQLite database (PostgreSQL when DATABASE_URL is set).
A run whose answer has N words produces N text-delta chunks; a subscriber on ws/runs/<id>/ (the real
ASGI application and consumer) receives them live. Round trips: database writes of the chunk log per
1,000 chunks (the log is written in batches, not per chunk).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


async def measure(words: int) -> dict:
    from asgiref.sync import sync_to_async
    from channels.testing import WebsocketCommunicator
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    from agentrun.asgi import application
    from agentrun.core.access import ensure_groups
    from agentrun.engine.agents import get_agent
    from agentrun.engine.chunklog import ChunkLog

    flushes = {"n": 0}
    original = ChunkLog.flush_sync

    def counting_flush(self):  # noqa: ANN001, ANN202
        if self.buffer:
            flushes["n"] += 1
        return original(self)

    ChunkLog.flush_sync = counting_flush

    @sync_to_async
    def token() -> str:
        ensure_groups()
        user = User.objects.create_superuser(f"bench{time.time_ns()}", password="x" * 12)
        return Token.objects.create(user=user).key

    key = await token()
    agent = get_agent("support-agent")
    text = " ".join(f"w{i}" for i in range(words))
    # /sleep gives the subscriber time to join before the first token: everything it gets is live.
    stream = await agent.stream(f"/sleep 300\n{text}", memory={"thread": f"bench-{time.time_ns()}"})
    comm = WebsocketCommunicator(
        application, f"/ws/runs/{stream.run_id}/?after=0&token={key}", headers=[(b"origin", b"http://localhost")]
    )
    assert (await comm.connect())[0]
    received, first_delta, last_delta = 0, None, None
    consumer = asyncio.create_task(stream.collect())
    while True:
        chunk = await comm.receive_json_from(timeout=60)
        received += 1
        if chunk["type"] == "text-delta":
            now = time.perf_counter()
            first_delta = first_delta or now
            last_delta = now
        if chunk["type"] == "finish":
            break
    produced = await consumer
    await comm.disconnect()
    deltas = sum(1 for c in produced if c["type"] == "text-delta")
    seconds = (last_delta or 0) - (first_delta or 0)
    return {
        "chunks": received,
        "deltas": deltas,
        "seconds": seconds,
        "chunks_per_s": deltas / seconds if seconds else float("inf"),
        "flushes": flushes["n"],
        "round_trips_per_1000": 1000 * flushes["n"] / len(produced),
    }


def child(words: int) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    result = asyncio.run(measure(words))
    layer = "redis" if os.environ.get("REDIS_URL") else "in-memory"
    from django.db import connection

    print(
        f"{layer:9s} layer, {connection.vendor}: {result['deltas']} text-delta chunks to one websocket subscriber "
        f"in {result['seconds']:.2f} s = {result['chunks_per_s']:,.0f} chunks/s; "
        f"chunk log: {result['flushes']} writes = {result['round_trips_per_1000']:.1f} round trips per 1,000 chunks"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--words", type=int, default=10_000)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/3"))
    args = parser.parse_args()
    if args.child:
        child(args.words)
        return
    for redis in ("", args.redis):
        with tempfile.TemporaryDirectory() as data:
            env = dict(os.environ, AGENTRUN_DATA_DIR=data, AGENTRUN_EMBEDDED_SWEEPER="0", PYTHONPATH=str(ROOT))
            env.pop("REDIS_URL", None)
            if redis:
                env["REDIS_URL"] = redis
            subprocess.run([sys.executable, __file__, "--child", "--words", str(args.words)], env=env, check=True)


if __name__ == "__main__":
    main()

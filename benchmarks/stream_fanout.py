"""Figures for the stream fan-out: chunks/s to one websocket subscriber, and chunk-log round trips.

    .venv/bin/python benchmarks/stream_fanout.py            # embedded default, then Redis
    .venv/bin/python benchmarks/stream_fanout.py --words 20000

Each mode runs in a fresh process on a throw-away SQLite database (PostgreSQL when DATABASE_URL is set).
A run whose answer has N words produces N text-delta chunks; a subscriber on ws/runs/<id>/ (the real
ASGI application and consumer) receives them live. Round trips: database writes of the chunk log per
1,000 chunks (the log is written in batches, not per chunk).

Many subscribers on one daphne (``measure_subscribers``, rows of ``make bench``; alone:
``--subscribers 10 100``, on PostgreSQL + Redis): a worker runs a run of N text-delta chunks, started over
REST on another daphne, while K ``ws/runs`` subscribers on one daphne follow it live. The clients are
lean on purpose (raw sockets, frame headers parsed, no JSON but the last frame's), so that the figure is
the server's, not the client library's. A subscriber closed 4008 resumes after the seq it was told, as a
client does; each one's frames are hashed in order, so all of them must have received the same bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from functools import partial
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


# --- many subscribers on one daphne ----------------------------------------------------------------
DELTA = b'{"type": "text-delta"'
CLOSE_REPLY = b"\x88\x82\x00\x00\x00\x00"  # a masked close frame (zero mask) + the code


class LeanSubscriber(asyncio.Protocol):
    """A ``ws/runs`` client that parses frame headers only: counts text-deltas, hashes every frame."""

    def __init__(self, request: bytes, digest: hashlib._Hash) -> None:
        self.request = request
        self.digest = digest
        self.buf = bytearray()
        self.upgraded = False
        self.deltas = 0
        self.first: float | None = None
        self.last: float | None = None
        self.last_frame = b""
        self.close_code: int | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            if not buf.startswith(b"HTTP/1.1 101"):
                raise RuntimeError(bytes(buf[:200]))
            del buf[: end + 4]
            self.upgraded = True
        pos, n, deltas = 0, len(buf), 0
        while n - pos >= 2:
            length, head = buf[pos + 1] & 0x7F, 2
            if length == 126:
                length, head = int.from_bytes(buf[pos + 2 : pos + 4]), 4
            elif length == 127:
                length, head = int.from_bytes(buf[pos + 2 : pos + 10]), 10
            start = pos + head
            if n < start + length:
                break
            opcode = buf[pos] & 0x0F
            if opcode == 1:
                frame = bytes(buf[start : start + length])
                if frame.startswith(DELTA):
                    deltas += 1
                    self.digest.update(frame)
                else:  # replayed from the log, a payload's keys may come in the database's order
                    self.digest.update(json.dumps(json.loads(frame), sort_keys=True).encode())
                self.last_frame = frame
            elif opcode == 8:
                self.close_code = int.from_bytes(buf[start : start + 2]) if length >= 2 else 1005
                self.transport.write(CLOSE_REPLY + buf[start : start + 2])  # type: ignore[attr-defined]
                self.transport.close()
            elif opcode == 9:  # ping: a masked pong with the same payload (zero mask)
                self.transport.write(bytes([0x8A, 0x80 | length, 0, 0, 0, 0]) + buf[start : start + length])  # type: ignore[attr-defined]
            pos = start + length
        del buf[:pos]
        if deltas:
            now = time.perf_counter()
            self.first = self.first or now
            self.last = now
            self.deltas += deltas

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(self.close_code)


async def follow_lean(port: int, run_id: str, token: str) -> dict:
    """Follow the run to its close 1000, resuming after a 4008 (or a drop) as a client does."""
    loop = asyncio.get_running_loop()
    digest = hashlib.sha256()
    after, deltas, first, last, resumed, closes = 0, 0, None, None, 0, []
    while True:
        request = (
            f"GET /ws/runs/{run_id}/?after={after}&token={token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\nOrigin: http://localhost\r\n\r\n"
        ).encode()
        for attempt in range(10):  # a loaded server may refuse a handshake: retry, as a client would
            try:
                _, sub = await loop.create_connection(partial(LeanSubscriber, request, digest), "127.0.0.1", port)
                break
            except OSError:
                if attempt == 9:
                    raise
                await asyncio.sleep(0.2)
        code = await asyncio.wait_for(sub.closed, 300)
        deltas += sub.deltas
        first, last = first or sub.first, sub.last or last
        if sub.last_frame:
            after = json.loads(sub.last_frame)["seq"]
        closes.append(code)
        if code == 1000:
            break
        resumed += 1
        if resumed > 50:
            raise RuntimeError(f"subscriber closed {closes}")
    return {"deltas": deltas, "first": first, "last": last, "closes": closes, "digest": digest.hexdigest()}


WATCHERS_PER_PERSON = 25  # under AGENTRUN_WS_MAX_PER_USER (50 sockets per person and process)


def watcher_tokens(subscribers: int) -> list[str]:
    """Tokens of reviewers ``bench-watcher-<i>``, one per WATCHERS_PER_PERSON subscribers."""
    from django.contrib.auth.models import Group, User
    from rest_framework.authtoken.models import Token

    from agentrun.core.access import REVIEWERS, ensure_groups

    ensure_groups()
    tokens = []
    for i in range(-(-subscribers // WATCHERS_PER_PERSON)):
        user, _ = User.objects.get_or_create(username=f"bench-watcher-{i}")
        user.groups.add(Group.objects.get(name=REVIEWERS))
        tokens.append(Token.objects.get_or_create(user=user)[0].key)
    return tokens


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure_subscribers(
    port: int, start_port: int, subscribers: int, words: int, pids: dict[str, int] | None = None
) -> dict:
    """``subscribers`` lean clients on ``ws/runs`` of the daphne on ``port`` follow a run of ``words``
    text-delta chunks that a worker runs (started over REST on the daphne on ``start_port``). ``pids``:
    processes whose CPU time during the run is reported (``{"web": …, "worker": …}``)."""
    import requests
    from asgiref.sync import sync_to_async

    tokens = await sync_to_async(watcher_tokens)(subscribers)
    token = tokens[0]

    wait_ms = 2000 + 30 * subscribers  # every subscriber is in before the first delta: all of it is live
    text = " ".join(f"w{i}" for i in range(words))
    body = {"messages": f"/sleep {wait_ms}\n{text}", "memory": {"thread": f"bench-fanout-{time.time_ns()}"}}
    url = f"http://127.0.0.1:{start_port}/api/agents/support-agent/stream"
    headers = {"Authorization": f"Token {token}"}

    def start() -> str:
        with requests.post(url, json=body, headers=headers, stream=True, timeout=30) as sse:
            first = next(line for line in sse.iter_lines(decode_unicode=True) if line.startswith("data:"))
        return json.loads(first[5:])["runId"]

    run_id = await asyncio.to_thread(start)
    load_before, cpu_before, wall_before = os.getloadavg()[0], time.process_time(), time.perf_counter()
    servers_before = {name: process_cpu(pid) for name, pid in (pids or {}).items()}
    results = await asyncio.gather(
        *(follow_lean(port, run_id, tokens[i // WATCHERS_PER_PERSON]) for i in range(subscribers))
    )
    wall = time.perf_counter() - wall_before
    servers = {name: process_cpu(pid) - servers_before[name] for name, pid in (pids or {}).items()}
    rates = [r["deltas"] / (r["last"] - r["first"]) if r["last"] and r["last"] > r["first"] else 0.0 for r in results]
    return {
        "subscribers": subscribers,
        "words": words,
        "deltas": sorted({r["deltas"] for r in results}),
        "same_frames": len({r["digest"] for r in results}) == 1,
        "rates": rates,
        "closed_4008": sum(code == 4008 for r in results for code in r["closes"]),
        "ends_spread_s": max(r["last"] for r in results) - min(r["last"] for r in results),
        "load": [load_before, os.getloadavg()[0]],
        # The clients' own CPU (this process): near 100% would make the figure the clients'.
        "client_cpu": (time.process_time() - cpu_before) / wall,
        # From the subscribers' first connection to the last close (the run's /sleep included).
        "wall_s": wall,
        "cpu_s": servers,
    }


def describe(f: dict) -> str:
    sent = f["subscribers"] * f["words"]
    cpu = "".join(
        f"; {name} CPU {seconds:.2f} s ({1e6 * seconds / (sent if name == 'web' else f['words']):.1f} µs a chunk"
        f"{' and subscriber' if name == 'web' else ''})"
        for name, seconds in f.get("cpu_s", {}).items()
    )
    return (
        f"{f['subscribers']:3d} subscribers on one daphne, {f['words']:,} chunks: slowest "
        f"{min(f['rates']):,.0f} chunks/s, fastest {max(f['rates']):,.0f}; {f['closed_4008']} closed 4008; "
        f"deltas {f['deltas']}; identical frames: {f['same_frames']}; clients' CPU {100 * f['client_cpu']:.0f}%"
        f"{cpu} in {f.get('wall_s', 0):.1f} s; load {f['load'][0]:.2f} → {f['load'][1]:.2f}"
    )


def standalone(counts: list[int], words: int, repeat: int = 1) -> None:
    """The rows alone, without the suite's seeding: two daphnes and a worker on PostgreSQL + Redis."""
    import django

    from benchmarks.seed import drop_database, ensure_database

    pg = os.environ.get("BENCH_PG") or os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
    redis = os.environ.get("BENCH_REDIS_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    server = pg.rsplit("/", 1)[0]
    name = f"{os.environ.get('BENCH_DB_PREFIX', 'agentrun_bench')}_fanout"
    drop_database(f"{server}/postgres", name)
    ensure_database(f"{server}/postgres", name)
    os.environ |= {"DATABASE_URL": f"{server}/{name}", "AGENTRUN_EMBEDDED_SWEEPER": "0", "SECRET_KEY": "bench"}
    os.environ.pop("REDIS_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
    django.setup()
    from django.core.management import call_command

    from benchmarks.suite import Topology, topology_env

    call_command("migrate", verbosity=0)
    env = topology_env(redis)
    try:
        with tempfile.TemporaryDirectory() as logs, Topology(env, Path(os.environ.get("BENCH_LOGS") or logs)) as top:
            for count in [count for _ in range(repeat) for count in counts]:
                # BENCH_PYSPY=<dir>: py-spy samples the subscribers' daphne and the worker meanwhile.
                spies = (
                    [
                        subprocess.Popen(
                            [
                                str(Path(sys.executable).parent / "py-spy"),
                                "record",
                                "--nonblocking",
                                "--format",
                                "raw",
                                "--pid",
                                str(pid),
                                "-o",
                                f"{os.environ['BENCH_PYSPY']}/{name}-{count}.txt",
                            ],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                        for name, pid in (("web", top.a.pid), ("worker", top.procs.procs[-1].pid))
                    ]
                    if os.environ.get("BENCH_PYSPY")
                    else []
                )
                try:
                    pids = {"web": top.a.pid, "worker": top.procs.procs[-1].pid}
                    print(describe(asyncio.run(measure_subscribers(top.port_a, top.port_b, count, words, pids))))
                finally:
                    for spy in spies:
                        spy.send_signal(signal.SIGINT)
                        spy.wait(30)
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(f"{server}/postgres", name)


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
    parser.add_argument("--subscribers", type=int, nargs="*", help="many subscribers on one daphne (PostgreSQL)")
    parser.add_argument("--repeat", type=int, default=1, help="measure the --subscribers counts this many times")
    args = parser.parse_args()
    if args.subscribers:
        sys.path.insert(0, str(ROOT))
        standalone(args.subscribers, args.words, args.repeat)
        return
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

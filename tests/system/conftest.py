"""Real processes: daphne servers and agentrun workers on the test database (PostgreSQL) and Redis."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


class Processes:
    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env = env
        self.logdir = logdir
        self.procs: list[subprocess.Popen] = []

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def daphne(self, name: str) -> tuple[subprocess.Popen, int]:
        port = free_port()
        proc = self._spawn(name, [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "agentrun.asgi:application"])
        wait_for_port(port, proc)
        return proc, port

    def worker(self, name: str) -> subprocess.Popen:
        return self._spawn(name, [str(BIN / "python"), "manage.py", "agentrun_worker", "--interval", "0.1"])

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def processes(transactional_db, tmp_path):
    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql" or not settings.REDIS_URL:
        pytest.fail("system tests need DATABASE_URL (PostgreSQL) and REDIS_URL")
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = dict(
        os.environ,
        DATABASE_URL=url,
        REDIS_URL=settings.REDIS_URL,
        AGENTRUN_TASK_BACKEND="django_tasks_db.DatabaseBackend",
        AGENTRUN_LEASE_SECONDS="2",
        AGENTRUN_SWEEP_SECONDS="0.5",
        AGENTRUN_AGENTS="tests.system.slow_agents",
        SECRET_KEY="system-test-key",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    procs = Processes(env, tmp_path)
    yield procs
    procs.stop()
    # Leave the logs next to the failure report.
    for log in sorted(tmp_path.glob("*.log")):
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            print(f"--- {log.name} ---\n{text[-4000:]}")

"""Real processes: agentrun's web servers and workers on the test database (PostgreSQL) and Redis,
private PostgreSQL and Redis servers a fault may restart, and the clients of the processes' API."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from tests.helpers import waiting

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


FIGURES: list[str] = []


def figures(line: str) -> None:
    """One line of figures, printed in the run's closing summary (pytest captures the test's output)."""
    FIGURES.append(line)


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's hook
    for line in FIGURES:
        terminalreporter.write_line(line)


def deadline(seconds: float) -> float:
    return time.monotonic() + seconds


def wait_until(predicate, seconds: float, what: str, interval: float = 0.1):
    """Poll ``predicate`` until it returns something truthy; fail after ``seconds`` (the processes are
    asked over the network: a slower poll than in-process waits)."""
    return waiting.wait_until(predicate, seconds, what, interval)


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


_running: list[Processes] = []  # the live ``processes`` fixture, stopped before private services


class Processes:
    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env = env
        self.logdir = logdir
        self.procs: list[subprocess.Popen] = []

    def _spawn(
        self, name: str, args: list[str], env: dict[str, str] | None = None, new_session: bool = False
    ) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,  # a supervisor's signals to its group never reach pytest
        )
        self.procs.append(proc)
        return proc

    def daphne(
        self, name: str, port: int | None = None, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen, int]:
        """A daphne server; ``port`` given: restart on that port (waits until it is free)."""
        port = port or free_port()
        args = [str(BIN / "python"), "-m", "agentrun.server.web", "-b", "127.0.0.1", "-p", str(port)]
        args.append("agentrun.asgi:application")  # agentrun's daphne, as scripts/production.sh runs it
        proc = self._spawn(name, args, env)
        wait_for_port(port, proc)
        return proc, port

    def worker(
        self, name: str, interval: float = 0.1, env: dict[str, str] | None = None, queues: str = "default"
    ) -> subprocess.Popen:
        args = [str(BIN / "python"), "manage.py", "agentrun_worker", "--interval", str(interval)]
        return self._spawn(name, [*args, "--queue-name", queues], env)

    def script(self, name: str, path: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """A shell script of the repository (``scripts/production.sh``), in a session of its own."""
        return self._spawn(name, [str(ROOT / path)], env, new_session=True)

    def log(self, name: str) -> str:
        return (self.logdir / f"{name}.log").read_text(errors="replace")

    def manage(self, *args: str, timeout: float = 120) -> str:
        """Run ``manage.py`` with the processes' environment (their database, not the test's)."""
        done = subprocess.run(
            [str(BIN / "python"), "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    @staticmethod
    def kill(proc: subprocess.Popen, sig: int = signal.SIGKILL, timeout: float = 10) -> None:
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

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

    from agentrun.core import secretbox

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
        # What this process encrypts (webhook secrets), the servers decrypt; its receivers are local.
        AGENTRUN_ENCRYPTION_KEYS=",".join(k if isinstance(k, str) else k.decode() for k in secretbox.keys_in_force()),
        AGENTRUN_WEBHOOK_ALLOW_PRIVATE="1",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    # The browser tests' conftest (imported whenever tests/ is collected) sets this for its own process;
    # a server must run with Django's async safety on, as in production (its deploy check refuses it).
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    procs = Processes(env, tmp_path)
    _running.append(procs)
    yield procs
    _running.remove(procs)
    procs.stop()
    if keep := os.environ.get("AGENTRUN_SYSTEM_LOGS"):  # keep the processes' logs for a post-mortem
        shutil.copytree(tmp_path, Path(keep) / tmp_path.name, dirs_exist_ok=True)
    # Leave the logs next to the failure report.
    for log in sorted(tmp_path.glob("*.log")):
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            print(f"--- {log.name} ---\n{text[-4000:]}")


# --- private services, for faults that restart them (never the machine's shared ones) -------------
PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)


def _as_postgres(args: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its binaries as the ``postgres`` user then."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *args]
    return args


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a free port, restartable, removed at teardown."""

    def __init__(self, root: Path) -> None:
        if PG_BIN is None:
            pytest.fail("PostgreSQL binaries not found under /usr/lib/postgresql/*/bin")
        self.root = root
        self.data = root / "data"
        self.sock = root / "sock"
        self.port = free_port()
        self.root.mkdir(parents=True, exist_ok=True)
        self.sock.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.sock, "postgres")
        self._run([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync"])
        self.start()
        with socket.create_connection(("127.0.0.1", self.port), timeout=5):
            pass
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE agentrun")
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/agentrun"

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, args: list[str], timeout: float = 60) -> None:
        done = subprocess.run(_as_postgres(args), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {done.stdout}\n{done.stderr}")

    def _ctl(self, *args: str) -> None:
        options = f"-p {self.port} -k {self.sock} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            [
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.root / "pg.log"),
                "-o",
                options,
                "-w",
                "-t",
                "30",
                *args,
            ]
        )

    def start(self) -> None:
        self._ctl("start")

    def stop(self) -> None:
        self._ctl("stop", "-m", "fast")

    def restart(self) -> None:
        self._ctl("restart", "-m", "fast")

    def connect(self):
        import psycopg

        return psycopg.connect(self.url.replace("postgres://", "postgresql://"), autocommit=True)


@pytest.fixture
def private_postgres():
    # Not under pytest's tmp dir: as root, that is private to root and the postgres user cannot enter it.
    root = Path(tempfile.mkdtemp(prefix="agentrun-pg-"))
    root.chmod(0o755)
    pg = PrivatePostgres(root)
    yield pg
    try:
        for procs in _running:  # the processes that use it go first
            procs.stop()
        pg.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


class PrivateRedis:
    """A redis-server of our own (no persistence) that a test may stop and start again on its port."""

    def __init__(self, logdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.logdir = logdir
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.logdir / "redis.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for_port(self.port, self.proc, seconds=10)

    def kill(self) -> None:
        if self.proc is not None:
            Processes.kill(self.proc)
            self.proc = None


@pytest.fixture
def private_redis(tmp_path):
    redis = PrivateRedis(tmp_path)
    redis.start()
    yield redis
    for procs in _running:
        procs.stop()
    redis.kill()


def create_reviewer(processes: Processes, username: str) -> str:
    """A Reviewers user and its API token, in the processes' database (through ``manage.py shell``)."""
    code = (
        "from django.contrib.auth.models import Group, User;"
        "from rest_framework.authtoken.models import Token;"
        "from agentrun.core.access import REVIEWERS, ensure_groups;"
        "ensure_groups();"
        f"u = User.objects.create_user({username!r}, password='pw-12345678');"
        "u.groups.add(Group.objects.get(name=REVIEWERS));"
        "print('TOKEN=' + Token.objects.create(user=u).key)"
    )
    out = processes.manage("shell", "-c", code)
    return next(line[6:] for line in out.splitlines() if line.startswith("TOKEN="))


# --- the processes' API, as a client sees it -------------------------------------------------------
ORIGIN = {"origin": "http://localhost"}
SLOW = '/tool slow-send {{"to": "ada@example.com", "seconds": {seconds}}}'


class Api:
    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"
        self.token = token

    def post(self, path: str, body: dict, **kwargs) -> requests.Response:
        return self.session.post(f"http://127.0.0.1:{self.port}{path}", json=body, timeout=30, **kwargs)

    def get(self, path: str, **kwargs) -> requests.Response:
        return self.session.get(f"http://127.0.0.1:{self.port}{path}", timeout=30, **kwargs)

    def run(self, run_id: str) -> dict:
        return self.get(f"/api/runs/{run_id}").json()

    def wait_final(self, run_id: str, seconds: float) -> dict:
        return wait_until(
            lambda: (r := self.run(run_id))["status"] in ("completed", "failed", "cancelled", "expired") and r,
            seconds,
            f"run {run_id} to end",
            interval=0.2,
        )


def sse_events(response: requests.Response):
    """(id, event, data) of a ``text/event-stream`` response."""
    event_id, event, data = None, None, []
    for raw in response.iter_lines(decode_unicode=True):
        if raw == "":
            if data:
                yield event_id, event, "\n".join(data)
            event_id, event, data = None, None, []
        elif raw.startswith("id:"):
            event_id = raw[3:].strip()
        elif raw.startswith("event:"):
            event = raw[6:].strip()
        elif raw.startswith("data:"):
            data.append(raw[5:].strip())


def lease_pid(owner: str | None) -> int | None:
    return int(owner.split(":")[1]) if owner and not owner.startswith("dispatch:") else None

"""``scripts/production.sh`` as an operator runs it: a production environment (DEBUG off, HTTPS on,
SMTP mail, a real secret), PostgreSQL and Redis; it must pass its own deploy check, start every web
process and worker, keep them alive and stop them cleanly."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import time

import pytest
import requests

from tests.helpers.system import Processes, figures, wait_until

pytestmark = [pytest.mark.system, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports (the script listens on PORT, PORT+1, …)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + count > 65535:
            continue
        try:
            for port in range(first, first + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise RuntimeError("no consecutive free ports")


def production_env(web: int, workers: int) -> tuple[dict[str, str], list[int]]:
    port = free_ports(web)
    env = {
        "DEBUG": "",
        "SECRET_KEY": "prod-" + "k3y-Z" * 12,  # ≥ 50 characters, varied: the deploy check's rule
        "ALLOWED_HOSTS": "agentrun.example.com,127.0.0.1",
        "CSRF_TRUSTED_ORIGINS": "https://agentrun.example.com",
        "AGENTRUN_HTTPS": "1",
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "AGENTRUN_WEB_PROCESSES": str(web),
        "AGENTRUN_WORKERS": str(workers),
        "PORT": str(port),
        "PYTHON": sys.executable,
    }
    return env, list(range(port, port + web))


def healthz_status(port: int) -> int | None:
    try:
        return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code
    except requests.RequestException:
        return None


def healthz(port: int) -> dict | None:
    try:
        response = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    except requests.RequestException:
        return None
    return response.json() if response.status_code == 200 else None


def all_healthy(ports: list[int], workers: int):
    """Every web port answers ``ok`` and sees ``workers`` distinct worker processes sweeping."""
    reports = [healthz(port) for port in ports]
    if not all(r and r["status"] == "ok" for r in reports):
        return None
    pids = {w["pid"] for w in reports[0]["workers"] if w["role"] == "worker"}
    return pids if len(pids) >= workers else None


def start(processes: Processes, web: int = 2, workers: int = 2, env: dict[str, str] | None = None):
    prod, ports = production_env(web, workers)
    script = processes.script("production", "scripts/production.sh", {**prod, **(env or {})})

    def healthy():
        assert script.poll() is None, f"production.sh exited with {script.returncode}:\n{processes.log('production')}"
        return all_healthy(ports, workers)

    return script, ports, wait_until(healthy, 90, "every web port healthy")


def test_production_script_passes_its_deploy_check_and_serves_healthy_on_every_port(processes):
    script, ports, _ = start(processes, web=2, workers=2)
    log = processes.log("production")
    assert "System check identified no issues" in log, log
    assert "drf_spectacular.W001" not in log
    for port in ports:
        # The HTTPS redirect exempts the probe; any other page redirects to https.
        assert healthz(port)["database"]["ok"]
        other = requests.get(f"http://127.0.0.1:{port}/approvals/", allow_redirects=False, timeout=5)
        assert other.status_code == 301 and other.headers["Location"].startswith("https://")
    assert script.poll() is None


STARTED = re.compile(r"supervisor: started (\S+) \(pid (\d+)\)")


def children(processes: Processes) -> dict[str, int]:
    """The supervisor's processes by name (the latest pid of each), from its log."""
    return {name: int(pid) for name, pid in STARTED.findall(processes.log("production"))}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie is gone, just not reaped
    except FileNotFoundError:
        return False


def test_a_dead_worker_is_restarted_with_backoff_and_the_web_processes_stay_healthy(processes):
    script, ports, _ = start(processes, web=2, workers=2)
    before = children(processes)
    assert set(before) == {"web-0", "web-1", "worker-1", "worker-2", "notify-1"}
    victim = before["worker-1"]
    os.kill(victim, signal.SIGKILL)

    # The web processes serve throughout; the worker comes back under a new pid.
    def back():
        assert all(healthz_status(port) == 200 for port in ports), "a web process stopped serving"
        pid = children(processes)["worker-1"]
        return pid if pid != victim and alive(pid) else None

    reborn = wait_until(back, 20, "worker-1 to be restarted", interval=0.2)
    log = processes.log("production")
    assert f"worker-1 (pid {victim}) exited with signal SIGKILL; restarting in 1 s" in log, log
    wait_until(lambda: reborn in (all_healthy(ports, 2) or ()), 20, "the new worker to sweep")
    after = children(processes)
    assert {name: after[name] for name in ("web-0", "web-1", "worker-2", "notify-1")} == {
        name: before[name] for name in ("web-0", "web-1", "worker-2", "notify-1")
    }, "the other processes were left alone"
    assert all(alive(pid) for pid in after.values())

    # Dying again at once: the backoff doubles.
    os.kill(reborn, signal.SIGKILL)
    wait_until(
        lambda: f"worker-1 (pid {reborn}) exited with signal SIGKILL; restarting in 2 s" in processes.log("production"),
        10,
        "the second restart to be announced",
    )
    wait_until(
        lambda: alive(children(processes)["worker-1"]) and children(processes)["worker-1"] != reborn,
        20,
        "a third worker-1",
    )
    assert script.poll() is None


def test_sigterm_stops_every_process_gracefully_within_the_drain_bound(processes):
    drain = 4
    script, ports, _ = start(processes, web=2, workers=2, env={"AGENTRUN_DRAIN_SECONDS": str(drain)})
    pids = children(processes)
    assert len(pids) == 5 and all(alive(pid) for pid in pids.values())  # 2 web, 2 workers, 1 notify
    stopped = time.monotonic()
    script.send_signal(signal.SIGTERM)
    script.wait(timeout=drain + 5 + 5)
    took = time.monotonic() - stopped
    figures(f"production.sh: SIGTERM to every process gone {took:.1f} s (2 web, 2 workers, 1 notify, idle)")
    assert script.returncode == 0
    assert not [name for name, pid in pids.items() if alive(pid)], "every process is gone"
    log = processes.log("production")
    assert "SIGTERM: stopping 5 processes" in log and "all processes stopped" in log
    assert "SIGKILL" not in log, "each process stopped on SIGTERM, none had to be killed"
    assert all(healthz_status(port) is None for port in ports)

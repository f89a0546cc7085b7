"""``scripts/production.sh`` as an operator runs it: a production environment (DEBUG off, HTTPS on,
SMTP mail, a real secret), PostgreSQL and Redis; it must pass its own deploy check, start every web
process and worker, keep them alive and stop them cleanly."""

from __future__ import annotations

import socket
import sys

import pytest
import requests

from tests.system.conftest import Processes, wait_until

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


def start(processes: Processes, web: int = 2, workers: int = 2):
    env, ports = production_env(web, workers)
    script = processes.script("production", "scripts/production.sh", env)


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

"""Headers and files (issue 24, docs/security.md): a Content-Security-Policy without inline script on every
page, the data directory and its files private to their owner, no token in the access log, and
``check --deploy`` clean with the production environment."""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.users import make_user

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

pytestmark = pytest.mark.django_db


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    # A process as an operator starts it: none of the test runner's own settings (the browser tests'
    # conftest allows async-unsafe calls in the runner, which a deployment must not).
    unset = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DJANGO_ALLOW_ASYNC_UNSAFE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    return env | {"AGENTRUN_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT), "DEBUG": "1"} | extra


def _directives(header: str) -> dict[str, list[str]]:
    return {name: values for name, *values in (part.split() for part in header.split(";") if part.strip())}


# --- Content-Security-Policy ----------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/accounts/login/", "/approvals/", "/admin/login/", "/api/docs/", "/api/agents/"])
def test_every_response_carries_a_policy_without_inline_script(client, path):
    client.force_login(make_user("csp-root", group=None, is_staff=True, is_superuser=True))
    response = client.get(path)
    policy = _directives(response["Content-Security-Policy"])
    assert policy["script-src"] == ["'self'"]  # no 'unsafe-inline', no 'unsafe-eval', no nonce needed
    assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    if response["Content-Type"].startswith("text/html"):
        # Every <script> of the page is a file of this origin.
        scripts = re.findall(r"<script\b([^>]*)>", response.content.decode())
        assert all("src=" in attributes for attributes in scripts), scripts


# --- files ----------------------------------------------------------------------------------------
def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_data_directory_and_its_files_are_private(tmp_path):
    data = tmp_path / "var"
    migrate = [PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"]
    subprocess.run(migrate, cwd=ROOT, env=_env(data), check=True, preexec_fn=lambda: os.umask(0o022))  # noqa: PLW1509
    assert _mode(data) == 0o700
    for name in ("secret_key", "agentrun.sqlite3"):
        assert _mode(data / name) == 0o600, name
    # Files left world-readable by an older version are tightened at the next start.
    (data / "secret_key").chmod(0o644)
    (data / "agentrun.sqlite3").chmod(0o644)
    data.chmod(0o755)
    subprocess.run([PYTHON, "manage.py", "check", "-v", "0"], cwd=ROOT, env=_env(data), check=True)
    assert (_mode(data), _mode(data / "secret_key"), _mode(data / "agentrun.sqlite3")) == (0o700, 0o600, 0o600)


# --- the access log -------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_tokens_in_urls_never_reach_the_access_log(tmp_path):
    data, log = tmp_path / "var", tmp_path / "access.log"
    subprocess.run([PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=_env(data), check=True)
    port = _free_port()
    server = subprocess.Popen(
        [PYTHON, "-m", "agentrun.server.web", "-b", "127.0.0.1", "-p", str(port), "--access-log", str(log)]
        + ["agentrun.asgi:application"],
        cwd=ROOT,
        env=_env(data),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while _get_or_none(f"{base}/healthz") is None:
            assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        secrets = ["LinkTokenSecret123", "ResetTokenSecret456", "QueryTokenSecret789"]
        _get(f"{base}/approvals/links/{secrets[0]}/")
        _get(f"{base}/accounts/reset/MQ/{secrets[1]}/")
        _get(f"{base}/api/agents/?token={secrets[2]}&limit=5")
        deadline = time.monotonic() + 10
        while log.read_text().count("\n") < 4:  # /healthz and the three requests, each logged when it ends
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        server.terminate()
        server.wait(timeout=15)
    written = log.read_text()
    assert not [s for s in secrets if s in written], written
    assert "/approvals/links/[redacted]/" in written and "token=[redacted]&limit=5" in written


def _get_or_none(url: str) -> int | None:
    try:
        return _get(url)
    except OSError:
        return None


# --- check --deploy -------------------------------------------------------------------------------
def test_check_deploy_is_clean_with_the_production_environment(tmp_path):
    production = _env(
        tmp_path,
        DEBUG="0",
        SECRET_KEY="x" * 20 + "production-secret-key-for-the-deploy-check-0123456789",
        ALLOWED_HOSTS="agentrun.example.com",
        AGENTRUN_HTTPS="1",
        DATABASE_URL=os.environ.get("DATABASE_URL") or f"sqlite:///{tmp_path / 'db.sqlite3'}",
        AGENTRUN_TASK_BACKEND="django_tasks_db.DatabaseBackend",
        EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
    )
    result = subprocess.run(
        [PYTHON, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=production,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout

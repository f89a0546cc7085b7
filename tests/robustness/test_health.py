"""``/healthz``: the database, the channel layer and the workers seen recently, without authentication."""

from __future__ import annotations

import json
import socket
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.utils import timezone

from agentrun.core import retention, workers
from agentrun.core.models import WorkerHeartbeat
from agentrun.engine.sweeper import sweep_once
from agentrun.server import health


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/healthz", "/healthz/"])
def test_ok_once_the_embedded_sweeper_has_swept(client, settings, path):
    async_to_sync(sweep_once)()  # what the server's own sweeper does on the embedded default
    response = client.get(path)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert "no-cache" in response["Cache-Control"]
    body = response.json()
    assert body["status"] == "ok"
    assert body["database"]["ok"] is True and body["database"]["latencyMs"] >= 0
    assert body["channelLayer"] == {
        "ok": True,
        "backend": settings.CHANNEL_LAYERS["default"]["BACKEND"],
        "latencyMs": body["channelLayer"]["latencyMs"],
    }
    assert body["workersSeenRecently"] is True
    [me] = [w for w in body["workers"] if w["id"] == workers.process_id()]
    assert me["host"] == socket.gethostname() and me["role"] == "server"
    assert set(me) == {"id", "host", "pid", "role", "seenAt"}


@pytest.mark.django_db
def test_an_agentrun_worker_reports_itself_as_a_worker(client, monkeypatch):
    monkeypatch.setattr(workers, "process_role", "worker")
    async_to_sync(sweep_once)()
    [me] = [w for w in client.get("/healthz").json()["workers"] if w["id"] == workers.process_id()]
    assert me["role"] == "worker"


@pytest.mark.django_db
def test_without_a_recent_worker_it_is_degraded_but_still_serving(client, settings):
    async_to_sync(sweep_once)()
    stale = timezone.now() - timedelta(seconds=3 * settings.AGENTRUN_SWEEP_SECONDS + 1)
    WorkerHeartbeat.objects.update(seen_at=stale)
    response = client.get("/healthz")
    assert response.status_code == 200, "a web process without workers still serves: not a reason to kill it"
    body = response.json()
    assert body["status"] == "degraded"
    assert body["workers"] == [] and body["workersSeenRecently"] is False
    assert body["database"]["ok"] and body["channelLayer"]["ok"]


@pytest.mark.django_db
def test_heartbeats_of_long_gone_processes_are_forgotten():
    WorkerHeartbeat.objects.create(id="gone:1", host="gone", pid=1, seen_at=timezone.now() - timedelta(days=2))
    workers.record_heartbeat()
    retention.prune_once()  # the sweep's retention (AGENTRUN_RETAIN_HEARTBEATS_DAYS, 1 by default)
    assert list(WorkerHeartbeat.objects.values_list("id", flat=True)) == [workers.process_id()]


@pytest.mark.django_db
def test_a_broken_channel_layer_is_503(client, settings):
    async_to_sync(sweep_once)()
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [f"redis://127.0.0.1:{_closed_port()}/0"]},
        }
    }
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded"
    assert body["channelLayer"]["ok"] is False
    assert body["channelLayer"]["backend"] == "channels_redis.core.RedisChannelLayer"
    assert body["channelLayer"]["error"]
    assert body["database"]["ok"] is True


@pytest.mark.django_db
def test_no_channel_layer_at_all_is_503(client, settings):
    settings.CHANNEL_LAYERS = {}
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["channelLayer"]["ok"] is False


@pytest.mark.django_db
def test_only_get(client):
    assert client.post("/healthz").status_code == 405


@pytest.mark.django_db(transaction=True)
async def test_the_real_asgi_server_sweeps_and_reports_itself(settings):
    """The embedded default end to end: the ASGI application starts the sweeper on its loop at the first
    request, and a later /healthz sees its heartbeat — no worker process, no explicit sweep."""
    import asyncio

    from agentrun.asgi import application
    from agentrun.engine import runtime

    settings.AGENTRUN_EMBEDDED_SWEEPER = True
    runtime._bound = None  # a previous test's loop: bind this one, as a fresh server process would

    async def get() -> tuple[int, dict]:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/healthz",
            "raw_path": b"/healthz",
            "query_string": b"",
            "root_path": "",
            "client": ("127.0.0.1", 50000),
            "server": ("localhost", 80),
            "headers": [(b"host", b"localhost")],
        }
        comm = ApplicationCommunicator(application, scope)
        await comm.send_input({"type": "http.request", "body": b"", "more_body": False})
        start = await comm.receive_output(timeout=10)
        body = await comm.receive_output(timeout=10)
        return start["status"], json.loads(body["body"])

    try:
        for _ in range(100):
            status, body = await get()
            if body["workersSeenRecently"]:
                break
            await asyncio.sleep(0.1)
        assert status == 200 and body["status"] == "ok", body
        assert [w["role"] for w in body["workers"]] == ["server"]
    finally:
        for task in list(runtime._tasks):
            task.cancel()
        runtime._bound = None


@pytest.mark.django_db
def test_a_draining_web_process_answers_503_so_the_load_balancer_takes_it_out(client, monkeypatch):
    async_to_sync(sweep_once)()
    monkeypatch.setattr(health, "draining", True)  # what agentrun.server.web sets on SIGTERM
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["status"] == "draining"


# --- /readyz: can this process serve (docs/operations.md "Health") ------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/readyz", "/readyz/"])
def test_ready_when_the_database_the_channel_layer_and_the_migrations_are(client, path):
    response = client.get(path)
    assert response.status_code == 200
    assert "no-cache" in response["Cache-Control"]
    body = response.json()
    assert body["status"] == "ready"
    assert body["database"]["ok"] is True
    assert body["channelLayer"]["ok"] is True
    assert body["migrations"] == {"ok": True}


@pytest.mark.django_db
def test_not_ready_when_the_channel_layer_is_unreachable(client, settings):
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [f"redis://127.0.0.1:{_closed_port()}/0"]},
        }
    }
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not ready"
    assert body["channelLayer"]["ok"] is False and body["channelLayer"]["error"]
    assert body["database"]["ok"] is True


@pytest.mark.django_db
def test_ready_without_any_worker_seen(client):
    """A web process with no worker alive can still serve requests: ready (``/healthz`` says degraded)."""
    WorkerHeartbeat.objects.all().delete()
    assert client.get("/healthz").json()["status"] == "degraded"
    assert client.get("/readyz").status_code == 200


@pytest.mark.django_db
def test_not_ready_while_draining(client, monkeypatch):
    monkeypatch.setattr(health, "draining", True)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["status"] == "draining"

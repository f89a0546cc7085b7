"""Retention (docs/operations.md "Retention"): the sweep and ``agentrun_prune`` remove exactly what is past
the settings' retention, in bounded batches, and never the audit record (runs, decisions, messages, steps)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from agentrun.core import retention
from agentrun.core.models import (
    Decision,
    IdempotencyKey,
    Message,
    OutboxEvent,
    Run,
    RunChunk,
    RunStep,
    SuspendedToolCall,
    WorkerHeartbeat,
)
from notifications.models import (
    EmailNotice,
    SlackDelivery,
    SlackDestination,
    SlackMessage,
    WebhookDelivery,
    WebhookEndpoint,
)
from tests.helpers.decisions import decide_call
from tests.helpers.runs import start_run, suspend, wait_until_final
from tests.helpers.users import make_user

pytestmark = pytest.mark.django_db(transaction=True)

DAY = 86400.0
RETENTION = {
    "events": 30 * DAY,
    "deliveries": 20 * DAY,
    "notices": 20 * DAY,
    "idempotency_keys": 24 * 3600.0,
    "heartbeats": 1 * DAY,
    "task_results": 7 * DAY,
    "chunk_logs": 10 * DAY,
}


def ago(days: float):  # noqa: ANN201 - a datetime
    return timezone.now() - timedelta(days=days)


def _event(days: float, handled: bool = True) -> OutboxEvent:
    return OutboxEvent.objects.create(
        type="run.completed", agent_id="support-agent", run_id="r", data={}, created_at=ago(days),
        handled_at=ago(days) if handled else None,
    )  # fmt: skip


def _task(days: float, status: str = "SUCCESSFUL") -> DBTaskResult:
    return DBTaskResult.objects.create(
        status=status, args_kwargs={}, task_path="x.y", backend_name="default", run_after=ago(days),
        finished_at=ago(days) if status != "READY" else None, exception_class_path="", traceback="",
    )  # fmt: skip


def _final_run(days: float, *, declined: bool = False) -> str:
    """A real run with its chunk log, messages, steps (and a decision), ended ``days`` ago."""
    if declined:
        run_id = suspend("send-email", {"to": "a@example.com", "subject": "s", "body": "b"}, thread=f"ret-{days}")
        decide_call(agent_id="support-agent", run_id=run_id, kind="decline")
        wait_until_final(run_id)
    else:
        run_id = start_run("hello", thread=f"ret-{days}")
    Run.objects.filter(pk=run_id).update(completed_at=ago(days))
    return run_id


@pytest.fixture
def records(settings):
    settings.AGENTRUN_RETENTION = RETENTION
    endpoint = WebhookEndpoint.objects.create(url="https://hooks.example.com/x", secret="whsec_eA==")
    second = WebhookEndpoint.objects.create(url="https://hooks.example.com/y", secret="whsec_eA==")
    user = make_user("ret-user", group=None)
    old_event, recent_event, untaken_event = _event(40), _event(10), _event(40, handled=False)
    gone = {
        "outbox events": [old_event.pk],
        "webhook deliveries": [
            WebhookDelivery.objects.create(
                endpoint=endpoint, event=recent_event, status="delivered", created_at=ago(25)
            ).pk
        ],
        "email notices": [
            EmailNotice.objects.create(user=user, event=recent_event, sent_at=ago(25), created_at=ago(25)).pk
        ],
        "idempotency keys": [],
        "worker heartbeats": [WorkerHeartbeat.objects.create(id="gone:1", host="gone", pid=1, seen_at=ago(2)).pk],
        "task results": [_task(8).pk, _task(9, "FAILED").pk],
    }
    kept = {
        "outbox events": [recent_event.pk, untaken_event.pk],
        "webhook deliveries": [  # still being attempted; finished too recently
            WebhookDelivery.objects.create(
                endpoint=endpoint, event=untaken_event, status="pending", created_at=ago(25)
            ).pk,
            WebhookDelivery.objects.create(endpoint=second, event=untaken_event, status="failed", created_at=ago(5)).pk,
        ],
        "email notices": [EmailNotice.objects.create(user=user, event=untaken_event, created_at=ago(25)).pk],
        "worker heartbeats": [WorkerHeartbeat.objects.create(id="here:1", host="here", pid=1).pk],
        "task results": [_task(1).pk, _task(30, "READY").pk],
    }
    for hours, bucket in ((25, gone), (23, kept)):
        key = IdempotencyKey.objects.create(
            user=user, key=f"k{hours}", request_fingerprint="f", run_id="r", response_status=202, response_body={},
        )  # fmt: skip
        IdempotencyKey.objects.filter(pk=key.pk).update(created_at=timezone.now() - timedelta(hours=hours))
        bucket.setdefault("idempotency keys", []).append(key.pk)
    compacted = [_final_run(20), _final_run(15, declined=True)]
    left = [_final_run(5, declined=True), suspend("send-email", {"to": "b@example.com", "subject": "s", "body": "b"})]
    # Slack messages go once their call no longer waits and their deliveries are gone: a waiting call's
    # message stays (its buttons refer to it), however old.
    destination = SlackDestination.objects.create(name="d", channel="C1", owner=user)
    waiting = SuspendedToolCall.objects.get(run_id=left[1])

    def message(days: float, run_id: str = "r", tool_call_id: str = "c") -> SlackMessage:
        return SlackMessage.objects.create(
            destination=destination, agent_id="support-agent", run_id=run_id, thread_id="t",
            tool_call_id=tool_call_id, args_fingerprint="f", call={}, created_at=ago(days),
        )  # fmt: skip

    logged = message(25, tool_call_id="c-logged")
    SlackDelivery.objects.create(message=logged, action="update", status="delivered", created_at=ago(5))
    gone["Slack messages"] = [message(25, tool_call_id="c-old").pk]
    kept["Slack messages"] = [
        message(25, waiting.run_id, waiting.tool_call_id).pk,
        logged.pk,
        message(5, tool_call_id="c-recent").pk,
    ]
    return gone, kept, compacted, left


MODELS = {
    "outbox events": OutboxEvent,
    "webhook deliveries": WebhookDelivery,
    "email notices": EmailNotice,
    "Slack messages": SlackMessage,
    "idempotency keys": IdempotencyKey,
    "worker heartbeats": WorkerHeartbeat,
    "task results": DBTaskResult,
}


def _audit() -> tuple[int, int, int, int]:
    return Run.objects.count(), Decision.objects.count(), Message.objects.count(), RunStep.objects.count()


def test_prune_removes_exactly_what_the_retention_says_and_nothing_of_the_audit(records):
    gone, kept, compacted, left = records
    audit = _audit()
    chunks = {run_id: RunChunk.objects.filter(run_id=run_id).count() for run_id in compacted + left}
    assert all(chunks.values())

    dry = StringIO()
    call_command("agentrun_prune", "--dry-run", stdout=dry)
    for name, ids in gone.items():
        assert f"{name}: {len(ids)} would be removed" in dry.getvalue()
    assert f"chunk logs: {sum(chunks[r] for r in compacted)} would be removed" in dry.getvalue()
    assert RunChunk.objects.filter(run_id__in=compacted).exists()  # a dry run removes nothing
    assert all(MODELS[name].objects.filter(pk__in=ids).count() == len(ids) for name, ids in gone.items())

    out = StringIO()
    call_command("agentrun_prune", stdout=out)
    for name, ids in gone.items():
        assert f"{name}: {len(ids)} removed" in out.getvalue()
        assert not MODELS[name].objects.filter(pk__in=ids).exists()
    for name, ids in kept.items():
        assert MODELS[name].objects.filter(pk__in=ids).count() == len(ids), name
    assert not RunChunk.objects.filter(run_id__in=compacted).exists()
    assert all(RunChunk.objects.filter(run_id=run_id).count() == chunks[run_id] for run_id in left)
    assert _audit() == audit  # runs, decisions, messages, steps: all still there


def test_the_sweep_prunes_in_bounded_batches_and_keeps_chunk_logs_unless_told(records, settings):
    gone, _, compacted, _ = records
    settings.AGENTRUN_RETENTION = RETENTION | {"chunk_logs": None}
    first = {p.name: p for p in retention.prune_once(batch=1)}
    assert first["task results"].removed == 1 and first["task results"].more  # two due, one per batch
    assert first["chunk logs"].kept_forever and RunChunk.objects.filter(run_id__in=compacted).exists()
    second = {p.name: p for p in retention.prune_once(batch=1)}
    assert second["task results"].removed == 1
    assert not DBTaskResult.objects.filter(pk__in=gone["task results"]).exists()
    out = StringIO()
    call_command("agentrun_prune", stdout=out)
    assert "chunk logs: kept (AGENTRUN_RETAIN_CHUNKS_DAYS is not set)" in out.getvalue()

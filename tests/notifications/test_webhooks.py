"""Outbound webhooks (issue 14, docs/notifications.md#2-webhooks): every state change reaches subscribed
endpoints, signed the Standard Webhooks way, at least once, retried with exponential backoff — and never
slows the engine."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentrun import get_agent
from agentrun.core.models import Decision, OutboxEvent, Run, Snapshot
from agentrun.engine.decisions import cancel_run, expire_due_runs
from agentrun.engine.types import Decider
from notifications import delivery
from notifications.models import WebhookDelivery
from tests.helpers.decisions import decide_call
from tests.helpers.notifications import make_endpoint
from tests.helpers.runs import email_run, start, wait_rested
from tests.helpers.users import make_user
from tests.helpers.waiting import wait_for_tasks, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The receiver's side, as docs/notifications.md shows it (the standard library only)."""
    headers = {k.lower(): v for k, v in headers.items()}
    msg_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
    if abs(time.time() - int(timestamp)) > 300:
        return False
    key = base64.b64decode(secret.removeprefix("whsec_")) if secret.startswith("whsec_") else secret.encode()
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(expected, s) for s in headers["webhook-signature"].split())


def approve(run_id: str, **kwargs) -> None:
    decide_call(agent_id="support-agent", run_id=run_id, kind="approve", **kwargs)
    wait_rested(run_id)


def test_a_suspended_run_reaches_its_endpoint_signed_with_the_run_as_the_listing_shows_it(receiver):
    endpoint = make_endpoint(receiver.url, events=["run.suspended"])
    run_id = email_run(thread="t-hook")

    [request] = receiver.wait_for(1)
    assert verify(endpoint.secret, request.headers, request.body)
    assert request.headers["content-type"] == "application/json"
    body = json.loads(request.body)
    event = OutboxEvent.objects.get(type="run.suspended", run_id=run_id)
    assert body["id"] == request.headers["webhook-id"] == event.id
    assert body["type"] == "run.suspended"
    assert body["createdAt"].endswith("Z")
    listed = get_agent("support-agent")
    page = async_to_sync(listed.list_suspended_runs)(thread_id="t-hook")
    assert body["data"] == page.runs[0].to_dict()  # the REST listing's AgentRun
    assert body["data"]["toolCalls"][0]["argsFingerprint"]
    row = wait_until(lambda: WebhookDelivery.objects.filter(status="delivered").first(), what="delivered")
    assert (row.attempts, row.response_status, row.endpoint_id) == (1, 200, endpoint.id)


def test_signatures_follow_standard_webhooks_and_catch_tampering(receiver):
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
    endpoint = make_endpoint(receiver.url, secret=secret)
    email_run(thread="t-sig")
    [request] = receiver.wait_for(1)
    assert verify(endpoint.secret, request.headers, request.body)  # whsec_: the key is the decoded bytes
    assert not verify("whsec_" + base64.b64encode(b"another key").decode(), request.headers, request.body)
    assert not verify(endpoint.secret, request.headers, request.body.replace(b"ann@", b"eve@"))
    stale = {**request.headers, "webhook-timestamp": str(int(request.headers["webhook-timestamp"]) - 3600)}
    assert not verify(endpoint.secret, stale, request.body)  # and a replayed old message is refused
    assert request.headers["webhook-signature"].startswith("v1,")


def test_every_state_change_is_an_event_in_order(receiver):
    make_endpoint(receiver.url)  # every event, every agent
    run_id = email_run(thread="t-life")
    approve(run_id, decider=Decider.system("ops"))
    types = list(OutboxEvent.objects.filter(run_id=run_id).order_by("created_at", "id").values_list("type", flat=True))
    assert types == ["run.suspended", "toolcall.decided", "run.completed"]
    decided = OutboxEvent.objects.get(run_id=run_id, type="toolcall.decided")
    assert decided.data == Decision.objects.get(run_id=run_id).to_dict()  # the audit trail's shape
    assert OutboxEvent.objects.get(run_id=run_id, type="run.completed").data["status"] == "completed"

    cancelled = email_run(thread="t-cancel")
    cancel_run(run_id=cancelled)
    expiring = email_run(thread="t-expire")
    Snapshot.objects.filter(run_id=expiring).update(expires_at=timezone.now())
    Run.objects.filter(pk=expiring).update(expires_at=timezone.now())
    assert expire_due_runs() == 1
    failed, _ = async_to_sync(start)("support-agent", "/fail server_error", thread="t-fail")
    final = {r: OutboxEvent.objects.filter(run_id=r).last().type for r in (cancelled, expiring, failed.run_id)}
    assert final == {cancelled: "run.cancelled", expiring: "run.expired", failed.run_id: "run.failed"}
    assert OutboxEvent.objects.get(run_id=failed.run_id).data["lastError"]["code"] == "server_error"

    delivered = wait_until(lambda: WebhookDelivery.objects.filter(status="delivered").count() == 8 or None)
    assert delivered
    assert len({r.headers["webhook-id"] for r in receiver.requests}) == len(receiver.requests) == 8


def test_endpoints_receive_only_the_events_and_agents_they_subscribe_to(receiver):
    make_endpoint(receiver.url, events=["run.completed"], agents=["billing-agent"])
    run_id = email_run(thread="t-filter")  # support-agent: not subscribed
    approve(run_id)
    stream, _ = async_to_sync(start)("billing-agent", "hello", thread="t-filter-b")
    wait_until(lambda: WebhookDelivery.objects.filter(status="delivered").exists())
    [request] = receiver.requests
    body = json.loads(request.body)
    assert (body["type"], body["data"]["id"], body["data"]["agentId"]) == (
        "run.completed",
        stream.run_id,
        "billing-agent",
    )


def test_nothing_is_written_when_nobody_subscribes():
    """No endpoint and nobody to email: a run's state changes write no event and cost no query."""
    run_id = email_run(thread="t-quiet")
    with CaptureQueriesContext(connection) as quiet:
        approve(run_id)
    assert not OutboxEvent.objects.exists()
    assert not any("outboxevent" in q["sql"] for q in quiet.captured_queries)

    make_endpoint("http://127.0.0.1:9/unused", agents=["billing-agent"])  # someone else's agent
    approve(email_run(thread="t-quiet-2"))
    assert not OutboxEvent.objects.exists()


def test_a_failing_receiver_is_retried_with_exponential_backoff(receiver, fast_retries):
    receiver.answers = [500, 503, 200]
    make_endpoint(receiver.url, events=["run.suspended"])
    email_run(thread="t-retry")
    receiver.wait_for(1)
    row = wait_until(lambda: WebhookDelivery.objects.filter(attempts=1).first(), what="the first attempt")
    assert (row.status, row.response_status, row.last_error) == ("pending", 500, "HTTP 500")
    assert row.next_attempt_at > row.last_attempt_at
    # Each failed attempt enqueued the next one (run_after its backoff): no sweep is needed.
    wait_until(lambda: WebhookDelivery.objects.filter(status="delivered").first(), what="the retried delivery")
    row.refresh_from_db()
    assert (row.attempts, row.response_status, row.next_attempt_at) == (3, 200, None)
    first, second, third = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == third.headers["webhook-id"]
    assert first.body == second.body == third.body
    # 0.3 s after the first failure, 0.6 s after the second: each wait doubles.
    assert second.at - first.at >= 0.3
    assert third.at - second.at >= 0.6
    assert [delivery.backoff(n).total_seconds() for n in (1, 2, 3, 4)] == [0.3, 0.6, 1.2, 2.4]


def test_a_delivery_gives_up_after_the_last_attempt(receiver, fast_retries, settings):
    settings.AGENTRUN_WEBHOOK_MAX_ATTEMPTS = 2
    receiver.answers = [500]
    make_endpoint(receiver.url, events=["run.suspended"])
    email_run(thread="t-give-up")
    wait_until(lambda: WebhookDelivery.objects.filter(status="failed").first(), what="the delivery given up")
    row = WebhookDelivery.objects.get()
    assert (row.attempts, row.next_attempt_at, len(receiver.requests)) == (2, None, 2)


def test_an_unreachable_receiver_is_an_error_recorded_on_the_delivery(fast_retries):
    make_endpoint("http://127.0.0.1:9/nobody-listens", events=["run.suspended"])
    email_run(thread="t-unreachable")
    row = wait_until(lambda: WebhookDelivery.objects.filter(attempts=1).first())
    assert row.status == "pending" and row.response_status is None
    assert "refused" in row.last_error.lower()


def test_a_hanging_receiver_does_not_slow_a_decision_or_a_run(receiver, settings):
    settings.AGENTRUN_WEBHOOK_TIMEOUT_SECONDS = 20
    receiver.answers = ["hang"]
    make_endpoint(receiver.url, events=["toolcall.decided", "run.completed"])
    run_id = email_run(thread="t-hang")
    decide_call(agent_id="support-agent", run_id=run_id, kind="approve")
    run = wait_rested(run_id)
    # The run went on and finished while the receiver still holds the first delivery open.
    assert run.status == "completed"
    receiver.wait_for(2)  # both deliveries were started, each in its own thread
    wait_until(lambda: receiver.hanging == 2, what="two hanging deliveries")
    assert WebhookDelivery.objects.filter(status="pending").count() == 2
    receiver.release()
    wait_until(lambda: WebhookDelivery.objects.filter(status="delivered").count() == 2 or None)


def test_events_left_behind_by_a_dead_process_are_delivered_by_the_sweep(receiver, monkeypatch):
    make_endpoint(receiver.url, events=["run.suspended"])
    # The process "dies" after the commit, before handing the event over.
    monkeypatch.setattr(delivery.notifier, "recorded", lambda event_id: None)
    email_run(thread="t-dead")
    event = OutboxEvent.objects.get()
    assert event.handled_at is None and not WebhookDelivery.objects.exists()
    delivery.sweep()  # a fresh event is left to the process that recorded it, for a moment
    wait_for_tasks()
    assert not receiver.requests
    OutboxEvent.objects.update(created_at=event.created_at - delivery.UNTAKEN_GRACE)
    delivery.sweep()
    [request] = receiver.wait_for(1)
    assert request.headers["webhook-id"] == event.id
    event.refresh_from_db()
    assert event.handled_at is not None
    wait_for_tasks()
    delivery.sweep()  # taken once: a second sweep sends nothing more
    wait_for_tasks()
    assert len(receiver.requests) == 1


def test_the_slack_flavour_posts_a_summary_with_a_link(receiver):
    make_endpoint(receiver.url, events=["run.suspended"], format="slack")
    email_run(thread="t slack/#1?")
    [request] = receiver.wait_for(1)
    message = json.loads(request.body)
    assert "*support-agent* waits for a decision" in message["text"]
    assert "`send-email`" in message["text"] and "ann@example.com" in message["text"]
    url = "http://agentrun.test/approvals/threads/t%20slack%2F%231%3F/"
    assert f"<{url}|Open in agentrun>" in message["text"]
    assert message["blocks"][1]["elements"][0]["url"] == url


def test_slack_text_escapes_what_the_model_wrote(receiver):
    make_endpoint(receiver.url, events=["run.suspended"], format="slack")
    email_run(thread="t-slack-esc", args={"to": "<!channel> & <http://evil|x>", "subject": "s", "body": "b"})
    [request] = receiver.wait_for(1)
    text = json.loads(request.body)["text"]
    assert "<!channel>" not in text and "&lt;!channel&gt; &amp; &lt;http://evil|x&gt;" in text


def test_the_admin_resends_a_delivery(receiver, client):
    make_endpoint(receiver.url, events=["run.suspended"])
    email_run(thread="t-resend")
    receiver.wait_for(1)
    row = wait_until(lambda: WebhookDelivery.objects.filter(status="delivered").first())
    client.force_login(make_user("root", group=None, is_staff=True, is_superuser=True))
    changelist = client.get("/admin/notifications/webhookdelivery/")
    assert changelist.status_code == 200 and row.id in changelist.content.decode()
    response = client.post(
        "/admin/notifications/webhookdelivery/",
        {"action": "resend_deliveries", "_selected_action": [row.id]},
        follow=True,
    )
    assert "Resending 1 delivery" in response.content.decode()
    second = receiver.wait_for(2)[1]
    assert second.headers["webhook-id"] == receiver.requests[0].headers["webhook-id"]  # the same event id
    wait_until(lambda: WebhookDelivery.objects.filter(pk=row.pk, attempts=2, status="delivered").exists())


def test_policy_and_link_decisions_are_events_too(receiver):
    make_endpoint(receiver.url, events=["toolcall.decided"])
    run_id = email_run(thread="t-via")
    decide_call(agent_id="support-agent", run_id=run_id, kind="decline", decider=Decider.policy({"policy": "x"}))
    wait_rested(run_id)
    [request] = receiver.wait_for(1)
    data = json.loads(request.body)["data"]
    assert (data["kind"], data["via"], data["decidedBy"], data["details"]) == (
        "decline",
        "policy",
        None,
        {"policy": "x"},
    )

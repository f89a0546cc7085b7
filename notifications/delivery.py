"""The events listener: turns outbox events into webhook deliveries and email notices, and sends them
through the task queue (queue ``notifications``).

Nothing here runs in the engine's transactions or its loop: the engine records an event in its own
transaction and ``Notifier.recorded`` enqueues ``handle_event`` there too (transactional enqueue: the
event and its task commit together, or neither). A worker of the ``notifications`` queue (production:
``manage.py agentrun_worker --queue-name notifications``; embedded: a thread of the server process)
*takes* the event once (one transaction writes its deliveries and notices and marks it handled) and
enqueues one task per delivery and per notice. Each delivery is a POST signed the Standard Webhooks
way, given up after ``AGENTRUN_WEBHOOK_TIMEOUT_SECONDS``. A 2xx answer delivers it; anything else
schedules the next attempt — a task with ``run_after`` —
``AGENTRUN_WEBHOOK_RETRY_SECONDS × 2^(attempts-1)`` later (at most an hour), until
``AGENTRUN_WEBHOOK_MAX_ATTEMPTS`` attempts failed. A receiver that hangs holds one notifications task,
never a decision, a run or a continuation worker.

At least once: a task claims its delivery by pushing ``next_attempt_at`` past the attempt's timeout in
a conditional update, so a duplicate task does not send it twice at once; every sweep (each worker;
the embedded server) enqueues again what a lost task left behind (an event untaken, a delivery or
notice overdue — the embedded backend keeps its tasks in memory) and digests that are due. Receivers
deduplicate on ``webhook-id`` (the event id) all the same.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.tasks import task
from django.utils import timezone

from agentrun.core import access, metrics, retention, secretbox
from agentrun.core.models import OutboxEvent, SuspendedToolCall
from notifications import egress, emails, payloads, signatures, slack
from notifications.models import (
    EmailNotice,
    SlackDelivery,
    SlackDestination,
    SlackMessage,
    WebhookDelivery,
    WebhookEndpoint,
)

logger = logging.getLogger("agentrun.notifications")

QUEUE = "notifications"
MAX_BACKOFF_SECONDS = 3600.0
# An event younger than this is left to the task its transaction enqueued; a delivery or notice due
# longer ago than this has lost its task (the sweep enqueues another).
UNTAKEN_GRACE = timedelta(seconds=2)
OVERDUE_GRACE = timedelta(seconds=30)
CLAIM_MARGIN_SECONDS = 30.0  # a claimed delivery is attempted again only after its timeout and this
SWEEP_BATCH = 200
USER_AGENT = "agentrun-webhooks/1"


def backoff(attempts: int) -> timedelta:
    """How long after its ``attempts``-th failed attempt a delivery is attempted again."""
    seconds = settings.AGENTRUN_WEBHOOK_RETRY_SECONDS * 2 ** max(attempts - 1, 0)
    return timedelta(seconds=min(seconds, MAX_BACKOFF_SECONDS))


def _claim_until() -> Any:
    return timezone.now() + timedelta(seconds=settings.AGENTRUN_WEBHOOK_TIMEOUT_SECONDS + CLAIM_MARGIN_SECONDS)


# --- taking an event ------------------------------------------------------------------------------
def recipients(type_: str, agent_id: str) -> list[WebhookEndpoint]:
    """The active endpoints that want this event and whose owner may view its agent (an endpoint is a
    window onto the runs: it shows no more than the person who set it up may see)."""
    endpoints = WebhookEndpoint.objects.filter(active=True, owner__isnull=False).select_related("owner")
    return [e for e in endpoints if e.subscribes(type_, agent_id) and access.can_view_agent(e.owner, agent_id)]


def take_event(event_id: str) -> bool:
    """Write the event's deliveries and notices and mark it handled, once (False: taken already).
    Their tasks are enqueued in the same transaction."""
    now = timezone.now()
    with transaction.atomic():
        event = OutboxEvent.objects.select_for_update().filter(pk=event_id, handled_at__isnull=True).first()
        if event is None:
            return False
        endpoints = recipients(event.type, event.agent_id)
        WebhookDelivery.objects.bulk_create(
            [WebhookDelivery(endpoint=e, event=event, next_attempt_at=now) for e in endpoints], ignore_conflicts=True
        )
        emails.create_notices(event)
        # Slack messages posted or updated (docs/slack.md)
        slack_deliveries = slack.create_deliveries(event, destinations=notifier.has_slack_destinations())
        event.handled_at = now
        event.save(update_fields=["handled_at"])
        # One task each: an endpoint that hangs holds its own task, not the others'.
        for delivery_id in WebhookDelivery.objects.filter(event_id=event_id).values_list("id", flat=True):
            attempt_delivery.enqueue(delivery_id)
        for delivery_id in slack_deliveries:
            slack.attempt_slack.enqueue(delivery_id)
        for notice_id, user_id, digest, due in EmailNotice.objects.filter(
            event_id=event_id, sent_at__isnull=True
        ).values_list("id", "user_id", "digest", "next_attempt_at"):
            if digest:
                send_digest.using(run_after=due).enqueue(user_id)
            else:
                send_notice.enqueue(notice_id)
    return True


@task(queue_name=QUEUE)
def handle_event(event_id: str) -> bool:
    """Take the event (its deliveries and notices go on the queue)."""
    return take_event(event_id)


# --- webhooks -----------------------------------------------------------------------------------
def post(url: str, body: bytes, headers: dict[str, str]) -> egress.Outcome:
    """POST ``body`` through a vetted connection (``notifications.egress``): no redirect followed, no
    blocked address reached, a generic reason on failure."""
    return egress.post(url, body, headers, timeout=settings.AGENTRUN_WEBHOOK_TIMEOUT_SECONDS)


def _record_attempt(delivery: WebhookDelivery, outcome: egress.Outcome) -> None:
    """Record an attempt and enqueue the next one if it failed, in one transaction; nothing when the
    delivery went meanwhile (its endpoint was deleted: its pending deliveries end with it)."""
    now = timezone.now()
    fields = {
        "attempts": delivery.attempts + 1,
        "response_status": outcome.status,
        "last_error": outcome.error,
        "last_attempt_at": now,
    }
    if outcome.error is None:
        fields |= {"status": WebhookDelivery.Status.DELIVERED, "delivered_at": now, "next_attempt_at": None}
    elif fields["attempts"] >= settings.AGENTRUN_WEBHOOK_MAX_ATTEMPTS:
        fields |= {"status": WebhookDelivery.Status.FAILED, "next_attempt_at": None}
    else:
        fields["next_attempt_at"] = now + backoff(fields["attempts"])
    with transaction.atomic():
        if not WebhookDelivery.objects.filter(pk=delivery.pk).update(**fields):
            logger.info("webhook %s: its endpoint was deleted during the attempt", delivery.pk)
            return
        if fields["next_attempt_at"] is not None:
            attempt_delivery.using(run_after=fields["next_attempt_at"]).enqueue(delivery.pk)
    retry = fields["next_attempt_at"] is not None
    metrics.webhook_attempted("delivered" if outcome.error is None else "retry" if retry else "failed")
    if outcome.error is not None:
        logger.info(
            "webhook %s to endpoint %s failed (attempt %d): %s",
            delivery.event_id,
            delivery.endpoint_id,
            fields["attempts"],
            outcome.error,
        )


@task(queue_name=QUEUE)
def attempt_delivery(delivery_id: str) -> bool:
    """One attempt at a due delivery, if this task claims it. True once delivered; a failure enqueues
    the next attempt (``run_after`` its backoff) in the transaction that records it."""
    claimed = WebhookDelivery.objects.filter(
        pk=delivery_id, status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=timezone.now()
    ).update(next_attempt_at=_claim_until())
    if not claimed:
        return False
    delivery = WebhookDelivery.objects.select_related("endpoint", "event").filter(pk=delivery_id).first()
    if delivery is None:  # the endpoint was deleted since the claim
        return False
    endpoint, event = delivery.endpoint, delivery.event
    try:
        secret = endpoint.secret
    except secretbox.UnreadableSecret:
        logger.error("webhook endpoint %s: its secret cannot be decrypted (AGENTRUN_ENCRYPTION_KEYS)", endpoint.pk)
        _record_attempt(delivery, egress.Outcome(None, "secret unreadable"))
        return False
    body = payloads.body(endpoint, event)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        **signatures.headers(secret, event.id, body),
    }
    outcome = post(endpoint.url, body, headers)
    _record_attempt(delivery, outcome)
    return outcome.error is None


def resend(delivery_ids: list[str]) -> int:
    """Attempt these deliveries again now, whatever their state (the admin's "resend")."""
    count = WebhookDelivery.objects.filter(pk__in=delivery_ids).update(
        status=WebhookDelivery.Status.PENDING, next_attempt_at=timezone.now()
    )
    for delivery_id in delivery_ids:
        attempt_delivery.enqueue(delivery_id)
    return count


# --- email --------------------------------------------------------------------------------------
@task(queue_name=QUEUE)
def send_notice(notice_id: int) -> None:
    """Send one immediate notice, if this task claims it."""
    now = timezone.now()
    claimed = EmailNotice.objects.filter(
        pk=notice_id, digest=False, sent_at__isnull=True, next_attempt_at__lte=now
    ).update(next_attempt_at=_claim_until())
    if claimed:
        notice = EmailNotice.objects.select_related("user", "event").get(pk=notice_id)
        _send(notice.user, [notice])


@task(queue_name=QUEUE)
def send_digest(user_id: int) -> None:
    """Send a reviewer's digest: every digest notice they are owed, if the first is due."""
    with transaction.atomic():
        notices = list(
            EmailNotice.objects.select_for_update()
            .filter(user_id=user_id, digest=True, sent_at__isnull=True)
            .select_related("event")
            .order_by("created_at", "id")
        )
        if not notices or min(n.next_attempt_at for n in notices) > timezone.now():
            return
        EmailNotice.objects.filter(pk__in=[n.pk for n in notices]).update(next_attempt_at=_claim_until())
    _send(get_user_model().objects.get(pk=user_id), notices)


def _send(user: Any, notices: list[EmailNotice]) -> None:
    ids = [n.pk for n in notices]
    try:
        email = emails.message(user, notices)
        if email is not None:
            emails.send(email)
    except Exception as exc:
        attempts = max(n.attempts for n in notices) + 1
        logger.warning("email to %s failed (attempt %d): %s", user, attempts, exc)
        done = attempts >= settings.AGENTRUN_WEBHOOK_MAX_ATTEMPTS
        retry_at = timezone.now() + backoff(attempts)
        with transaction.atomic():
            EmailNotice.objects.filter(pk__in=ids).update(
                attempts=attempts,
                last_error=f"{type(exc).__name__}: {exc}"[:1000],
                next_attempt_at=retry_at,
                sent_at=timezone.now() if done else None,  # given up: not sent, but no longer owed
            )
            if not done and notices[0].digest:
                send_digest.using(run_after=retry_at).enqueue(user.pk)
            elif not done:
                send_notice.using(run_after=retry_at).enqueue(notices[0].pk)
        metrics.email_attempted("failed" if done else "retry", len(ids))
        return
    EmailNotice.objects.filter(pk__in=ids).update(sent_at=timezone.now())
    metrics.email_attempted("sent", len(ids))


# --- the sweep ----------------------------------------------------------------------------------
def sweep() -> None:
    """Enqueue again what lost its task: events left untaken, deliveries and notices overdue; and
    digests that are due (a duplicate task finds its work claimed and does nothing)."""
    now = timezone.now()
    untaken = OutboxEvent.objects.filter(handled_at__isnull=True, created_at__lt=now - UNTAKEN_GRACE)
    for event_id in untaken.order_by("created_at").values_list("id", flat=True)[:SWEEP_BATCH]:
        handle_event.enqueue(event_id)
    overdue = now - OVERDUE_GRACE
    due = WebhookDelivery.objects.filter(status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=overdue)
    for delivery_id in due.order_by("next_attempt_at").values_list("id", flat=True)[:SWEEP_BATCH]:
        attempt_delivery.enqueue(delivery_id)
    for delivery_id in slack.overdue(overdue, SWEEP_BATCH):
        slack.attempt_slack.enqueue(delivery_id)
    notices = EmailNotice.objects.filter(sent_at__isnull=True, digest=False, next_attempt_at__lte=overdue)
    for notice_id in notices.order_by("next_attempt_at").values_list("id", flat=True)[:SWEEP_BATCH]:
        send_notice.enqueue(notice_id)
    digests = EmailNotice.objects.filter(sent_at__isnull=True, digest=True, next_attempt_at__lte=now)
    for user_id in digests.values_list("user_id", flat=True).distinct()[:SWEEP_BATCH]:
        send_digest.enqueue(user_id)


# --- the listener -------------------------------------------------------------------------------
class Notifier:
    """``agentrun.core.outbox``'s listener (registered by ``NotificationsConfig.ready``).

    ``wants`` answers from an in-memory view of who subscribes (active endpoints and Slack destinations;
    whether anyone may get email), read again every ``AGENTRUN_EVENTS_REFRESH_SECONDS`` and at once after a change made
    in this process (signals): a state change nobody subscribes to writes no event.
    """

    def __init__(self) -> None:
        self._view: tuple[list[WebhookEndpoint], bool, list[SlackDestination]] | None = None
        self._read_at = 0.0
        self._generation = 0  # how many changes were signalled: a view read across one is not kept

    def invalidate(self, **_: Any) -> None:
        """A change in this process: read the view again now, and once more when it commits (a view read
        in another thread before the commit would not show it)."""
        self._forget()
        if transaction.get_connection().in_atomic_block:  # (outside one, the change is committed already)
            transaction.on_commit(self._forget)

    def _forget(self) -> None:
        self._generation += 1
        self._view = None

    def _current(self) -> tuple[list[WebhookEndpoint], bool, list[SlackDestination]]:
        view = self._view
        if view is None or time.monotonic() - self._read_at > settings.AGENTRUN_EVENTS_REFRESH_SECONDS:
            for _attempt in range(3):  # a change signalled while reading: read again (it may not show yet)
                generation = self._generation
                view = (
                    list(WebhookEndpoint.objects.filter(active=True)),
                    emails.email_possible(),
                    list(SlackDestination.objects.filter(active=True)),
                )
                if generation == self._generation:
                    self._view, self._read_at = view, time.monotonic()
                    break
        assert view is not None
        return view

    def wants(self, type_: str, agent_id: str) -> bool:
        endpoints, email, destinations = self._current()
        return (
            (email and type_ in emails.EMAIL_EVENTS)
            or any(e.subscribes(type_, agent_id) for e in endpoints)
            or slack.any_destination(destinations, type_, agent_id)
        )

    def has_slack_destinations(self) -> bool:
        return bool(self._current()[2])

    def recorded(self, event_id: str) -> None:
        handle_event.enqueue(event_id)

    def sweep(self) -> None:
        sweep()


notifier = Notifier()


# --- retention (agentrun.core.retention) -----------------------------------------------------------
def _slack_messages_due(cutoff: datetime) -> QuerySet:
    waiting = SuspendedToolCall.objects.filter(
        run_id=OuterRef("run_id"), tool_call_id=OuterRef("tool_call_id"), status=SuspendedToolCall.Status.OPEN
    )
    logged = SlackDelivery.objects.filter(message=OuterRef("pk"))
    old = SlackMessage.objects.filter(created_at__lt=cutoff)  # on the index slack_message_created
    return old.exclude(Exists(waiting)).exclude(Exists(logged)).order_by("created_at")


def retention_kinds() -> list[retention.Kind]:
    """Finished deliveries (webhooks, Slack) and sent notices, oldest first; pruned before the events they
    belong to."""
    return [
        retention.Kind(
            "webhook deliveries",
            "AGENTRUN_RETAIN_DELIVERIES_DAYS",
            "deliveries",
            lambda cutoff: (
                WebhookDelivery.objects.exclude(status=WebhookDelivery.Status.PENDING)
                .filter(created_at__lt=cutoff)
                .order_by("created_at")
            ),
            rank=40,
        ),
        retention.Kind(
            "Slack deliveries",  # kept as long as webhook deliveries
            "AGENTRUN_RETAIN_DELIVERIES_DAYS",
            "deliveries",
            lambda cutoff: (
                SlackDelivery.objects.exclude(status=SlackDelivery.Status.PENDING)
                .filter(created_at__lt=cutoff)
                .order_by("created_at")
            ),
            rank=40,
        ),
        retention.Kind(
            # Kept while its call waits (its buttons refer to it) and while it has deliveries on record.
            "Slack messages",
            "AGENTRUN_RETAIN_DELIVERIES_DAYS",
            "deliveries",
            _slack_messages_due,
            rank=45,
        ),
        retention.Kind(
            "email notices",
            "AGENTRUN_RETAIN_NOTICES_DAYS",
            "notices",
            lambda cutoff: EmailNotice.objects.filter(sent_at__isnull=False, created_at__lt=cutoff).order_by(
                "created_at"
            ),
            rank=40,
        ),
    ]

"""Webhook endpoints and their deliveries, reviewers' email preferences and notices, signed decision links.

Events themselves are ``agentrun.core.models.OutboxEvent`` rows the engine writes; this app turns each into
deliveries (one per subscribed endpoint) and notices (one per reviewer to email), then sends them.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import URLValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from agentrun.core import secretbox
from agentrun.core.ids import new_id
from agentrun.core.models import Decision, OutboxEvent
from agentrun.core.timeutil import iso


def _endpoint_id() -> str:
    return new_id("whep")


def _delivery_id() -> str:
    return new_id("whd")


def _link_id() -> str:
    return new_id("lnk")


class WebhookEndpoint(models.Model):
    """Where events are POSTed, signed with ``secret`` (Standard Webhooks).

    ``secret`` reads and writes the plaintext; the table holds it encrypted (``sealed_secret``,
    ``agentrun.core.secretbox``). ``owner``: who last created or changed the endpoint. It receives only
    the events of agents its owner may view (docs/security.md, "Webhook targets"); no owner, no events.
    """

    class Format(models.TextChoices):
        STANDARD = "standard"  # {id, type, createdAt, data}
        SLACK = "slack"  # a Slack incoming-webhook message: the summary and a link

    id = models.CharField(primary_key=True, max_length=40, default=_endpoint_id, editable=False)
    url = models.URLField(max_length=2000, validators=[URLValidator(schemes=["http", "https"])])
    sealed_secret = models.TextField()
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    events = models.JSONField(default=list, blank=True)  # event types; empty: all
    agents = models.JSONField(default=list, blank=True)  # agent ids; empty: all
    active = models.BooleanField(default=True)
    format = models.CharField(max_length=16, choices=Format.choices, default=Format.STANDARD)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.id} → {self.url}"

    @property
    def secret(self) -> str:
        return secretbox.unseal(self.sealed_secret)

    @secret.setter
    def secret(self, plaintext: str) -> None:
        self.sealed_secret = secretbox.seal(plaintext)

    def subscribes(self, type_: str, agent_id: str) -> bool:
        """Whether it wants this event (its filters; the owner's scope is ``delivery.recipients``')."""
        return (
            self.active and (not self.events or type_ in self.events) and (not self.agents or agent_id in self.agents)
        )

    def to_dict(self) -> dict:
        """``{id, url, secret (write-only), events, agents, active}`` (+ format, createdAt):
        docs/notifications.md#25-rest."""
        return {
            "id": self.id,
            "url": self.url,
            "events": list(self.events),
            "agents": list(self.agents),
            "active": self.active,
            "format": self.format,
            "createdAt": iso(self.created_at),
        }


class WebhookDelivery(models.Model):
    """One event to one endpoint: attempted until a 2xx answer, with exponential backoff."""

    class Status(models.TextChoices):
        PENDING = "pending"  # not delivered yet; attempted at next_attempt_at
        DELIVERED = "delivered"
        FAILED = "failed"  # every attempt failed

    id = models.CharField(primary_key=True, max_length=40, default=_delivery_id, editable=False)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(OutboxEvent, on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)
    # When the next attempt is due; a process attempting it pushes it past its timeout first (its claim).
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "webhook deliveries"
        constraints = [models.UniqueConstraint(fields=["endpoint", "event"], name="one_delivery_per_endpoint_event")]
        indexes = [
            # Serves the sweep's due deliveries (pending, next_attempt_at ≤ now).
            models.Index(fields=["next_attempt_at"], name="delivery_due", condition=Q(status="pending")),
            # Serves GET /api/webhook-endpoints/{id}/deliveries (newest first).
            models.Index(fields=["endpoint", "created_at", "id"], name="delivery_endpoint_timeline"),
            # Serves the retention's pruning of finished deliveries (agentrun.core.retention), oldest first.
            models.Index(fields=["created_at"], name="delivery_finished", condition=~Q(status="pending")),
        ]

    def __str__(self) -> str:
        return f"{self.event_id} → {self.endpoint_id}"

    def to_dict(self) -> dict:
        """``{id, eventId, type, status, attempts, responseStatus, nextAttemptAt}`` (+ the rest):
        docs/notifications.md#25-rest."""
        return {
            "id": self.id,
            "eventId": self.event_id,
            "type": self.event.type,
            "status": self.status,
            "attempts": self.attempts,
            "responseStatus": self.response_status,
            "nextAttemptAt": iso(self.next_attempt_at) if self.status == self.Status.PENDING else None,
            "lastAttemptAt": iso(self.last_attempt_at),
            "lastError": self.last_error,
            "createdAt": iso(self.created_at),
        }


class NotificationPreference(models.Model):
    """How a reviewer wants email about calls waiting for them (no row: immediately)."""

    class Email(models.TextChoices):
        IMMEDIATELY = "immediately", "Immediately, one email per run that waits"
        DIGEST = "digest", "A digest, at most one email per digest period"
        OFF = "off", "No email"

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="notification_preference"
    )
    email = models.CharField(max_length=16, choices=Email.choices, default=Email.IMMEDIATELY)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.user}: {self.email}"


class EmailNotice(models.Model):
    """An email a reviewer is owed about one event: sent at once, or gathered into their digest."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    event = models.ForeignKey(OutboxEvent, on_delete=models.CASCADE, related_name="+")
    digest = models.BooleanField(default=False)
    # Due time (a digest's: when the reviewer's next digest goes); pushed forward while a process sends it.
    next_attempt_at = models.DateTimeField(default=timezone.now)
    attempts = models.PositiveIntegerField(default=0)
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["user", "event"], name="one_notice_per_user_event")]
        indexes = [
            # Serves the sweep's due notices (unsent, next_attempt_at ≤ now).
            models.Index(fields=["next_attempt_at"], name="notice_due", condition=Q(sent_at__isnull=True)),
            # Serves the retention's pruning of sent notices (agentrun.core.retention), oldest first.
            models.Index(fields=["created_at"], name="notice_sent", condition=Q(sent_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.event_id} → {self.user_id}"


class DecisionLink(models.Model):
    """A signed decision link: one reviewer, one tool call (one suspension of it), single-use, expiring.

    The URL carries ``django.core.signing`` of this row's id; the row says whether it was used."""

    id = models.CharField(primary_key=True, max_length=40, default=_link_id, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    agent_id = models.CharField(max_length=128)
    run_id = models.CharField(max_length=40)
    tool_call_id = models.CharField(max_length=128)
    suspension = models.PositiveIntegerField(default=0)
    # The arguments the email showed: the decision is refused (ARGS_CHANGED) if they are not the call's.
    args_fingerprint = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    decision = models.ForeignKey(Decision, on_delete=models.PROTECT, null=True, blank=True, related_name="+")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.id} ({self.tool_call_id} for {self.user_id})"

    @property
    def expired(self) -> bool:
        return self.expires_at <= timezone.now()


# --- Slack (docs/slack.md) ------------------------------------------------------------------------
def _slack_destination_id() -> str:
    return new_id("sld")


def _slack_message_id() -> str:
    return new_id("slm")


def _slack_delivery_id() -> str:
    return new_id("sldv")


class SlackDestination(models.Model):
    """A Slack channel that gets an interactive message per waiting call, posted with a bot token.

    ``bot_token`` reads and writes the plaintext; the table holds it encrypted (``sealed_bot_token``).
    ``owner``: who last created or changed it; like a webhook endpoint, it gets only the calls of agents
    its owner may view (docs/slack.md, "Security"); no owner, no messages.
    """

    id = models.CharField(primary_key=True, max_length=40, default=_slack_destination_id, editable=False)
    name = models.CharField(max_length=200)
    sealed_bot_token = models.TextField()
    channel = models.CharField(max_length=80, help_text="The channel's id (C0123ABCD) or #name.")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    agents = models.JSONField(default=list, blank=True)  # agent ids; empty: all
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.name} → {self.channel}"

    @property
    def bot_token(self) -> str:
        return secretbox.unseal(self.sealed_bot_token)

    @bot_token.setter
    def bot_token(self, plaintext: str) -> None:
        self.sealed_bot_token = secretbox.seal(plaintext)

    def subscribes(self, agent_id: str) -> bool:
        return self.active and (not self.agents or agent_id in self.agents)

    def to_dict(self) -> dict:
        """``{id, name, botToken (write-only), channel, agents, active}`` (+ createdAt):
        docs/api.md#slack-destinations."""
        return {
            "id": self.id,
            "name": self.name,
            "channel": self.channel,
            "agents": list(self.agents),
            "active": self.active,
            "createdAt": iso(self.created_at),
        }


class SlackMessage(models.Model):
    """One waiting call (one suspension of it, on the arguments the event showed) posted to one destination.

    Its buttons carry a signed reference to this row (``notifications.slack.button_value``): a click
    decides exactly this call, this suspension and these arguments, or nothing. ``ts``/``channel_id``
    are Slack's coordinates of the posted message (``chat.update`` needs them)."""

    id = models.CharField(primary_key=True, max_length=40, default=_slack_message_id, editable=False)
    destination = models.ForeignKey(SlackDestination, on_delete=models.CASCADE, related_name="messages")
    event = models.ForeignKey(OutboxEvent, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    agent_id = models.CharField(max_length=128)
    run_id = models.CharField(max_length=40)
    thread_id = models.CharField(max_length=255)
    tool_call_id = models.CharField(max_length=128)
    suspension = models.PositiveIntegerField(default=0)
    args_fingerprint = models.CharField(max_length=64)
    # What the message shows of the call: the listing item of the event (tool, args, risk, reason, subAgent).
    call = models.JSONField()
    channel_id = models.CharField(max_length=80, null=True, blank=True)
    ts = models.CharField(max_length=40, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["destination", "run_id", "tool_call_id", "suspension"], name="one_slack_message_per_call"
            )
        ]
        indexes = [
            # Serves "the messages showing this call" (updates after a decision, a run's end).
            models.Index(fields=["run_id", "tool_call_id"], name="slack_message_call"),
            # Serves the retention's "oldest first" (notifications.delivery.retention_kinds).
            models.Index(fields=["created_at"], name="slack_message_created"),
        ]

    def __str__(self) -> str:
        return f"{self.tool_call_id} in {self.destination_id}"


class SlackDelivery(models.Model):
    """One call of Slack's Web API or of a click's ``response_url``: attempted until Slack says ok, with
    exponential backoff, like a webhook delivery. The delivery log of the Slack destinations."""

    class Action(models.TextChoices):
        POST = "post"  # chat.postMessage: the message about a waiting call
        UPDATE = "update"  # chat.update: the message shows what became of the call
        RESPOND = "respond"  # the answer to a click, to its response_url

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    id = models.CharField(primary_key=True, max_length=40, default=_slack_delivery_id, editable=False)
    message = models.ForeignKey(SlackMessage, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(OutboxEvent, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    action = models.CharField(max_length=16, choices=Action.choices)
    # respond only: where to (a response_url that passed docs/slack.md's host rule) and what.
    url = models.URLField(max_length=2000, null=True, blank=True)
    body = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "Slack deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["message", "event", "action"],
                condition=Q(event__isnull=False),
                name="one_slack_delivery_per_message_event",
            )
        ]
        indexes = [
            # Serves the sweep's due Slack deliveries (pending, next_attempt_at ≤ now).
            models.Index(fields=["next_attempt_at"], name="slack_delivery_due", condition=Q(status="pending")),
            # Serves the retention's pruning of finished Slack deliveries, oldest first.
            models.Index(fields=["created_at"], name="slack_delivery_finished", condition=~Q(status="pending")),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.message_id}"

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "messageId": self.message_id,
            "eventId": self.event_id,
            "action": self.action,
            "status": self.status,
            "attempts": self.attempts,
            "responseStatus": self.response_status,
            "nextAttemptAt": iso(self.next_attempt_at) if self.status == self.Status.PENDING else None,
            "lastAttemptAt": iso(self.last_attempt_at),
            "lastError": self.last_error,
            "createdAt": iso(self.created_at),
        }


class SlackIdentity(models.Model):
    """A Slack user (of one workspace) linked to an agentrun user, by a link code they typed into
    ``/agentrun link`` (docs/slack.md, "Linking"). Only a linked Slack user decides from Slack, as that user."""

    team_id = models.CharField(max_length=32)
    slack_user_id = models.CharField(max_length=32)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_identities")
    linked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["linked_at", "id"]
        verbose_name_plural = "Slack identities"
        constraints = [models.UniqueConstraint(fields=["team_id", "slack_user_id"], name="one_account_per_slack_user")]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.slack_user_id} → {self.user_id}"

"""Email to reviewers: who is told, when (their preference), and what the message says.

- ``run.suspended`` and ``approval.timeout_warning`` go to the agent's reviewers: active users with
  an email address who may decide its calls (``agentrun.core.access``: the decide permission and, for an
  agent in ``AGENTRUN_AGENT_REVIEWERS``, one of its groups).
- ``approval.escalated`` goes to those of them in the tool's ``escalate_to`` groups.
- Each reviewer's preference (``NotificationPreference``; none: immediately): ``immediately`` (one
  email per event), ``digest`` (suspensions gathered into one email per ``AGENTRUN_DIGEST_SECONDS`` at
  most, listing what still waits; warnings and escalations still go at once) or ``off``.

A message lists the calls that still wait when it is sent (none left: nothing is sent), each approval
call with a signed decision link for that reviewer alone, and links to the dashboard.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.mail import EmailMessage, mailers
from django.db.models import Min, Q
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from agentrun.core import access, claimstate, outbox
from agentrun.core.models import OutboxEvent, Run, SuspendedToolCall
from approvals.public import OpenCallView, open_call_views
from notifications import links
from notifications.models import EmailNotice, NotificationPreference
from notifications.payloads import public_url, thread_url

EMAIL_EVENTS = frozenset({outbox.RUN_SUSPENDED, outbox.TIMEOUT_WARNING, outbox.ESCALATED})
OFF = NotificationPreference.Email.OFF
DIGEST = NotificationPreference.Email.DIGEST
OUTCOMES = {
    "decline": "declined automatically",
    "approve": "approved automatically",
    "cancel_run": "cancelled with its run",
    "escalate": "escalated to another group",
}


def email_possible() -> bool:
    """Someone could get email at all (the events listener's cheap interest check)."""
    users = get_user_model().objects.filter(is_active=True).exclude(email="")
    return users.exclude(notification_preference__email=OFF).exists()


def agents_involved(event: OutboxEvent) -> list[str]:
    """The agents whose calls ``event`` shows: its run's, and each sub-agent whose call is surfaced."""
    data = event.data or {}
    calls = data.get("toolCalls") or ([data["toolCall"]] if data.get("toolCall") else [])
    inner = [c["subAgent"]["agentId"] for c in calls if c and c.get("subAgent")]
    return [event.agent_id, *dict.fromkeys(a for a in inner if a != event.agent_id)]


def recipients(event: OutboxEvent) -> list:
    """The reviewers told of ``event`` (with an email address, email not turned off): people who may
    decide every agent involved — a call surfaced from a sub-agent shows that agent's arguments."""
    agents = agents_involved(event)
    perm = Permission.objects.filter(codename="decide_toolcall", content_type__app_label="agentrun").first()
    users = get_user_model().objects.filter(is_active=True).exclude(email="")
    deciders = Q(is_superuser=True)
    if perm is not None:
        deciders |= Q(groups__permissions=perm) | Q(user_permissions=perm)
    users = users.filter(deciders)
    for agent_id in agents:
        if groups := access.agent_reviewers().get(agent_id):
            users = users.filter(Q(is_superuser=True) | Q(groups__name__in=groups))
    if event.type == outbox.ESCALATED:
        users = users.filter(groups__name__in=event.data.get("escalateTo") or [])
    users = users.exclude(notification_preference__email=OFF).distinct().order_by("pk")
    # The queries above find candidates; the access rules decide (the links must work for them).
    return [user for user in users if all(access.can_decide_agent(user, a) for a in agents)]


def create_notices(event: OutboxEvent) -> None:
    """The notices ``event`` owes, in the caller's transaction (the event's hand-over)."""
    if event.type not in EMAIL_EVENTS:
        return
    if Run.objects.filter(pk=event.run_id, parent_run__isnull=False).exists():
        # A sub-agent's run: its calls wait surfaced on its supervisor's call, whose own event is
        # emailed (one decision to make, one email per recipient).
        return
    now = timezone.now()
    notices = []
    first = _routed_members(event)
    users = recipients(event)
    # A warning or an escalation is about a deadline: it does not wait for the digest.
    digesting = {
        u.pk
        for u in users
        if getattr(u, "notification_preference", None) is not None
        and u.notification_preference.email == DIGEST
        and event.type == outbox.RUN_SUSPENDED
    }
    if digesting:
        # Events are taken concurrently (a thread or a worker each): the digest's due time is read under
        # its reviewer's preference row, locked in one order, so a notice joins the digest that another
        # event's notice, committed meanwhile, started.
        list(NotificationPreference.objects.select_for_update().filter(user__in=digesting).order_by("user_id"))
    for user in users:
        digest = user.pk in digesting
        due = now
        if first is not None and user.pk not in first:
            # A routing rule named a group: its members are told first; the others only if the call
            # still waits when the head start is over (a message names only calls that still wait).
            due = now + timedelta(seconds=settings.AGENTRUN_ROUTE_HEAD_START_SECONDS)
        notices.append(
            EmailNotice(
                user=user, event=event, digest=digest, next_attempt_at=_digest_due(user, now) if digest else due
            )
        )
    EmailNotice.objects.bulk_create(notices, ignore_conflicts=True)


def _routed_members(event: OutboxEvent) -> set[int] | None:
    """The members of the groups routing rules name for a newly suspended run's calls
    (docs/dashboard.md#shared-work), who are emailed first; None when no rule names one."""
    if event.type != outbox.RUN_SUSPENDED:
        return None
    groups = set()
    for call in event.data.get("toolCalls") or []:
        inner = call.get("subAgent") or {}
        agent, tool = inner.get("agentId") or event.agent_id, inner.get("toolName") or call.get("toolName", "")
        if group := claimstate.routed_group(agent, tool):
            groups.add(group)
    if not groups:
        return None
    return set(get_user_model().objects.filter(groups__name__in=groups).values_list("pk", flat=True))


def _digest_due(user: object, now: object) -> object:
    """A digest goes one period after the first notice it gathers (later notices join it)."""
    pending = EmailNotice.objects.filter(user=user, digest=True, sent_at__isnull=True).aggregate(
        due=Min("next_attempt_at")
    )["due"]
    return pending or now + timedelta(seconds=settings.AGENTRUN_DIGEST_SECONDS)


# --- the message ----------------------------------------------------------------------------------
@dataclass
class Item:
    """One waiting call in a message."""

    event: OutboxEvent
    view: OpenCallView  # the call as the dashboard shows it (a sub-agent's call: the inner call's arguments)
    note: str  # why now: a timeout warning, an escalation
    link: str | None  # a signed decision link (approval calls)
    thread_url: str

    @property
    def call(self) -> SuspendedToolCall:
        return self.view.call

    # Ids a user or a model chose, quoted as JSON strings: whatever they hold (a CR LF from before ids
    # refused control characters), they stay one quoted value and cannot forge lines of the message.
    @property
    def thread_quoted(self) -> str:
        return quoted(self.call.run.thread_id)

    @property
    def resource_quoted(self) -> str:
        return quoted(self.call.run.resource_id)


def quoted(value: str) -> str:
    """``value`` as a JSON string: in double quotes, with quotes, backslashes and control characters escaped."""
    return json.dumps(value, ensure_ascii=False)


def _waiting_calls(event: OutboxEvent) -> list[SuspendedToolCall]:
    """The event's calls that still wait now (in the event's order)."""
    if event.type == outbox.RUN_SUSPENDED:
        ids = [c["toolCallId"] for c in event.data.get("toolCalls", [])]
    else:
        ids = [event.data["toolCall"]["toolCallId"]]
    calls = SuspendedToolCall.objects.filter(
        run_id=event.run_id, tool_call_id__in=ids, status=SuspendedToolCall.Status.OPEN
    ).select_related("run")
    by_id = {c.tool_call_id: c for c in calls}
    return [by_id[i] for i in ids if i in by_id]


def _note(event: OutboxEvent) -> str:
    if event.type == outbox.ESCALATED:
        groups = ", ".join(event.data.get("escalateTo") or [])
        return f"Nobody approved this call in time: it was escalated to you ({groups})."
    if event.type == outbox.TIMEOUT_WARNING:
        outcome = OUTCOMES.get(event.data.get("onTimeout"), "decided")
        return f"Unless someone decides first, this call will be {outcome} at {event.data.get('timeoutAt')}."
    return ""


def _items(user: object, notices: list[EmailNotice]) -> list[Item]:
    items = []
    for notice in notices:
        for view in open_call_views(_waiting_calls(notice.event)):
            items.append(
                Item(
                    event=notice.event,
                    view=view,
                    note=_note(notice.event),
                    link=links.create(user, view.call) if view.is_approval else None,
                    thread_url=thread_url(view.call.run.thread_id),
                )
            )
    return items


def _subject(items: list[Item]) -> str:
    if len(items) > 1:
        return f"[agentrun] {len(items)} tool calls wait for your decision"
    item = items[0]
    what = f"{item.call.run.agent_id}: {item.view.title}"
    if item.event.type == outbox.ESCALATED:
        return f"[agentrun] Escalated to you: {what} waits for approval"
    if item.event.type == outbox.TIMEOUT_WARNING:
        return f"[agentrun] {what} will be {OUTCOMES.get(item.event.data.get('onTimeout'), 'decided')} soon"
    return f"[agentrun] {what} waits for your {'approval' if item.call.requires_approval else 'answer'}"


def message(user: object, notices: list[EmailNotice]) -> EmailMessage | None:
    """The email for these notices, or None when nothing they name still waits."""
    items = _items(user, notices)
    if not items:
        return None
    context = {
        "user": user,
        "items": items,
        "link_hours": settings.AGENTRUN_LINK_MAX_AGE / 3600,
        "settings_url": public_url(reverse("notifications:settings")),
    }
    text = render_to_string("notifications/email/notice.txt", context)
    return EmailMessage(_subject(items), text, settings.DEFAULT_FROM_EMAIL, [user.email])


def send(email: EmailMessage) -> None:
    mailers.default.send_messages([email])

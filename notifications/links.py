"""Signed decision links: single-use, expiring, bound to one reviewer and one tool call.

A link's URL carries ``django.core.signing`` of a ``DecisionLink`` id (so ids cannot be guessed or
forged); the row binds it to its reviewer, to one suspension of one call and to the arguments the
message showed, and records its use. Opening it (GET) decides nothing: a link preview or a mail
scanner fetching it changes nothing. Deciding (POST) goes through the one decision service
(``via`` link, as the link's reviewer, with the arguments' fingerprint); the link is marked used in
the decision's own transaction, so one link makes at most one decision.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core import signing
from django.db.models import QuerySet
from django.urls import reverse
from django.utils import timezone

from agentrun.core.models import Decision, SuspendedToolCall
from agentrun.engine import service
from agentrun.engine.decisions import shown_fingerprint
from agentrun.engine.service import Decider, DecisionCommand, DecisionOutcome
from notifications.models import DecisionLink
from notifications.payloads import public_url

SALT = "agentrun.notifications.decision-link"
LINK_DECISIONS = ("approve", "decline")


class LinkUnusable(Exception):  # noqa: N818 - the reason is the point, not the error
    """The link cannot decide any more: ``reason`` is ``used`` or ``expired``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def create(user: object, call: SuspendedToolCall) -> str:
    """A new link for ``user`` to decide ``call`` (an approval call); returns its public URL."""
    link = DecisionLink.objects.create(
        user=user,
        agent_id=call.run.agent_id,
        run_id=call.run_id,
        tool_call_id=call.tool_call_id,
        suspension=call.suspension,
        # What the message shows: the inner call's arguments for a call surfaced from a sub-agent.
        args_fingerprint=shown_fingerprint(call),
        expires_at=timezone.now() + timedelta(seconds=settings.AGENTRUN_LINK_MAX_AGE),
    )
    return public_url(reverse("notifications:link", args=[signing.dumps(link.id, salt=SALT)]))


def resolve(token: str) -> DecisionLink | None:
    """The link a token names, or None for a token that was not signed here."""
    try:
        link_id = signing.loads(token, salt=SALT)
    except signing.BadSignature:
        return None
    if not isinstance(link_id, str):
        return None
    return DecisionLink.objects.select_related("user", "decision").filter(pk=link_id).first()


def waiting_call(link: DecisionLink) -> SuspendedToolCall | None:
    """The call the link decides, if it still waits (the same suspension the link was made for)."""
    calls: QuerySet[SuspendedToolCall] = SuspendedToolCall.objects.select_related("run")
    return calls.filter(
        run_id=link.run_id,
        tool_call_id=link.tool_call_id,
        suspension=link.suspension,
        status=SuspendedToolCall.Status.OPEN,
    ).first()


def decide(link: DecisionLink, *, kind: str, reason: str | None) -> DecisionOutcome:
    """Approve or decline the link's call as its reviewer, once. Raises ``LinkUnusable`` or the
    contract's ``AgentRunError`` (already decided, permission denied, arguments changed, …)."""
    if kind not in LINK_DECISIONS:
        raise ValueError(f"a link approves or declines, not {kind!r}")
    if link.used_at is not None:
        raise LinkUnusable("used")
    if link.expired:
        raise LinkUnusable("expired")

    def mark_used(outcome: DecisionOutcome) -> None:
        # In the decision's transaction: a request racing this one with the same link finds it used,
        # and raising here rolls that request's decision back.
        used = DecisionLink.objects.filter(pk=link.pk, used_at__isnull=True).update(
            used_at=timezone.now(), decision=outcome.decision
        )
        if not used:
            raise LinkUnusable("used")

    # Bound to what the message showed: its suspension and its arguments, both re-checked in the
    # decision's transaction (a call that waits again since, on other arguments, is not this link's).
    command = DecisionCommand.one(
        agent_id=link.agent_id,
        run_id=link.run_id,
        tool_call_id=link.tool_call_id,
        kind=kind,
        reason=reason,
        args_fingerprint=link.args_fingerprint,
        suspension=link.suspension,
        decider=Decider.person(link.user, via=Decision.Via.LINK),
    )
    return service.decide(command, on_recorded=mark_used)

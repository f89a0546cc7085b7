"""Shared work on open calls (docs/dashboard.md#shared-work): claims ("I'm on it"), assignments to a
person or a group, and routing rules that name a group for a tool's (or an agent's) calls.

Nothing here gates a decision: a claim only tells the others who is looking. A decision made over
someone else's live claim records that claim (``claim_on_decision``, called by the decision service for
every door). Every change is told to the reviewers' pages through ``ws/approvals`` after it commits.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agentrun.core import claimstate
from agentrun.core.claimstate import ClaimState, idle
from agentrun.core.errors import AgentRunError
from agentrun.core.fanout import notify_approvals
from agentrun.core.models import SuspendedToolCall
from agentrun.core.timeutil import iso

CallKey = tuple[str, str]  # (run id, tool call id)


def _live(call: SuspendedToolCall, now: datetime) -> bool:
    return claimstate.live(call.claimed_by_username, call.claim_touched_at, now)


def state_of(call: SuspendedToolCall, *, now: datetime | None = None) -> ClaimState:
    """Who is on ``call`` (its ``assignee`` and ``assignee_group`` are read: select them with the call)."""
    return claimstate.state(
        claimed_by=call.claimed_by_username,
        claimed_at=call.claimed_at,
        touched_at=call.claim_touched_at,
        assignee=call.assignee.get_username() if call.assignee_id is not None and call.assignee else None,
        assignee_group=call.assignee_group.name if call.assignee_group_id is not None and call.assignee_group else None,
        agent_id=call.inner_agent_id or call.run.agent_id,
        tool_name=call.tool_name,
        now=now,
    )


RELATED = ("run", "assignee", "assignee_group")  # what ``state_of`` reads of a call: select it with the call


def _locked(call: SuspendedToolCall) -> SuspendedToolCall:
    locked = SuspendedToolCall.objects.select_for_update().select_related("run").filter(pk=call.pk).first()
    if locked is None or locked.status != SuspendedToolCall.Status.OPEN:
        raise AgentRunError("TOOL_CALL_NOT_SUSPENDED", f"Tool call {call.tool_call_id} no longer waits.")
    return locked


def _changed(call: SuspendedToolCall) -> ClaimState:
    fresh = SuspendedToolCall.objects.select_related(*RELATED).get(pk=call.pk)
    state = state_of(fresh)
    run = fresh.run
    transaction.on_commit(
        lambda: notify_approvals(
            "claimed",
            runId=run.id,
            agentId=run.agent_id,
            threadId=run.thread_id,
            toolCallIds=[fresh.tool_call_id],
            claim=state.to_dict(),
        )
    )
    return state


CLAIM_FIELDS = ["claimed_by", "claimed_by_username", "claimed_at", "claim_touched_at"]
ASSIGN_FIELDS = ["assignee", "assignee_group", "assigned_by_username", "assigned_at"]


def claim(*, user: Any, call: SuspendedToolCall) -> ClaimState:
    """``user`` is on ``call`` ("I'm on it"); a claim someone else holds passes to ``user`` (a claim
    reserves nothing). Claiming again refreshes it."""
    now = timezone.now()
    with transaction.atomic():
        row = _locked(call)
        if not (_live(row, now) and row.claimed_by_username == user.get_username()):
            row.claimed_at = now
        row.claimed_by, row.claimed_by_username, row.claim_touched_at = user, user.get_username(), now
        row.save(update_fields=CLAIM_FIELDS)
        return _changed(row)


def release(*, user: Any, call: SuspendedToolCall) -> ClaimState:
    """``user`` lets go of their claim on ``call`` (someone else's claim stays)."""
    with transaction.atomic():
        row = _locked(call)
        if row.claimed_by_username == user.get_username():
            row.claimed_by = row.claimed_by_username = row.claimed_at = row.claim_touched_at = None
            row.save(update_fields=CLAIM_FIELDS)
        return _changed(row)


def assign(*, by: Any, call: SuspendedToolCall, username: str | None = None, group: str | None = None) -> ClaimState:
    """Assign ``call`` to a person or a group (both empty: no assignment; a routing rule applies again)."""
    from django.contrib.auth import get_user_model

    person = assignee_group = None
    if username:
        person = get_user_model().objects.filter(username=username, is_active=True).first()
        if person is None:
            raise AgentRunError("INVALID_REQUEST", f"No active user {username!r}.", details={"field": "assignee"})
    if group:
        assignee_group = Group.objects.filter(name=group).first()
        if assignee_group is None:
            raise AgentRunError("INVALID_REQUEST", f"No group {group!r}.", details={"field": "assigneeGroup"})
    with transaction.atomic():
        row = _locked(call)
        row.assignee, row.assignee_group = person, assignee_group
        row.assigned_by_username = by.get_username() if (person or assignee_group) else None
        row.assigned_at = timezone.now() if (person or assignee_group) else None
        row.save(update_fields=ASSIGN_FIELDS)
        return _changed(row)


def touch(*, user: Any, calls: list[SuspendedToolCall]) -> None:
    """The claimer looked at these calls again (their thread page): their live claims stay live."""
    if not getattr(user, "is_authenticated", False):
        return
    now = timezone.now()
    mine = [c.pk for c in calls if c.claimed_by_username == user.get_username() and _live(c, now)]
    if mine:
        SuspendedToolCall.objects.filter(pk__in=mine, status=SuspendedToolCall.Status.OPEN).update(claim_touched_at=now)


def claim_on_decision(call: SuspendedToolCall, username: str | None) -> dict[str, Any] | None:
    """Someone else's live claim on ``call`` (read from the locked row: no statement) when ``username``
    decides it: what the decision records (``{"claimedBy", "claimedAt"}``), or None. Never a refusal."""
    if not _live(call, timezone.now()) or call.claimed_by_username == username:
        return None
    return {"claimedBy": call.claimed_by_username, "claimedAt": iso(call.claimed_at) if call.claimed_at else None}


def clear_on_decision(call: SuspendedToolCall) -> list[str]:
    """The call was decided: nobody is on it any more. The fields to save with the decided call."""
    call.claimed_by = call.claimed_by_username = call.claimed_at = call.claim_touched_at = None
    return CLAIM_FIELDS


def mine(user: Any) -> Q:
    """Open calls that are ``user``'s (the inbox's "Mine"): claimed by them (live), assigned to them or
    to one of their groups, or routed to one of their groups and assigned to nobody."""
    groups = list(user.groups.values_list("name", flat=True))
    now = timezone.now()
    q = Q(claimed_by_username=user.get_username(), claim_touched_at__gt=now - idle())
    q |= Q(assignee=user) | Q(assignee_group__name__in=groups)
    routes = settings.AGENTRUN_REVIEW_ROUTES
    tools = [t for t, g in routes["tools"].items() if g in groups]
    agents = [a for a, g in routes["agents"].items() if g in groups]
    elsewhere = [t for t, g in routes["tools"].items() if g not in groups]
    if tools or agents:
        routed = Q(tool_name__in=tools) | (Q(run__agent_id__in=agents) & ~Q(tool_name__in=elsewhere))
        q |= routed & Q(assignee__isnull=True, assignee_group__isnull=True)
    return q

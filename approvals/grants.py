"""Standing grants from the dashboard and the admin: "always approve this tool for this thread / resource".

Granting from a call card approves that call too (a person's decision, ``via`` dashboard) and records
the grant in the same transaction; later calls the grant covers are approved by the engine itself
(``agentrun.engine.decisions.approve_by_grant``: a decision ``via`` policy naming the grant). Whoever
may decide an agent's calls may grant and revoke for it. On a high-risk call the card's form first asks
to confirm, as its Approve does (``approvals.views.grant_create``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from agentrun.core import access
from agentrun.core.errors import AgentRunError
from agentrun.core.models import Decision, StandingGrant, SuspendedToolCall
from agentrun.engine.service import DecisionOutcome, decide_tool_call


def grant_for_call(*, user: Any, call: SuspendedToolCall, scope: str, expires_in: float | None) -> StandingGrant:
    """The grant ``call``'s card asks for, not saved: the tool that would wait again (a sub-agent's own for
    a surfaced call) on the call's thread or resource. Bad choices are ``INVALID_REQUEST``."""
    run = call.run
    if scope not in StandingGrant.Scope.values:
        raise AgentRunError("INVALID_REQUEST", f"scope must be thread or resource, not {scope!r}")
    scope_id = run.thread_id if scope == StandingGrant.Scope.THREAD else run.resource_id
    if not scope_id:
        raise AgentRunError("INVALID_REQUEST", "this run has no resource to grant for")
    if expires_in is not None and not 0 < expires_in <= 10 * 365 * 86400:
        raise AgentRunError("INVALID_REQUEST", "expiry must be between a second and ten years")
    agent_id, tool_name = run.agent_id, call.tool_name
    if call.inner_run_id:
        # A sub-agent's call surfaced here: the grant is for the sub-agent's tool (its run shares this
        # thread and resource), which is what would wait again.
        inner = SuspendedToolCall.objects.filter(run_id=call.inner_run_id, tool_call_id=call.inner_tool_call_id).first()
        if inner is None:
            raise AgentRunError("TOOL_CALL_NOT_SUSPENDED", "the sub-agent's call no longer waits")
        agent_id, tool_name = call.inner_agent_id, inner.tool_name
    return StandingGrant(
        agent_id=agent_id,
        tool_name=tool_name,
        scope=scope,
        scope_id=scope_id,
        created_by=user,
        created_by_username=user.get_username(),
        expires_at=timezone.now() + timedelta(seconds=expires_in) if expires_in else None,
    )


def grant_from_call(
    *, user: Any, call: SuspendedToolCall, scope: str, expires_in: float | None, args_fingerprint: str | None = None
) -> tuple[StandingGrant, DecisionOutcome]:
    """Approve ``call`` and grant its tool for its thread or resource, together or not at all.
    ``args_fingerprint``: of the arguments the person saw (``ARGS_CHANGED`` if they changed)."""
    grant = grant_for_call(user=user, call=call, scope=scope, expires_in=expires_in)
    outcome = decide_tool_call(
        agent_id=call.run.agent_id,
        run_id=call.run_id,
        tool_call_id=call.tool_call_id,
        kind="approve",
        args_fingerprint=args_fingerprint,
        reason=f"Approved, with a standing grant: {grant.describe()}.",
        decided_by=user,
        via=Decision.Via.DASHBOARD,
        on_recorded=lambda _: grant.save(),  # in the decision's transaction
    )
    return grant, outcome


def visible_grants(user: Any) -> QuerySet[StandingGrant]:
    return access.only_visible(StandingGrant.objects.all(), user).order_by("-created_at", "-id")


def revoke(*, user: Any, grant: StandingGrant) -> bool:
    """Revoke a live grant (False if it was revoked already). The caller checks ``can_revoke``."""
    return bool(
        StandingGrant.objects.filter(pk=grant.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by_username=user.get_username()
        )
    )


def can_revoke(user: Any, grant: StandingGrant) -> bool:
    return access.can_decide_agent(user, grant.agent_id)

"""Standing grants from the dashboard and the admin: "always approve this tool for this thread / resource".

Granting from a call card approves that call too (a person's decision, ``via`` dashboard) and records
the grant in the same transaction; later calls the grant covers are approved by the engine itself
(``agentrun.engine.decisions.approve_by_grant``: a decision ``via`` policy naming the grant). The rules
are the decision service's, whatever the door (this card, the admin): whoever may decide an agent's
calls may grant and revoke for it; a grant never covers a high-risk call or one that needs several
approvals; it expires (30 days unless it says less, at most ``AGENTRUN_GRANT_MAX_DAYS``); it stops
working when its creator may no longer decide the agent.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from agentrun.core import access
from agentrun.core.errors import AgentRunError
from agentrun.core.models import Decision, StandingGrant, SuspendedToolCall
from agentrun.engine.decisions import grant_expiry, grantable_tool
from agentrun.engine.service import Decider, DecisionCommand, DecisionOutcome, decide_with_grant, revoke_grant


def grant_for_call(*, user: Any, call: SuspendedToolCall, scope: str, expires_in: float | None) -> StandingGrant:
    """The grant ``call``'s card asks for, not saved: the tool that would wait again (a sub-agent's own for
    a surfaced call) on the call's thread or resource. What no grant may cover is refused now, before
    a confirmation step (``INVALID_REQUEST``)."""
    run = call.run
    if scope not in StandingGrant.Scope.values:
        raise AgentRunError("INVALID_REQUEST", f"scope must be thread or resource, not {scope!r}")
    scope_id = run.thread_id if scope == StandingGrant.Scope.THREAD else run.resource_id
    if not scope_id:
        raise AgentRunError("INVALID_REQUEST", "this run has no resource to grant for")
    agent_id, tool_name = run.agent_id, call.tool_name
    if call.inner_run_id:
        # A sub-agent's call surfaced here: the grant is for the sub-agent's tool (its run shares this
        # thread and resource), which is what would wait again.
        inner = SuspendedToolCall.objects.filter(run_id=call.inner_run_id, tool_call_id=call.inner_tool_call_id).first()
        if inner is None:
            raise AgentRunError("TOOL_CALL_NOT_SUSPENDED", "the sub-agent's call no longer waits")
        agent_id, tool_name = call.inner_agent_id or "", inner.tool_name
    grantable_tool(agent_id, tool_name)
    return StandingGrant(
        agent_id=agent_id,
        tool_name=tool_name,
        scope=scope,
        scope_id=scope_id,
        expires_at=grant_expiry(expires_in),
    )


def grant_from_call(
    *, user: Any, call: SuspendedToolCall, scope: str, expires_in: float | None, args_fingerprint: str | None = None
) -> tuple[StandingGrant, DecisionOutcome]:
    """Approve ``call`` and grant its tool for its thread or resource, together or not at all.
    ``args_fingerprint``: of the arguments the person saw (``ARGS_CHANGED`` if they changed)."""
    grant = grant_for_call(user=user, call=call, scope=scope, expires_in=expires_in)
    command = DecisionCommand.one(
        agent_id=call.run.agent_id,
        run_id=call.run_id,
        tool_call_id=call.tool_call_id,
        kind="approve",
        args_fingerprint=args_fingerprint,
        reason=f"Approved, with a standing grant: {grant.describe()}.",
        decider=Decider.person(user, via=Decision.Via.DASHBOARD),
    )
    return grant, decide_with_grant(command, grant)


def visible_grants(user: Any) -> QuerySet[StandingGrant]:
    return access.only_visible(StandingGrant.objects.all(), user).order_by("-created_at", "-id")


def revoke(*, user: Any, grant: StandingGrant) -> bool:
    """Revoke a live grant (False if it was revoked already); ``PERMISSION_DENIED`` for someone who
    may not decide its agent."""
    return revoke_grant(grant, Decider.person(user, via=Decision.Via.DASHBOARD))


def can_revoke(user: Any, grant: StandingGrant) -> bool:
    return access.can_decide_agent(user, grant.agent_id)

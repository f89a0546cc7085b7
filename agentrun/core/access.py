"""Who may do what: the ``Viewers`` and ``Reviewers`` groups, their permissions, and per-agent reviewers.

Two layers, both required:

1. **Global permissions** (what a person may do at all): ``agentrun.view_run`` to read,
   ``agentrun.decide_toolcall`` to approve / decline / resume, ``agentrun.start_run``,
   ``agentrun.cancel_run``. ``Viewers`` hold the first, ``Reviewers`` all four.
2. **Per-agent scope** (``settings.AGENTRUN_AGENT_REVIEWERS``, from the environment variable of the
   same name, JSON such as ``{"billing-agent": ["Billing reviewers"]}``): an agent named there is
   seen and decided only by members of one of its groups, and by superusers. An agent not named there
   is open to everyone holding the global permission. The mapping grants nothing on its own: a member of
   "Billing reviewers" still needs ``decide_toolcall`` (from ``Reviewers`` or the group itself) to decide.

Seeing and deciding share one scope, so an agent is, for a given person, either *hidden* (they are
outside its groups) or *visible*; on a visible agent the global permission decides the rest.

How each surface answers (the same rule everywhere, so nothing tells a hidden agent from a missing one):

- **Hidden agent → "not found".** REST: ``/api/agents/<hidden>/…`` is 404 ``AGENT_NOT_FOUND``; a hidden
  agent's run (``/api/runs/<id>``, its steps, stream, cancel) is 404 ``RUN_NOT_FOUND``; its background
  task is 404 ``NOT_FOUND``; it is left out of ``GET /api/agents/``, the decisions audit, background
  task lists and thread messages (a thread with no visible run is 404 ``NOT_FOUND``). Websockets:
  ``ws/runs/<id>`` → error ``RUN_NOT_FOUND`` (close 4404), ``ws/agents/<hidden>/`` → ``AGENT_NOT_FOUND``
  (close 4404); the ``ws/approvals/`` feed drops the hidden agents' events. Dashboard: its runs are 404
  and it is absent from the inbox, thread pages and history.
- **Missing global permission → 403 ``PERMISSION_DENIED``** (REST), error ``PERMISSION_DENIED``
  (websocket frame), 403 (dashboard). The global check runs first and does not depend on the agent, so
  it reveals nothing either.
- **Dashboard decide POST**: 403 for anyone who may not decide that call (a viewer, or a reviewer outside
  the agent's groups), as docs/dashboard.md#who-may says of a forged decision.
- **Python API**: ``Agent.approve_tool_call(..., decided_by=Decider.person(user, via=…))`` (and every
  door's ``DecisionCommand``) raises ``AgentRunError("PERMISSION_DENIED")`` when that person may not
  decide the agent's calls. ``Decider.system(…)`` (the default in Python) is trusted server code: said
  so explicitly, never inferred from a type (``agentrun.engine.types.Decider``).
- **Sub-agents**: a supervisor's outer call that surfaces an inner call of a sub-agent can be decided
  only by someone who may decide both agents (deciding it runs the sub-agent's tool).

Group membership and permissions are read once per person every few seconds
(``agentrun.core.authcache``: a change made in this process takes effect at once, elsewhere within
``AGENTRUN_AUTH_CACHE_SECONDS``; docs/security.md#cached-identities); an open ``ws/approvals/``
socket keeps the scope it had when it connected.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.db.models import Q, QuerySet

from agentrun.core import authcache

VIEWERS = "Viewers"
REVIEWERS = "Reviewers"
VIEW_PERMISSION = "agentrun.view_run"
DECIDE_PERMISSION = "agentrun.decide_toolcall"
START_PERMISSION = "agentrun.start_run"
CANCEL_PERMISSION = "agentrun.cancel_run"

_VIEW_CODENAMES = [
    "view_thread",
    "view_message",
    "view_run",
    "view_runstep",
    "view_snapshot",
    "view_suspendedtoolcall",
    "view_decision",
    "view_runchunk",
    "view_tooleffect",
]
_REVIEW_CODENAMES = [*_VIEW_CODENAMES, "decide_toolcall", "start_run", "cancel_run"]


def ensure_groups(**_: Any) -> None:
    """Create the groups with their permissions (after every ``migrate``: permissions exist by then)."""
    from django.contrib.auth.models import Group, Permission

    for name, codenames in ((VIEWERS, _VIEW_CODENAMES), (REVIEWERS, _REVIEW_CODENAMES)):
        group, _created = Group.objects.get_or_create(name=name)
        perms = Permission.objects.filter(content_type__app_label="agentrun", codename__in=codenames)
        group.permissions.add(*perms)


class LoginLockoutBackend(AxesStandaloneBackend):
    """django-axes' backend (first in ``AUTHENTICATION_BACKENDS``): a locked-out account or address is
    refused before any password is checked (docs/security.md, "Throttling"). Every sign-in over HTTP
    passes its request; a call without one (server code, the test client's ``login``) has no address
    to count and is left to the next backend."""

    def authenticate(self, request: Any, username: str | None = None, password: str | None = None, **kwargs: Any):  # noqa: ANN201
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)


class PermissionBackend(ModelBackend):
    """Django's ``ModelBackend``, reading a person's permissions (their own and their groups') in one
    query instead of two: every REST request, websocket and page checks one permission.

    ``AUTHENTICATION_BACKENDS`` names it; the permissions and the cache (``user._perm_cache``, for the
    request) are Django's.
    """

    @staticmethod
    def _all_permissions(user_obj: Any) -> QuerySet:
        permissions = Permission.objects.all()
        if not user_obj.is_superuser:
            # Subqueries on the link tables rather than ModelBackend's joins through them: planned in a
            # tenth of the time (the planning is most of this query's cost).
            groups = type(user_obj).groups.through.objects.filter(user_id=user_obj.pk).values("group_id")
            via_groups = Group.permissions.through.objects.filter(group_id__in=groups).values("permission_id")
            own = type(user_obj).user_permissions.through.objects.filter(user_id=user_obj.pk).values("permission_id")
            permissions = permissions.filter(Q(pk__in=via_groups) | Q(pk__in=own))
        return permissions.values_list("content_type__app_label", "codename").order_by()

    def get_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):
            key = _permissions_key(user_obj)
            found, generation = authcache.get(key)
            if found is None:
                found = frozenset(f"{app}.{codename}" for app, codename in self._all_permissions(user_obj))
                authcache.put(key, found, generation)
            user_obj._perm_cache = set(found)
        return user_obj._perm_cache

    async def aget_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):
            key = _permissions_key(user_obj)
            found, generation = authcache.get(key)
            if found is None:
                found = frozenset([f"{app}.{codename}" async for app, codename in self._all_permissions(user_obj)])
                authcache.put(key, found, generation)
            user_obj._perm_cache = set(found)
        return user_obj._perm_cache


def _permissions_key(user: Any) -> tuple | None:
    """Where ``agentrun.core.authcache`` keeps a person's permissions (None: an unsaved user, not kept)."""
    return None if user.pk is None else ("permissions", user.pk, user.is_superuser)


def group_names(user: Any) -> frozenset[str]:
    """The names of the groups ``user`` belongs to (kept a few seconds: ``agentrun.core.authcache``)."""
    load = lambda: frozenset(user.groups.values_list("name", flat=True))  # noqa: E731
    return load() if user.pk is None else authcache.cached(("groups", user.pk), load)


def _authenticated(user: Any) -> bool:
    return bool(user is not None and getattr(user, "is_authenticated", False))


def can_view(user: Any) -> bool:
    """May read runs at all (the global permission; per-agent scope aside)."""
    return _authenticated(user) and user.has_perm(VIEW_PERMISSION)


def can_decide(user: Any) -> bool:
    """May decide tool calls at all (the global permission; per-agent scope aside)."""
    return _authenticated(user) and user.has_perm(DECIDE_PERMISSION)


# --- per-agent scope -----------------------------------------------------------------------------
def agent_reviewers() -> dict[str, frozenset[str]]:
    """``AGENTRUN_AGENT_REVIEWERS``: agent id → the groups that may see and decide its calls."""
    mapping = getattr(settings, "AGENTRUN_AGENT_REVIEWERS", None) or {}
    return {
        agent_id: frozenset([groups] if isinstance(groups, str) else groups) for agent_id, groups in mapping.items()
    }


def hidden_agent_ids(user: Any) -> frozenset[str]:
    """The agents of the mapping this user is outside of (everything mapped, for anonymous users).

    Agents absent from the mapping are never hidden, so filtering a query with
    ``exclude(agent_id__in=hidden_agent_ids(user))`` keeps every unrestricted agent, registered or not.
    """
    mapping = agent_reviewers()
    if not mapping:
        return frozenset()
    if not _authenticated(user):
        return frozenset(mapping)
    if user.is_active and user.is_superuser:
        return frozenset()
    names = group_names(user)
    return frozenset(agent_id for agent_id, groups in mapping.items() if not groups & names)


def in_agent_scope(user: Any, agent_id: str) -> bool:
    """Whether the mapping lets this user near ``agent_id`` (permissions aside)."""
    return agent_id not in hidden_agent_ids(user)


def can_view_agent(user: Any, agent_id: str) -> bool:
    """May see ``agent_id``'s runs, steps, calls and decisions."""
    return can_view(user) and in_agent_scope(user, agent_id)


def can_decide_agent(user: Any, agent_id: str) -> bool:
    """May approve / decline / resume ``agent_id``'s calls."""
    return can_decide(user) and in_agent_scope(user, agent_id)


def visible_agent_ids(user: Any, agent_ids: Iterable[str]) -> list[str]:
    """Those of ``agent_ids`` this user may see, in their order."""
    if not can_view(user):
        return []
    hidden = hidden_agent_ids(user)
    return [agent_id for agent_id in agent_ids if agent_id not in hidden]


def only_visible(queryset: QuerySet, user: Any, field: str = "agent_id") -> QuerySet:
    """``queryset`` without the rows of agents hidden from this user (``field`` names the agent id)."""
    hidden = hidden_agent_ids(user)
    return queryset.exclude(**{f"{field}__in": hidden}) if hidden else queryset


def revoke_grants_of_deactivated(sender: Any, instance: Any, **_: Any) -> None:
    """A deactivated person grants nothing any more: their live standing grants are revoked. (Every
    grant is also re-checked when it matches a call: a creator who left the reviewers, or was
    deactivated by a bulk update that sends no signal, approves nothing either.)"""
    if instance.is_active:
        return
    from django.utils import timezone

    from agentrun.core.models import StandingGrant

    StandingGrant.objects.filter(created_by=instance, revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_by_username=f"{instance.get_username()} (deactivated)"
    )

"""Who may do what: the ``Viewers`` and ``Reviewers`` groups and the permissions they hold."""

from __future__ import annotations

from typing import Any

VIEWERS = "Viewers"
REVIEWERS = "Reviewers"
VIEW_PERMISSION = "agentrun.view_run"
DECIDE_PERMISSION = "agentrun.decide_toolcall"
START_PERMISSION = "agentrun.start_run"
CANCEL_PERMISSION = "agentrun.cancel_run"

_VIEW_CODENAMES = [
    "view_thread", "view_message", "view_run", "view_runstep", "view_snapshot",
    "view_suspendedtoolcall", "view_decision", "view_runchunk", "view_tooleffect",
]
_REVIEW_CODENAMES = [*_VIEW_CODENAMES, "decide_toolcall", "start_run", "cancel_run"]


def ensure_groups(**_: Any) -> None:
    """Create the groups with their permissions (after every ``migrate``: permissions exist by then)."""
    from django.contrib.auth.models import Group, Permission

    for name, codenames in ((VIEWERS, _VIEW_CODENAMES), (REVIEWERS, _REVIEW_CODENAMES)):
        group, _ = Group.objects.get_or_create(name=name)
        perms = Permission.objects.filter(content_type__app_label="agentrun", codename__in=codenames)
        group.permissions.add(*perms)


def can_view(user: Any) -> bool:
    return bool(user and user.is_authenticated and user.has_perm(VIEW_PERMISSION))


def can_decide(user: Any) -> bool:
    return bool(user and user.is_authenticated and user.has_perm(DECIDE_PERMISSION))

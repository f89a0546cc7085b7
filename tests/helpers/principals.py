"""The security matrix's world (tests/security): one principal of each kind, and agents scoped to groups
(``AGENTRUN_AGENT_REVIEWERS``, docs/api.md#authentication-and-permissions)."""

from __future__ import annotations

import uuid

from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group, User
from rest_framework.authtoken.models import Token

from agentrun.core.access import REVIEWERS, VIEWERS, ensure_groups
from agentrun.core.models import Decision, Run, SuspendedToolCall

TARGET = "support-agent"
SUPPORT_REVIEWERS = "Support reviewers"
BILLING_REVIEWERS = "Billing reviewers"
MAPPING = {TARGET: [SUPPORT_REVIEWERS], "billing-agent": [BILLING_REVIEWERS]}


@sync_to_async
def make_principals() -> dict[str, User | None]:
    ensure_groups()  # a transactional test flushed the groups post_migrate made

    def user(name: str, *groups: str, superuser: bool = False) -> User:
        made = User.objects.create_user(name, password=f"pw-{name}-1234", is_superuser=superuser, is_staff=superuser)
        made.groups.add(*(Group.objects.get_or_create(name=g)[0] for g in groups))
        return made

    return {
        "anonymous": None,
        "viewer": user("vera", VIEWERS, SUPPORT_REVIEWERS),
        "other": user("bill", REVIEWERS, BILLING_REVIEWERS),
        "reviewer": user("rita", REVIEWERS, SUPPORT_REVIEWERS),
        "superuser": user("root", superuser=True),
    }


@sync_to_async
def token_of(user: User | None) -> str | None:
    return None if user is None else Token.objects.get_or_create(user=user)[0].key


def new_thread() -> str:
    return f"sec-{uuid.uuid4().hex[:10]}"


@sync_to_async
def run_state(run_id: str) -> tuple[str, int, int]:
    """(status, decisions, open calls): what a refused write must leave as it was."""
    return (
        Run.objects.get(pk=run_id).status,
        Decision.objects.filter(run_id=run_id).count(),
        SuspendedToolCall.objects.filter(run_id=run_id, status=SuspendedToolCall.Status.OPEN).count(),
    )

"""Who is on an open call, as every surface shows it (docs/dashboard.md#shared-work): the value, the
claim's lifetime and the routing rules. Pure: no queries (``agentrun.core.claims`` reads and writes)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from agentrun.core.timeutil import iso


def idle() -> timedelta:
    """How long a claim lives without its claimer touching the call (``AGENTRUN_CLAIM_IDLE_SECONDS``)."""
    return timedelta(seconds=settings.AGENTRUN_CLAIM_IDLE_SECONDS)


def routed_group(agent_id: str, tool_name: str) -> str | None:
    """The group a routing rule assigns this tool's calls to (the tool's rule first, then the agent's)."""
    routes = settings.AGENTRUN_REVIEW_ROUTES
    return routes["tools"].get(tool_name) or routes["agents"].get(agent_id)


@dataclass(frozen=True)
class ClaimState:
    """Who is on one open call, as every surface shows it."""

    claimed_by: str | None = None  # a live claim's person (an expired claim is no claim)
    claimed_at: datetime | None = None
    assignee: str | None = None  # a person's username
    assignee_group: str | None = None  # a group: assigned, or named by a routing rule
    routed: bool = False  # the group comes from a routing rule, not from someone's assignment

    @property
    def empty(self) -> bool:
        return not (self.claimed_by or self.assignee or self.assignee_group)

    def to_dict(self) -> dict[str, Any]:
        """``claim`` of a listing item and of a ``ws/approvals`` event (docs/api.md#wsapprovals)."""
        return {
            "claimedBy": self.claimed_by,
            "claimedAt": iso(self.claimed_at) if self.claimed_at else None,
            "assignee": self.assignee,
            "assigneeGroup": self.assignee_group,
            "routed": self.routed,
        }


def live(claimed_by: str | None, touched_at: datetime | None, now: datetime | None = None) -> bool:
    """A claim is live until ``idle()`` passes without its claimer touching the call."""
    now = now or timezone.now()
    return bool(claimed_by) and touched_at is not None and touched_at > now - idle()


def state(
    *,
    claimed_by: str | None,
    claimed_at: datetime | None,
    touched_at: datetime | None,
    assignee: str | None,
    assignee_group: str | None,
    agent_id: str,
    tool_name: str,
    now: datetime | None = None,
) -> ClaimState:
    """The state of a call from its columns: an expired claim is no claim; no assignment: the route."""
    is_live = live(claimed_by, touched_at, now)
    routed = False
    if assignee is None and assignee_group is None:
        assignee_group = routed_group(agent_id, tool_name)
        routed = assignee_group is not None
    return ClaimState(
        claimed_by=claimed_by if is_live else None,
        claimed_at=claimed_at if is_live else None,
        assignee=assignee,
        assignee_group=assignee_group,
        routed=routed,
    )

"""``DecisionRollup``: decisions per agent, tool and day, which the metrics page reads (docs/operations.md).

Decisions are rolled up by a database trigger (migration ``0012_operations``). Escalations decide
nothing, so no trigger sees them: the timeout policy records each here, in its own transaction.
"""

from __future__ import annotations

import bisect
from datetime import datetime

from django.db import connection
from django.utils import timezone

from agentrun.core.metrics import WAIT_BUCKETS
from agentrun.core.models import DecisionRollup


def wait_bucket(seconds: float | None) -> int:
    """The rollup's bucket of a wait: the first of ``WAIT_BUCKETS`` at or above it (len: longer; -1: unknown)."""
    if seconds is None:
        return -1
    return bisect.bisect_left(WAIT_BUCKETS, seconds)


def record_escalation(*, agent_id: str, tool_name: str, waiting_since: datetime | None, slot_of: str) -> None:
    """One escalation of a call (of ``agent_id``'s ``tool_name``) that waited since ``waiting_since``;
    ``slot_of``: an id that spreads the row like the trigger's (the call's run id)."""
    now = timezone.now()
    waited = (now - waiting_since).total_seconds() if waiting_since else None
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO agentrun_decisionrollup (agent_id, tool_name, day, kind, via, policy, edited, wait_bucket, "
            "slot, decisions, waited_seconds) VALUES (%s, %s, %s, %s, 'policy', 'timeout', %s, %s, %s, 1, %s) "
            "ON CONFLICT (agent_id, tool_name, day, kind, via, policy, edited, wait_bucket, slot) DO UPDATE SET "
            "decisions = agentrun_decisionrollup.decisions + excluded.decisions, "
            "waited_seconds = agentrun_decisionrollup.waited_seconds + excluded.waited_seconds",
            [
                agent_id,
                tool_name,
                now.date(),
                DecisionRollup.ESCALATE,
                False,
                wait_bucket(waited),
                ord(slot_of[-1]) % DecisionRollup.SLOTS,
                waited or 0.0,
            ],
        )

"""Migration 0011 backfills ``Decision.risk`` for the decisions made before it, best evidence first."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from agentrun import get_agent
from agentrun.core.models import Decision, SuspendedToolCall
from tests.helpers.decisions import record_decision
from tests.helpers.runs import EMAIL, start, suspended_email_run, tool_line

pytestmark = pytest.mark.django_db(transaction=True)


def _migrate(target: list[tuple[str, str]]) -> None:
    MigrationExecutor(connection).migrate(target)


def test_the_backfill_takes_the_calls_row_else_the_tools_declaration(monkeypatch):
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    deleting, _ = async_to_sync(start)("support-agent", tool_line("delete-record", {"table": "t", "id": 1}))
    emailed = async_to_sync(suspended_email_run)(thread="t-mail", args=EMAIL)
    kept = record_decision(agent_id="support-agent", run_id=deleting.run_id, kind="approve").decision
    gone = record_decision(agent_id="support-agent", run_id=emailed, kind="decline").decision
    SuspendedToolCall.objects.filter(decision=gone).delete()  # its run went on: only the registry knows

    _migrate([("agentrun", "0010_snapshot_count_truncate")])  # before the field
    tools = get_agent("support-agent").tools
    for tool_id, risk in (("delete-record", "low"), ("send-email", "low")):  # re-declared since
        monkeypatch.setattr(tools[tool_id], "risk", risk)
    _migrate(leaves)

    risks = dict(Decision.objects.values_list("id", "risk"))
    assert risks == {kept.id: "high", gone.id: "low"}


def test_automatic_decisions_keep_the_calls_risk_too():
    """A standing grant's approval (via policy) and an expiry (via system) record the risk as a person's
    decision does: what the call showed, here send-email's medium and delete-record's high."""
    from datetime import timedelta

    from django.utils import timezone

    from agentrun.core.models import Run, Snapshot, StandingGrant
    from agentrun.engine.decisions import expire_run_if_due
    from tests.helpers.users import make_user

    delete = tool_line("delete-record", {"table": "t", "id": 1})
    StandingGrant.objects.create(
        agent_id="support-agent", tool_name="send-email", scope="thread", scope_id="t-g", created_by=make_user("gina")
    )
    async_to_sync(start)("support-agent", tool_line("send-email", EMAIL), thread="t-g")
    waiting, _ = async_to_sync(start)("support-agent", delete, thread="t-x")
    past = timezone.now() - timedelta(seconds=1)
    Run.objects.filter(pk=waiting.run_id).update(expires_at=past)
    Snapshot.objects.filter(run_id=waiting.run_id).update(expires_at=past)
    assert expire_run_if_due(waiting.run_id)
    assert sorted(Decision.objects.values_list("via", "kind", "risk")) == [
        ("policy", "approve", "medium"),
        ("system", "expire", "high"),
    ]

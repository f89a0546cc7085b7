"""Migration 0011 backfills ``Decision.risk`` for the decisions made before it, best evidence first."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from agentrun import get_agent
from agentrun.models import Decision, SuspendedToolCall
from tests.factories import EMAIL, record_decision, start, suspended_email_run, tool_line

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

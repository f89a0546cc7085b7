"""``Decision.risk``: the risk the decided call carried, kept with the decision (the audit trail).

Until now the history derived a decision's risk from the tool's current declaration, so a declaration
changed later rewrote the past, and a sub-agent's surfaced call read as its riskiest approval tool.

Backfill of the decisions made before this field, best evidence first:
1. the decided call's row, where it is still stored (a run still waiting, or not cleaned up yet): its
   ``risk`` is what the reviewer saw (for a sub-agent's surfaced call, the inner call's);
2. otherwise what the history showed until now, from the registry of the process that migrates: the
   tool's declared ``risk``; for a sub-agent tool, the highest among its sub-agent's approval tools;
3. otherwise (an agent or tool no longer registered) ``"medium"``, the default of an approval tool.
"""

from django.db import migrations, models
from django.db.models import OuterRef, Subquery

RISK_ORDER = {"low": 0, "medium": 1, "high": 2}


def _declared_risk(agent_id, tool_name):
    """The risk the history page derived from the registry before this migration (frozen here)."""
    from agentrun.core.errors import AgentRunError
    from agentrun.engine.registry import get_agent

    try:
        tool = get_agent(agent_id).tools.get(tool_name)
    except AgentRunError:
        return None
    if tool is None:
        return None
    inner = getattr(tool, "agent", None)
    if inner is not None:
        risks = [_declared_risk(inner.id, t.id) for t in inner.tools.values() if t.requires_approval]
        return max((r for r in risks if r), key=RISK_ORDER.__getitem__, default=tool.risk)
    return tool.risk


def backfill(apps, schema_editor):
    Decision = apps.get_model("agentrun", "Decision")
    SuspendedToolCall = apps.get_model("agentrun", "SuspendedToolCall")
    pairs = Decision.objects.order_by().values_list("agent_id", "tool_name").distinct()
    for agent_id, tool_name in list(pairs):
        risk = _declared_risk(agent_id, tool_name)
        if risk and risk != "medium":
            Decision.objects.filter(agent_id=agent_id, tool_name=tool_name).update(risk=risk)
    decided = SuspendedToolCall.objects.filter(decision_id=OuterRef("pk"), run_id=OuterRef("run_id"))
    Decision.objects.filter(models.Exists(decided)).update(risk=Subquery(decided.values("risk")[:1]))


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0010_snapshot_count_truncate"),
    ]

    operations = [
        migrations.AddField(
            model_name="decision",
            name="risk",
            field=models.CharField(
                choices=[("low", "Low"), ("medium", "Medium"), ("high", "High")], default="medium", max_length=8
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]

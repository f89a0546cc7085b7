"""Operations (docs/operations.md): the counters the metrics read, kept by triggers; the indexes the
retention prunes on; ``Decision.waiting_since``.

- ``WaitingCallCount``: open calls per agent and risk, kept by triggers on ``agentrun_suspendedtoolcall``
  (as ``0009_listing_counters`` keeps ``SnapshotCount``): ``agentrun_waiting_calls`` is a sum of a few
  rows, not a count over the open calls. The agent comes from the call's run (a primary-key lookup).
- ``DecisionRollup``: decisions per agent, tool, day, kind, via, policy, edited, wait bucket, kept by a
  trigger on ``agentrun_decision`` (decisions are only ever inserted): the metrics page reads it, never
  the decisions.

PostgreSQL: statement-level triggers over transition tables, keys upserted in key order (no deadlock
between concurrent writers). SQLite: row-level triggers. Existing rows are counted right after the
triggers are installed (on PostgreSQL the triggers lock out writers until this commits).
"""

import django.db.models.functions.comparison
from django.conf import settings
from django.db import migrations, models

SLOTS = 8  # WaitingCallCount.SLOTS and DecisionRollup.SLOTS, frozen here
# agentrun.core.metrics.WAIT_BUCKETS, frozen here: bucket i holds waits <= WAIT_BUCKETS[i] seconds, the
# last one (len) the longer waits, -1 the decisions whose wait is unknown (no waiting_since).
WAIT_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 43200, 86400, 172800, 604800)

SLOT = {  # per vendor: a row's slot, from the last character of an id
    "postgresql": f"ascii(right({{id}}, 1)) % {SLOTS}",
    "sqlite": f"unicode(substr({{id}}, -1)) % {SLOTS}",
}
WAITED = {  # per vendor: seconds from one timestamp to another
    "postgresql": "extract(epoch from ({end} - {start}))",
    "sqlite": "((julianday({end}) - julianday({start})) * 86400.0)",
}
DAY = {"postgresql": "({at} AT TIME ZONE 'UTC')::date", "sqlite": "date({at})"}
POLICY = {
    "postgresql": "coalesce({details} ->> 'policy', '')",
    "sqlite": "coalesce(json_extract({details}, '$.policy'), '')",
}


ROLLUP_KEY = ("agent_id", "tool_name", "day", "kind", "via", "policy", "edited", "wait_bucket", "slot")


def _rollup_columns(row: str, vendor: str) -> list[str]:
    """A decision row's rollup key (``ROLLUP_KEY``) and its wait in seconds, as SQL expressions."""
    waited = WAITED[vendor].format(end=f"{row}.decided_at", start=f"{row}.waiting_since")
    buckets = " ".join(f"WHEN {waited} <= {bound} THEN {i}" for i, bound in enumerate(WAIT_BUCKETS))
    return [
        f"{row}.agent_id",
        f"{row}.tool_name",
        DAY[vendor].format(at=f"{row}.decided_at"),
        f"{row}.kind",
        f"{row}.via",
        POLICY[vendor].format(details=f"{row}.details"),
        f"{row}.edited_args IS NOT NULL",
        f"CASE WHEN {row}.waiting_since IS NULL THEN -1 {buckets} ELSE {len(WAIT_BUCKETS)} END",
        SLOT[vendor].format(id=f"{row}.id"),
        f"coalesce({waited}, 0)",
    ]


ROLLUP_INSERT = f"INSERT INTO agentrun_decisionrollup ({', '.join(ROLLUP_KEY)}, decisions, waited_seconds) "
ROLLUP_CONFLICT = (
    f"ON CONFLICT ({', '.join(ROLLUP_KEY)}) DO UPDATE SET "
    "decisions = agentrun_decisionrollup.decisions + excluded.decisions, "
    "waited_seconds = agentrun_decisionrollup.waited_seconds + excluded.waited_seconds"
)


def _rollup_from(table: str, vendor: str, *, upsert: bool = True) -> str:
    """The rollup rows of every decision in ``table``, grouped (upserted in key order)."""
    columns = ", ".join(
        f"{expr} AS {name}" for expr, name in zip(_rollup_columns("d", vendor), [*ROLLUP_KEY, "waited"], strict=True)
    )
    key = ", ".join(ROLLUP_KEY)
    positions = ", ".join(str(i) for i in range(1, len(ROLLUP_KEY) + 1))
    return (
        f"{ROLLUP_INSERT} SELECT {key}, count(*), sum(waited) FROM (SELECT {columns} FROM {table} AS d) AS k "
        f"GROUP BY {positions} ORDER BY {positions} " + (ROLLUP_CONFLICT if upsert else "")
    )


WAITING_UPSERT = (
    "INSERT INTO agentrun_waitingcallcount (agent_id, risk, slot, calls) {rows} "
    "ON CONFLICT (agent_id, risk, slot) DO UPDATE SET calls = agentrun_waitingcallcount.calls + excluded.calls"
)


def _pg_waiting_delta(added: str | None, removed: str | None) -> str:
    """The open calls a statement added (+1) and removed (-1), netted per (agent, risk, slot)."""
    parts = []
    if added:
        parts.append(f"SELECT run_id, risk, 1 AS n FROM {added} WHERE status = 'open'")
    if removed:
        parts.append(f"SELECT run_id, risk, -1 AS n FROM {removed} WHERE status = 'open'")
    slot = SLOT["postgresql"].format(id="c.run_id")
    rows = (
        f"SELECT run.agent_id, c.risk, {slot}, sum(c.n) FROM ({' UNION ALL '.join(parts)}) AS c "
        "JOIN agentrun_run AS run ON run.id = c.run_id GROUP BY 1, 2, 3 HAVING sum(c.n) <> 0 ORDER BY 1, 2, 3"
    )
    return WAITING_UPSERT.format(rows=rows)


def _pg_function(name: str, statement: str) -> str:
    return f"""
    CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        {statement};
        RETURN NULL;
    END $$
    """


PG_INSTALL = [
    _pg_function("agentrun_waiting_calls_add", _pg_waiting_delta("added_calls", None)),
    _pg_function("agentrun_waiting_calls_remove", _pg_waiting_delta(None, "removed_calls")),
    _pg_function("agentrun_waiting_calls_update", _pg_waiting_delta("added_calls", "removed_calls")),
    _pg_function("agentrun_decision_rollup_add", _rollup_from("added_decisions", "postgresql")),
    """
    CREATE TRIGGER agentrun_waiting_calls_insert AFTER INSERT ON agentrun_suspendedtoolcall
    REFERENCING NEW TABLE AS added_calls FOR EACH STATEMENT EXECUTE FUNCTION agentrun_waiting_calls_add()
    """,
    """
    CREATE TRIGGER agentrun_waiting_calls_delete AFTER DELETE ON agentrun_suspendedtoolcall
    REFERENCING OLD TABLE AS removed_calls FOR EACH STATEMENT EXECUTE FUNCTION agentrun_waiting_calls_remove()
    """,
    """
    CREATE TRIGGER agentrun_waiting_calls_update AFTER UPDATE ON agentrun_suspendedtoolcall
    REFERENCING OLD TABLE AS removed_calls NEW TABLE AS added_calls
    FOR EACH STATEMENT EXECUTE FUNCTION agentrun_waiting_calls_update()
    """,
    """
    CREATE TRIGGER agentrun_decision_rollup_insert AFTER INSERT ON agentrun_decision
    REFERENCING NEW TABLE AS added_decisions FOR EACH STATEMENT EXECUTE FUNCTION agentrun_decision_rollup_add()
    """,
    # TRUNCATE fires no row trigger (as in 0010): a truncated table's counts go with it.
    _pg_function("agentrun_waiting_calls_clear", "DELETE FROM agentrun_waitingcallcount"),
    _pg_function("agentrun_decision_rollup_clear", "DELETE FROM agentrun_decisionrollup"),
    """
    CREATE TRIGGER agentrun_waiting_calls_truncate AFTER TRUNCATE ON agentrun_suspendedtoolcall
    FOR EACH STATEMENT EXECUTE FUNCTION agentrun_waiting_calls_clear()
    """,
    """
    CREATE TRIGGER agentrun_decision_rollup_truncate AFTER TRUNCATE ON agentrun_decision
    FOR EACH STATEMENT EXECUTE FUNCTION agentrun_decision_rollup_clear()
    """,
]
PG_UNINSTALL = [
    "DROP TRIGGER IF EXISTS agentrun_waiting_calls_insert ON agentrun_suspendedtoolcall",
    "DROP TRIGGER IF EXISTS agentrun_waiting_calls_delete ON agentrun_suspendedtoolcall",
    "DROP TRIGGER IF EXISTS agentrun_waiting_calls_update ON agentrun_suspendedtoolcall",
    "DROP TRIGGER IF EXISTS agentrun_decision_rollup_insert ON agentrun_decision",
    "DROP TRIGGER IF EXISTS agentrun_waiting_calls_truncate ON agentrun_suspendedtoolcall",
    "DROP TRIGGER IF EXISTS agentrun_decision_rollup_truncate ON agentrun_decision",
    "DROP FUNCTION IF EXISTS agentrun_waiting_calls_clear()",
    "DROP FUNCTION IF EXISTS agentrun_decision_rollup_clear()",
    "DROP FUNCTION IF EXISTS agentrun_waiting_calls_add()",
    "DROP FUNCTION IF EXISTS agentrun_waiting_calls_remove()",
    "DROP FUNCTION IF EXISTS agentrun_waiting_calls_update()",
    "DROP FUNCTION IF EXISTS agentrun_decision_rollup_add()",
]


def _sqlite_waiting(row: str, n: int) -> str:
    """+n for the call ``row`` (NEW or OLD) if it is open."""
    slot = SLOT["sqlite"].format(id=f"{row}.run_id")
    rows = (
        f"SELECT run.agent_id, {row}.risk, {slot}, {n} FROM agentrun_run AS run "
        f"WHERE {row}.status = 'open' AND run.id = {row}.run_id"
    )
    return WAITING_UPSERT.format(rows=rows) + ";"


SQLITE_INSTALL = [
    "CREATE TRIGGER agentrun_waiting_calls_insert AFTER INSERT ON agentrun_suspendedtoolcall "
    f"BEGIN {_sqlite_waiting('NEW', 1)} END",
    "CREATE TRIGGER agentrun_waiting_calls_delete AFTER DELETE ON agentrun_suspendedtoolcall "
    f"BEGIN {_sqlite_waiting('OLD', -1)} END",
    # An update counts as the old row leaving and the new one arriving (each only if open).
    "CREATE TRIGGER agentrun_waiting_calls_update AFTER UPDATE OF status, risk, run_id ON agentrun_suspendedtoolcall "
    f"WHEN OLD.status = 'open' OR NEW.status = 'open' BEGIN {_sqlite_waiting('OLD', -1)} {_sqlite_waiting('NEW', 1)} END",
    # WHERE true: SQLite's upsert after a SELECT needs it to parse.
    "CREATE TRIGGER agentrun_decision_rollup_insert AFTER INSERT ON agentrun_decision BEGIN "
    f"{ROLLUP_INSERT} SELECT {', '.join(_rollup_columns('NEW', 'sqlite')[:-1])}, 1, "
    f"{_rollup_columns('NEW', 'sqlite')[-1]} WHERE true {ROLLUP_CONFLICT}; END",
]
SQLITE_UNINSTALL = [
    "DROP TRIGGER IF EXISTS agentrun_waiting_calls_insert",
    "DROP TRIGGER IF EXISTS agentrun_waiting_calls_delete",
    "DROP TRIGGER IF EXISTS agentrun_waiting_calls_update",
    "DROP TRIGGER IF EXISTS agentrun_decision_rollup_insert",
]

# Finished task results (django_tasks_db), pruned by the retention oldest first.
TASKS_INDEX = (
    "CREATE INDEX agentrun_task_finished ON django_tasks_database_dbtaskresult (finished_at) "
    "WHERE status IN ('SUCCESSFUL', 'FAILED')"
)


def install(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for sql in PG_INSTALL if vendor == "postgresql" else SQLITE_INSTALL:
        schema_editor.execute(sql, params=None)  # None: the SQL's "%" is not a placeholder
    schema_editor.execute(
        "INSERT INTO agentrun_waitingcallcount (agent_id, risk, slot, calls) "
        f"SELECT run.agent_id, c.risk, {SLOT[vendor].format(id='c.run_id')}, count(*) "
        "FROM agentrun_suspendedtoolcall AS c JOIN agentrun_run AS run ON run.id = c.run_id "
        "WHERE c.status = 'open' GROUP BY 1, 2, 3",
        params=None,
    )
    schema_editor.execute(_rollup_from("agentrun_decision", vendor, upsert=False), params=None)
    schema_editor.execute(TASKS_INDEX, params=None)


def uninstall(apps, schema_editor):
    for sql in PG_UNINSTALL if schema_editor.connection.vendor == "postgresql" else SQLITE_UNINSTALL:
        schema_editor.execute(sql, params=None)
    schema_editor.execute("DROP INDEX IF EXISTS agentrun_task_finished", params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('agentrun', '0011_decision_risk'),
        ('django_tasks_database', '0021_conditional_partial_index_ordering'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='DecisionRollup',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('agent_id', models.CharField(max_length=128)),
                ('tool_name', models.CharField(max_length=128)),
                ('day', models.DateField()),
                ('kind', models.CharField(max_length=16)),
                ('via', models.CharField(max_length=16)),
                ('policy', models.CharField(blank=True, default='', max_length=16)),
                ('edited', models.BooleanField(default=False)),
                ('wait_bucket', models.SmallIntegerField()),
                ('slot', models.PositiveSmallIntegerField()),
                ('decisions', models.BigIntegerField()),
                ('waited_seconds', models.FloatField(default=0.0)),
            ],
        ),
        migrations.CreateModel(
            name='RetentionCursor',
            fields=[
                ('name', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('position_at', models.DateTimeField()),
                ('position_id', models.CharField(max_length=255)),
            ],
        ),
        migrations.CreateModel(
            name='WaitingCallCount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('agent_id', models.CharField(max_length=128)),
                ('risk', models.CharField(max_length=8)),
                ('slot', models.PositiveSmallIntegerField()),
                ('calls', models.BigIntegerField()),
            ],
        ),
        migrations.AddField(
            model_name='decision',
            name='waiting_since',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='idempotencykey',
            index=models.Index(fields=['created_at'], name='idempotency_created'),
        ),
        migrations.AddIndex(
            model_name='outboxevent',
            index=models.Index(condition=models.Q(('handled_at__isnull', False)), fields=['created_at'], name='event_handled'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(django.db.models.functions.comparison.Coalesce('completed_at', 'failed_at', 'cancelled_at', 'expired_at'), models.F('id'), condition=models.Q(('status__in', ['cancelled', 'completed', 'expired', 'failed'])), name='run_ended'),
        ),
        migrations.AddIndex(
            model_name='snapshot',
            index=models.Index(fields=['agent_id', 'suspended_at'], name='snapshot_agent_waiting'),
        ),
        migrations.AddIndex(
            model_name='decisionrollup',
            index=models.Index(fields=['day', 'agent_id'], name='decision_rollup_day'),
        ),
        migrations.AddConstraint(
            model_name='decisionrollup',
            constraint=models.UniqueConstraint(fields=('agent_id', 'tool_name', 'day', 'kind', 'via', 'policy', 'edited', 'wait_bucket', 'slot'), name='one_decision_rollup_per_key'),
        ),
        migrations.AddConstraint(
            model_name='waitingcallcount',
            constraint=models.UniqueConstraint(fields=('agent_id', 'risk', 'slot'), name='one_waiting_call_count_per_slot'),
        ),
        migrations.RunPython(install, uninstall),
    ]

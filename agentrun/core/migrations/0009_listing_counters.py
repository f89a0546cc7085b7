"""The listing's ``total`` from counters (``SnapshotCount``), kept by triggers on ``agentrun_snapshot``.

Triggers, not engine code: whoever inserts, updates or deletes a snapshot (the engine, the admin, a
cascade from a deleted run, a bulk load) changes the counts in the same statement, hence the same
transaction. PostgreSQL: statement-level triggers over transition tables (a bulk insert costs one
upsert per key, not per row); counters are locked in key order, so concurrent writers cannot deadlock
on them. SQLite: row-level triggers (writers are serialised anyway). The slot of a snapshot is derived
from the last character of its run id: stable, so a removal finds the row its insertion counted in.
"""

from django.db import migrations, models

SLOTS = 8  # SnapshotCount.SLOTS, frozen here

SLOT = {  # per vendor: the slot of a snapshot row, from the last character of its run id
    "postgresql": f"ascii(right(run_id, 1)) % {SLOTS}",
    "sqlite": f"unicode(substr(run_id, -1)) % {SLOTS}",
}


def _counted(rows: str, vendor: str) -> str:
    """(agent_id, scope, scope_id, slot, n): how many of ``rows`` count under each key."""
    slot = SLOT[vendor]
    keys = (
        f"SELECT agent_id, 'agent' AS scope, '' AS scope_id, {slot} AS slot FROM {rows} "
        f"UNION ALL SELECT agent_id, 'thread', thread_id, {slot} FROM {rows} "
        f"UNION ALL SELECT agent_id, 'resource', resource_id, {slot} FROM {rows} WHERE resource_id IS NOT NULL"
    )
    return f"SELECT agent_id, scope, scope_id, slot, count(*) AS n FROM ({keys}) AS keys GROUP BY 1, 2, 3, 4"


PG_INSTALL = [
    f"""
    CREATE FUNCTION agentrun_snapshot_count_add() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO agentrun_snapshotcount AS c (agent_id, scope, scope_id, slot, snapshots)
        {_counted("added_snapshots", "postgresql")} ORDER BY 1, 2, 3, 4
        ON CONFLICT (agent_id, scope, scope_id, slot) DO UPDATE SET snapshots = c.snapshots + EXCLUDED.snapshots;
        RETURN NULL;
    END $$
    """,
    f"""
    CREATE FUNCTION agentrun_snapshot_count_remove() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        k record;
        left_over bigint;
    BEGIN
        -- One key at a time, in key order: each statement is a primary-key lookup, and the locks are
        -- taken in the same order as the insertion's upsert takes them.
        FOR k IN {_counted("removed_snapshots", "postgresql")} ORDER BY 1, 2, 3, 4 LOOP
            UPDATE agentrun_snapshotcount SET snapshots = snapshots - k.n
            WHERE agent_id = k.agent_id AND scope = k.scope AND scope_id = k.scope_id AND slot = k.slot
            RETURNING snapshots INTO left_over;
            IF left_over = 0 THEN
                DELETE FROM agentrun_snapshotcount
                WHERE agent_id = k.agent_id AND scope = k.scope AND scope_id = k.scope_id AND slot = k.slot;
            END IF;
        END LOOP;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER agentrun_snapshot_count_insert AFTER INSERT ON agentrun_snapshot
    REFERENCING NEW TABLE AS added_snapshots FOR EACH STATEMENT EXECUTE FUNCTION agentrun_snapshot_count_add()
    """,
    """
    CREATE TRIGGER agentrun_snapshot_count_delete AFTER DELETE ON agentrun_snapshot
    REFERENCING OLD TABLE AS removed_snapshots FOR EACH STATEMENT EXECUTE FUNCTION agentrun_snapshot_count_remove()
    """,
    # An update counts as the old rows leaving and the new ones arriving (a no-op unless a key changed).
    """
    CREATE TRIGGER agentrun_snapshot_count_update_new AFTER UPDATE ON agentrun_snapshot
    REFERENCING NEW TABLE AS added_snapshots FOR EACH STATEMENT EXECUTE FUNCTION agentrun_snapshot_count_add()
    """,
    """
    CREATE TRIGGER agentrun_snapshot_count_update_old AFTER UPDATE ON agentrun_snapshot
    REFERENCING OLD TABLE AS removed_snapshots FOR EACH STATEMENT EXECUTE FUNCTION agentrun_snapshot_count_remove()
    """,
]
PG_UNINSTALL = [
    "DROP TRIGGER IF EXISTS agentrun_snapshot_count_insert ON agentrun_snapshot",
    "DROP TRIGGER IF EXISTS agentrun_snapshot_count_delete ON agentrun_snapshot",
    "DROP TRIGGER IF EXISTS agentrun_snapshot_count_update_new ON agentrun_snapshot",
    "DROP TRIGGER IF EXISTS agentrun_snapshot_count_update_old ON agentrun_snapshot",
    "DROP FUNCTION IF EXISTS agentrun_snapshot_count_add()",
    "DROP FUNCTION IF EXISTS agentrun_snapshot_count_remove()",
]

SQLITE_SCOPES = (("agent", "''"), ("thread", "{row}.thread_id"), ("resource", "{row}.resource_id"))


def _sqlite_add(row: str) -> str:
    slot = SLOT["sqlite"].replace("run_id", f"{row}.run_id")
    keys = " UNION ALL ".join(
        f"SELECT {row}.agent_id, '{scope}', {scope_id.format(row=row)}, {slot}, 1" for scope, scope_id in SQLITE_SCOPES
    )
    # The WHERE ends the SELECT before ON CONFLICT (SQLite's upsert parsing needs one).
    return (
        f"INSERT INTO agentrun_snapshotcount (agent_id, scope, scope_id, slot, snapshots) {keys} "
        f"WHERE {row}.resource_id IS NOT NULL "
        "ON CONFLICT (agent_id, scope, scope_id, slot) DO UPDATE SET snapshots = snapshots + excluded.snapshots;"
    )


def _sqlite_remove(row: str) -> str:
    slot = SLOT["sqlite"].replace("run_id", f"{row}.run_id")
    statements = []
    for scope, scope_id in SQLITE_SCOPES:
        key = f"agent_id = {row}.agent_id AND scope = '{scope}' AND scope_id = {scope_id.format(row=row)} AND slot = {slot}"
        statements.append(f"UPDATE agentrun_snapshotcount SET snapshots = snapshots - 1 WHERE {key};")
        statements.append(f"DELETE FROM agentrun_snapshotcount WHERE {key} AND snapshots = 0;")
    return " ".join(statements)


SQLITE_INSTALL = [
    f"CREATE TRIGGER agentrun_snapshot_count_insert AFTER INSERT ON agentrun_snapshot BEGIN {_sqlite_add('NEW')} END",
    f"CREATE TRIGGER agentrun_snapshot_count_delete AFTER DELETE ON agentrun_snapshot BEGIN {_sqlite_remove('OLD')} END",
    "CREATE TRIGGER agentrun_snapshot_count_update AFTER UPDATE OF run_id, agent_id, thread_id, resource_id "
    "ON agentrun_snapshot WHEN OLD.run_id IS NOT NEW.run_id OR OLD.agent_id IS NOT NEW.agent_id "
    "OR OLD.thread_id IS NOT NEW.thread_id OR OLD.resource_id IS NOT NEW.resource_id "
    f"BEGIN {_sqlite_remove('OLD')} {_sqlite_add('NEW')} END",
]
SQLITE_UNINSTALL = [
    "DROP TRIGGER IF EXISTS agentrun_snapshot_count_insert",
    "DROP TRIGGER IF EXISTS agentrun_snapshot_count_delete",
    "DROP TRIGGER IF EXISTS agentrun_snapshot_count_update",
]


def install(apps, schema_editor):
    """The triggers first (on PostgreSQL they lock out snapshot writers until this commits), then the
    counts of the snapshots that exist: exact, with no write slipping between the two."""
    vendor = schema_editor.connection.vendor
    for sql in PG_INSTALL if vendor == "postgresql" else SQLITE_INSTALL:
        schema_editor.execute(sql, params=None)  # None: the SQL's "%" is not a placeholder
    schema_editor.execute(
        "INSERT INTO agentrun_snapshotcount (agent_id, scope, scope_id, slot, snapshots) "
        + _counted("agentrun_snapshot", vendor),
        params=None,
    )


def uninstall(apps, schema_editor):
    for sql in PG_UNINSTALL if schema_editor.connection.vendor == "postgresql" else SQLITE_UNINSTALL:
        schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('agentrun', '0008_sweeper_indexes'),
    ]

    operations = [
        migrations.CreateModel(
            name='SnapshotCount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('agent_id', models.CharField(max_length=128)),
                ('scope', models.CharField(choices=[('agent', 'Agent'), ('thread', 'Thread'), ('resource', 'Resource')], max_length=8)),
                ('scope_id', models.CharField(blank=True, default='', max_length=255)),
                ('slot', models.PositiveSmallIntegerField()),
                ('snapshots', models.BigIntegerField()),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('agent_id', 'scope', 'scope_id', 'slot'), name='one_snapshot_count_per_slot')],
            },
        ),
        migrations.AddIndex(
            model_name='snapshot',
            index=models.Index(condition=models.Q(('expires_at__isnull', False)), fields=['agent_id', 'expires_at'], name='snapshot_agent_expiry'),
        ),
        migrations.RunPython(install, uninstall),
    ]

"""Date-bounded listing totals from counters: ``SnapshotPeriodCount``, kept by triggers on ``agentrun_snapshot``.

How many of an agent's snapshots were created in each minute, hour and day (UTC, by the run's
``createdAt``): a total with ``fromDate``/``toDate`` sums the whole days, hours and minutes inside the
bounds and counts on the listing's index only the snapshots of the two partial minutes at its edges
(``agentrun.core.selectors._dated_total``; docs/performance.md). Kept as ``0009_listing_counters`` keeps
``SnapshotCount``: by triggers, in the statement that writes the snapshot (PostgreSQL: statement-level
over transition tables, counters locked in key order; SQLite: row-level), each key spread over 8 slots by
the run id's last character. A period is ``bucket`` (its start, seconds since the epoch) and ``width``
(60, 3600, 86400 seconds). A TRUNCATE of the snapshots clears the counts too (PostgreSQL).
"""

from django.db import migrations, models

SLOTS = 8  # SnapshotCount.SLOTS, frozen here
WIDTHS = (60, 3600, 86400)

SLOT = {
    "postgresql": f"ascii(right(run_id, 1)) % {SLOTS}",
    "sqlite": f"unicode(substr(run_id, -1)) % {SLOTS}",
}


def _pg_counted(rows: str) -> str:
    """(agent_id, width, bucket, slot, n): how many of ``rows`` count under each key (PostgreSQL)."""
    widths = ", ".join(f"({w})" for w in WIDTHS)
    return (
        f"SELECT agent_id, w.width, (floor(extract(epoch FROM created_at) / w.width) * w.width)::bigint AS bucket, "
        f"{SLOT['postgresql']} AS slot, count(*) AS n "
        f"FROM {rows} CROSS JOIN (VALUES {widths}) AS w(width) GROUP BY 1, 2, 3, 4"
    )


PG_INSTALL = [
    f"""
    CREATE FUNCTION agentrun_snapshot_period_add() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO agentrun_snapshotperiodcount AS c (agent_id, width, bucket, slot, snapshots)
        {_pg_counted("added_snapshots")} ORDER BY 1, 2, 3, 4
        ON CONFLICT (agent_id, width, bucket, slot) DO UPDATE SET snapshots = c.snapshots + EXCLUDED.snapshots;
        RETURN NULL;
    END $$
    """,
    f"""
    CREATE FUNCTION agentrun_snapshot_period_remove() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        k record;
        left_over bigint;
    BEGIN
        FOR k IN {_pg_counted("removed_snapshots")} ORDER BY 1, 2, 3, 4 LOOP
            UPDATE agentrun_snapshotperiodcount SET snapshots = snapshots - k.n
            WHERE agent_id = k.agent_id AND width = k.width AND bucket = k.bucket AND slot = k.slot
            RETURNING snapshots INTO left_over;
            IF left_over = 0 THEN
                DELETE FROM agentrun_snapshotperiodcount
                WHERE agent_id = k.agent_id AND width = k.width AND bucket = k.bucket AND slot = k.slot;
            END IF;
        END LOOP;
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION agentrun_snapshot_period_clear() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM agentrun_snapshotperiodcount;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER agentrun_snapshot_period_insert AFTER INSERT ON agentrun_snapshot
    REFERENCING NEW TABLE AS added_snapshots FOR EACH STATEMENT EXECUTE FUNCTION agentrun_snapshot_period_add()
    """,
    """
    CREATE TRIGGER agentrun_snapshot_period_delete AFTER DELETE ON agentrun_snapshot
    REFERENCING OLD TABLE AS removed_snapshots FOR EACH STATEMENT EXECUTE FUNCTION agentrun_snapshot_period_remove()
    """,
    # An update counts as the old rows leaving and the new ones arriving (a no-op unless a key changed).
    """
    CREATE TRIGGER agentrun_snapshot_period_update_new AFTER UPDATE ON agentrun_snapshot
    REFERENCING NEW TABLE AS added_snapshots FOR EACH STATEMENT EXECUTE FUNCTION agentrun_snapshot_period_add()
    """,
    """
    CREATE TRIGGER agentrun_snapshot_period_update_old AFTER UPDATE ON agentrun_snapshot
    REFERENCING OLD TABLE AS removed_snapshots FOR EACH STATEMENT EXECUTE FUNCTION agentrun_snapshot_period_remove()
    """,
    """
    CREATE TRIGGER agentrun_snapshot_period_truncate AFTER TRUNCATE ON agentrun_snapshot
    FOR EACH STATEMENT EXECUTE FUNCTION agentrun_snapshot_period_clear()
    """,
]
PG_UNINSTALL = [
    "DROP TRIGGER IF EXISTS agentrun_snapshot_period_insert ON agentrun_snapshot",
    "DROP TRIGGER IF EXISTS agentrun_snapshot_period_delete ON agentrun_snapshot",
    "DROP TRIGGER IF EXISTS agentrun_snapshot_period_update_new ON agentrun_snapshot",
    "DROP TRIGGER IF EXISTS agentrun_snapshot_period_update_old ON agentrun_snapshot",
    "DROP TRIGGER IF EXISTS agentrun_snapshot_period_truncate ON agentrun_snapshot",
    "DROP FUNCTION IF EXISTS agentrun_snapshot_period_add()",
    "DROP FUNCTION IF EXISTS agentrun_snapshot_period_remove()",
    "DROP FUNCTION IF EXISTS agentrun_snapshot_period_clear()",
]


def _sqlite_bucket(row: str, width: int) -> str:
    # Django stores "YYYY-MM-DD HH:MM:SS[.ffffff]" (UTC); the whole seconds only: SQLite's date functions
    # keep milliseconds and would round 23:59:59.9999995 up into the next day.
    return f"(CAST(strftime('%s', substr({row}.created_at, 1, 19)) AS INTEGER) / {width}) * {width}"


def _sqlite_add(row: str) -> str:
    slot = SLOT["sqlite"].replace("run_id", f"{row}.run_id")
    keys = " UNION ALL ".join(f"SELECT {row}.agent_id, {w}, {_sqlite_bucket(row, w)}, {slot}, 1" for w in WIDTHS)
    return (
        f"INSERT INTO agentrun_snapshotperiodcount (agent_id, width, bucket, slot, snapshots) "
        f"SELECT * FROM ({keys}) WHERE true "  # the WHERE ends the SELECT before ON CONFLICT (SQLite's parser)
        "ON CONFLICT (agent_id, width, bucket, slot) DO UPDATE SET snapshots = snapshots + excluded.snapshots;"
    )


def _sqlite_remove(row: str) -> str:
    slot = SLOT["sqlite"].replace("run_id", f"{row}.run_id")
    statements = []
    for w in WIDTHS:
        key = f"agent_id = {row}.agent_id AND width = {w} AND bucket = {_sqlite_bucket(row, w)} AND slot = {slot}"
        statements.append(f"UPDATE agentrun_snapshotperiodcount SET snapshots = snapshots - 1 WHERE {key};")
        statements.append(f"DELETE FROM agentrun_snapshotperiodcount WHERE {key} AND snapshots = 0;")
    return " ".join(statements)


SQLITE_INSTALL = [
    f"CREATE TRIGGER agentrun_snapshot_period_insert AFTER INSERT ON agentrun_snapshot BEGIN {_sqlite_add('NEW')} END",
    f"CREATE TRIGGER agentrun_snapshot_period_delete AFTER DELETE ON agentrun_snapshot BEGIN {_sqlite_remove('OLD')} END",
    "CREATE TRIGGER agentrun_snapshot_period_update AFTER UPDATE OF run_id, agent_id, created_at "
    "ON agentrun_snapshot WHEN OLD.run_id IS NOT NEW.run_id OR OLD.agent_id IS NOT NEW.agent_id "
    "OR OLD.created_at IS NOT NEW.created_at "
    f"BEGIN {_sqlite_remove('OLD')} {_sqlite_add('NEW')} END",
]
SQLITE_UNINSTALL = [
    "DROP TRIGGER IF EXISTS agentrun_snapshot_period_insert",
    "DROP TRIGGER IF EXISTS agentrun_snapshot_period_delete",
    "DROP TRIGGER IF EXISTS agentrun_snapshot_period_update",
]


def install(apps, schema_editor):
    """The triggers first (on PostgreSQL they lock out snapshot writers until this commits), then the
    counts of the snapshots that exist."""
    vendor = schema_editor.connection.vendor
    for sql in PG_INSTALL if vendor == "postgresql" else SQLITE_INSTALL:
        schema_editor.execute(sql, params=None)  # None: the SQL's "%" is not a placeholder
    if vendor == "postgresql":
        counted = _pg_counted("agentrun_snapshot")
    else:
        counted = " UNION ALL ".join(
            f"SELECT agent_id, {w}, {_sqlite_bucket('agentrun_snapshot', w)}, {SLOT['sqlite']}, count(*) "
            "FROM agentrun_snapshot GROUP BY 1, 2, 3, 4"
            for w in WIDTHS
        )
    schema_editor.execute(
        f"INSERT INTO agentrun_snapshotperiodcount (agent_id, width, bucket, slot, snapshots) {counted}", params=None
    )


def uninstall(apps, schema_editor):
    for sql in PG_UNINSTALL if schema_editor.connection.vendor == "postgresql" else SQLITE_UNINSTALL:
        schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0017_inbox_claims"),
    ]

    operations = [
        migrations.CreateModel(
            name="SnapshotPeriodCount",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("agent_id", models.CharField(max_length=128)),
                ("width", models.PositiveIntegerField()),
                ("bucket", models.BigIntegerField()),
                ("slot", models.PositiveSmallIntegerField()),
                ("snapshots", models.BigIntegerField()),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("agent_id", "width", "bucket", "slot"), name="one_snapshot_period_count_per_slot"
                    )
                ],
            },
        ),
        migrations.RunPython(install, uninstall),
    ]

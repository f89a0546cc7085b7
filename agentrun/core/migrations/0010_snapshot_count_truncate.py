"""PostgreSQL: a TRUNCATE of ``agentrun_snapshot`` clears the listing's counts too.

TRUNCATE fires no insert or delete trigger (migration 0009's), so a raw ``TRUNCATE agentrun_snapshot``
(a benchmark resetting its seed, an operator) would leave the counts of the rows it removed. Django's
``flush`` truncates both tables at once, so it was only that case. SQLite has no TRUNCATE.
"""

from django.db import migrations

INSTALL = [
    """
    CREATE FUNCTION agentrun_snapshot_count_clear() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM agentrun_snapshotcount;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER agentrun_snapshot_count_truncate AFTER TRUNCATE ON agentrun_snapshot
    FOR EACH STATEMENT EXECUTE FUNCTION agentrun_snapshot_count_clear()
    """,
]
UNINSTALL = [
    "DROP TRIGGER IF EXISTS agentrun_snapshot_count_truncate ON agentrun_snapshot",
    "DROP FUNCTION IF EXISTS agentrun_snapshot_count_clear()",
]


def _run(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for sql in statements:
                schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0009_listing_counters"),
    ]

    operations = [migrations.RunPython(_run(INSTALL), _run(UNINSTALL))]

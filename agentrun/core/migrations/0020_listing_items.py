"""PostgreSQL: each waiting run's listing item kept as JSON text (``ListingItem``), by triggers.

The item is what the listings send for a run (docs/api.md#the-listing), built by the same expression
the listings' queries evaluated per run until now (the fields and the order of ``SuspendedRun.to_dict``,
the calls' ``argsFingerprint`` from ``shown_fingerprint``, migration 0019). A run SQL leaves to Python (a
call with a float in its arguments, a sub-agent's call, a quorum; no open call) has no row. It is rebuilt in the statement that changes what
it is made of, whoever writes (the engine, the admin, a bulk load):

- a snapshot inserted, or its listed columns updated (a run suspended again): its item;
- an open call inserted or deleted, a call's listed columns updated while it is or was open: its run's
  (claims, deadlines and the other columns the item does not show refresh nothing);
- a run's ``started_by_username`` changed: its item;
- a snapshot deleted: its item goes; a TRUNCATE of the snapshots empties the items.

Two transactions writing calls of one run: each refresh first locks the run's row (``FOR NO KEY
UPDATE``, the lock a decision, an expiry and a suspension's own UPDATE of the run already take first),
then builds the item in a statement of its own, which under READ COMMITTED takes a new snapshot once
the lock is held: the second writer waits for the first to commit and its item sees the first's calls.
(One statement could not: it would build from the rows as they were when it began, before waiting.)
The run's row, not the snapshot's: a call written while another transaction inserts the run's snapshot
would find no snapshot to lock and refresh nothing, then the new snapshot's item would miss that call.

SQLite: no trigger, the table stays empty and the listings build every item in Python.
"""

from django.db import migrations, models

_UTC_ISO = '\'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\''
_CALLS_JSON = (
    "SELECT CASE WHEN bool_or(c.shown_fingerprint IS NULL OR c.inner_run_id IS NOT NULL OR c.approvals_required <> 1) "
    "THEN NULL ELSE '[' || string_agg("
    "'{\"toolCallId\":' || to_json(c.tool_call_id)::text || ',\"toolName\":' || to_json(c.tool_name)::text "
    "|| ',\"args\":' || coalesce((CASE WHEN c.pending_args IS NOT NULL AND jsonb_typeof(c.pending_args) <> 'null' "
    "THEN c.pending_args ELSE c.args END)::text, 'null') "
    "|| ',\"requiresApproval\":' || CASE WHEN c.requires_approval THEN 'true' ELSE 'false' END "
    "|| ',\"suspendPayload\":' || coalesce(c.suspend_payload::text, 'null') "
    "|| ',\"resumeSchema\":' || coalesce(c.resume_schema::text, 'null') "
    "|| ',\"risk\":' || to_json(c.risk)::text "
    '|| \',"argsFingerprint":"\' || c.shown_fingerprint || \'","approvals":{"required":1,"given":[]}}\', '
    "',' ORDER BY c.position, c.id) || ']' END "
    "FROM agentrun_suspendedtoolcall c WHERE c.run_id = s.run_id AND c.status = 'open'"
)
_ITEM_JSON = (
    "'{\"runId\":' || to_json(s.run_id)::text "
    "|| ',\"agentId\":' || to_json(s.agent_id)::text "
    '|| \',"status":"suspended","threadId":\' || to_json(s.thread_id)::text '
    "|| ',\"resourceId\":' || coalesce(to_json(s.resource_id)::text, 'null') "
    f"|| ',\"createdAt\":\"' || to_char(s.created_at AT TIME ZONE 'UTC', {_UTC_ISO}) "
    f"|| '\",\"suspendedAt\":\"' || to_char(s.suspended_at AT TIME ZONE 'UTC', {_UTC_ISO}) "
    '|| \'","startedBy":\' || coalesce(to_json((SELECT r.started_by_username FROM agentrun_run r '
    "WHERE r.id = s.run_id))::text, 'null') "
    f"|| ',\"toolCalls\":' || ({_CALLS_JSON}) || '}}'"
)
# The columns of a call the item shows (or that decide whether SQL builds it); jsonb compared as text, as
# the item shows it (1 and 1.0 are equal jsonb, not the same text).
_CALL_SHOWN = (
    "run_id, tool_call_id, tool_name, args::text, pending_args::text, requires_approval, suspend_payload::text, "
    "resume_schema::text, risk, shown_fingerprint, position, id, status, inner_run_id, approvals_required"
)


def _old_new(columns: str) -> str:
    """``(OLD.a, …) IS DISTINCT FROM (NEW.a, …)`` for these columns (casts kept)."""
    listed = [c.strip() for c in columns.split(",")]
    return f"({', '.join('OLD.' + c for c in listed)}) IS DISTINCT FROM ({', '.join('NEW.' + c for c in listed)})"


PG_INSTALL = [
    f"""
    CREATE FUNCTION agentrun_listing_item_refresh(run text) RETURNS void LANGUAGE plpgsql AS $$
    DECLARE
        built text;
    BEGIN
        -- Writers of one run's item take turns: the run's row, locked first (see the module's docstring).
        PERFORM 1 FROM agentrun_run WHERE id = run FOR NO KEY UPDATE;
        -- A statement of its own, begun once the lock is held: it reads what the writer before committed.
        SELECT {_ITEM_JSON} INTO built FROM agentrun_snapshot s WHERE s.run_id = run;
        IF built IS NULL THEN
            -- No snapshot, no open call (its last one decided: the snapshot goes next), or one Python builds.
            DELETE FROM agentrun_listingitem WHERE run_id = run;
        ELSE
            INSERT INTO agentrun_listingitem AS i (run_id, item) VALUES (run, built)
            ON CONFLICT (run_id) DO UPDATE SET item = EXCLUDED.item WHERE i.item IS DISTINCT FROM EXCLUDED.item;
        END IF;
    END $$
    """,
    """
    CREATE FUNCTION agentrun_listing_item_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_TABLE_NAME = 'agentrun_run' THEN
            PERFORM agentrun_listing_item_refresh(NEW.id);
        ELSIF TG_OP = 'DELETE' THEN
            PERFORM agentrun_listing_item_refresh(OLD.run_id);
        ELSE
            PERFORM agentrun_listing_item_refresh(NEW.run_id);
            IF TG_OP = 'UPDATE' AND OLD.run_id <> NEW.run_id THEN
                PERFORM agentrun_listing_item_refresh(OLD.run_id);
            END IF;
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION agentrun_listing_item_removed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM agentrun_listingitem WHERE run_id = OLD.run_id;
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION agentrun_listing_item_clear() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM agentrun_listingitem;  -- not TRUNCATE: a TRUNCATE of both tables at once (a test's flush)
        RETURN NULL;
    END $$
    """,
    # Row-level AFTER triggers fire before the statement-level ones keeping the counters: the run's row
    # is locked before any counter row, the order every writer takes them in.
    """
    CREATE TRIGGER agentrun_listing_item_snapshot_insert AFTER INSERT ON agentrun_snapshot
    FOR EACH ROW EXECUTE FUNCTION agentrun_listing_item_changed()
    """,
    f"""
    CREATE TRIGGER agentrun_listing_item_snapshot_update AFTER UPDATE ON agentrun_snapshot
    FOR EACH ROW WHEN ({_old_new("run_id, agent_id, thread_id, resource_id, created_at, suspended_at")})
    EXECUTE FUNCTION agentrun_listing_item_changed()
    """,
    """
    CREATE TRIGGER agentrun_listing_item_snapshot_delete AFTER DELETE ON agentrun_snapshot
    FOR EACH ROW EXECUTE FUNCTION agentrun_listing_item_removed()
    """,
    """
    CREATE TRIGGER agentrun_listing_item_snapshot_truncate AFTER TRUNCATE ON agentrun_snapshot
    FOR EACH STATEMENT EXECUTE FUNCTION agentrun_listing_item_clear()
    """,
    """
    CREATE TRIGGER agentrun_listing_item_call_insert AFTER INSERT ON agentrun_suspendedtoolcall
    FOR EACH ROW WHEN (NEW.status = 'open') EXECUTE FUNCTION agentrun_listing_item_changed()
    """,
    f"""
    CREATE TRIGGER agentrun_listing_item_call_update AFTER UPDATE ON agentrun_suspendedtoolcall
    FOR EACH ROW WHEN ((OLD.status = 'open' OR NEW.status = 'open') AND {_old_new(_CALL_SHOWN)})
    EXECUTE FUNCTION agentrun_listing_item_changed()
    """,
    """
    CREATE TRIGGER agentrun_listing_item_call_delete AFTER DELETE ON agentrun_suspendedtoolcall
    FOR EACH ROW WHEN (OLD.status = 'open') EXECUTE FUNCTION agentrun_listing_item_changed()
    """,
    """
    CREATE TRIGGER agentrun_listing_item_run_update AFTER UPDATE OF started_by_username ON agentrun_run
    FOR EACH ROW WHEN (OLD.started_by_username IS DISTINCT FROM NEW.started_by_username)
    EXECUTE FUNCTION agentrun_listing_item_changed()
    """,
    # The runs that wait now.
    f"INSERT INTO agentrun_listingitem (run_id, item) SELECT * FROM (SELECT s.run_id, {_ITEM_JSON} AS item "
    "FROM agentrun_snapshot s) AS built WHERE item IS NOT NULL",
]
PG_UNINSTALL = [
    "DROP TRIGGER IF EXISTS agentrun_listing_item_run_update ON agentrun_run",
    *(
        f"DROP TRIGGER IF EXISTS agentrun_listing_item_call_{op} ON agentrun_suspendedtoolcall"
        for op in ("insert", "update", "delete")
    ),
    *(
        f"DROP TRIGGER IF EXISTS agentrun_listing_item_snapshot_{op} ON agentrun_snapshot"
        for op in ("insert", "update", "delete", "truncate")
    ),
    "DROP FUNCTION IF EXISTS agentrun_listing_item_clear()",
    "DROP FUNCTION IF EXISTS agentrun_listing_item_removed()",
    "DROP FUNCTION IF EXISTS agentrun_listing_item_changed()",
    "DROP FUNCTION IF EXISTS agentrun_listing_item_refresh(text)",
]


def _run(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for sql in statements:
                schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0019_call_fingerprints"),
    ]

    operations = [
        migrations.CreateModel(
            name="ListingItem",
            fields=[
                ("run_id", models.CharField(max_length=40, primary_key=True, serialize=False)),
                ("item", models.TextField(editable=False)),
            ],
        ),
        migrations.RunPython(_run(PG_INSTALL), _run(PG_UNINSTALL)),
    ]

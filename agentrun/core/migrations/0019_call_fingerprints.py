"""PostgreSQL: each open call's ``argsFingerprint`` kept in a column, so the unpaged listing is built in SQL.

``SuspendedToolCall.shown_fingerprint``: the sha256 (hex) of the canonical JSON of what the call shows
(``pending_args`` when an approver proposed an edit, else ``args``), as ``models.args_fingerprint``
computes it in Python: ``json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``.
A BEFORE INSERT OR UPDATE trigger computes it in the statement that writes the call, whoever writes it.
``agentrun_canonical_json`` reproduces Python's text: keys in code point order (``COLLATE "C"`` on
UTF-8), strings escaped as ``json.dumps`` escapes them with ``ensure_ascii=False`` (the same characters
PostgreSQL's JSON output escapes), integers as they are. Where the two could differ it gives up and the
column stays NULL: a number with a fraction or an exponent (Python's float ``repr`` is not
PostgreSQL's numeric text), and a call surfaced from a sub-agent (it shows the inner call's
arguments). The listing computes those in Python (``selectors.SuspendedRunsStream``).

SQLite: no trigger, the column stays NULL and the listing computes every fingerprint in Python.
"""

from django.db import migrations, models

PG_INSTALL = [
    """
    CREATE FUNCTION agentrun_canonical_json(j jsonb) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
    DECLARE
        out text;
    BEGIN
        CASE jsonb_typeof(j)
        WHEN 'object' THEN
            SELECT '{' || coalesce(string_agg(to_json(key)::text || ':' || agentrun_canonical_json(value), ','
                                              ORDER BY key COLLATE "C"), '') || '}'
            INTO out FROM jsonb_each(j);
        WHEN 'array' THEN
            SELECT '[' || coalesce(string_agg(agentrun_canonical_json(value), ',' ORDER BY n), '') || ']'
            INTO out FROM jsonb_array_elements(j) WITH ORDINALITY AS e(value, n);
        WHEN 'number' THEN
            out := j::text;
            IF out ~ '[.eE]' THEN
                RAISE EXCEPTION USING ERRCODE = 'AR001', MESSAGE = 'a float: left to Python';
            END IF;
        ELSE
            out := j::text;  -- a string (escaped as Python escapes it), true, false, null
        END CASE;
        RETURN out;
    END $$
    """,
    """
    CREATE FUNCTION agentrun_call_fingerprint() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        shown jsonb;
    BEGIN
        NEW.shown_fingerprint := NULL;
        IF NEW.inner_run_id IS NULL THEN
            shown := CASE WHEN NEW.pending_args IS NOT NULL AND jsonb_typeof(NEW.pending_args) <> 'null'
                          THEN NEW.pending_args ELSE NEW.args END;
            BEGIN
                NEW.shown_fingerprint := encode(sha256(convert_to(
                    coalesce(agentrun_canonical_json(shown), 'null'), 'UTF8')), 'hex');
            EXCEPTION WHEN SQLSTATE 'AR001' THEN
                NEW.shown_fingerprint := NULL;
            END;
        END IF;
        RETURN NEW;
    END $$
    """,
    """
    CREATE TRIGGER agentrun_call_fingerprint BEFORE INSERT OR UPDATE ON agentrun_suspendedtoolcall
    FOR EACH ROW EXECUTE FUNCTION agentrun_call_fingerprint()
    """,
    # The calls that exist (the trigger computes each).
    "UPDATE agentrun_suspendedtoolcall SET shown_fingerprint = NULL",
]
PG_UNINSTALL = [
    "DROP TRIGGER IF EXISTS agentrun_call_fingerprint ON agentrun_suspendedtoolcall",
    "DROP FUNCTION IF EXISTS agentrun_call_fingerprint()",
    "DROP FUNCTION IF EXISTS agentrun_canonical_json(jsonb)",
]


def _run(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for sql in statements:
                schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0018_listing_period_counts"),
    ]

    operations = [
        migrations.AddField(
            model_name="suspendedtoolcall",
            name="shown_fingerprint",
            field=models.CharField(blank=True, editable=False, max_length=64, null=True),
        ),
        migrations.RunPython(_run(PG_INSTALL), _run(PG_UNINSTALL)),
    ]

"""Wake idle workers when a task is enqueued: on PostgreSQL, every insert into django-tasks-db's task table
sends NOTIFY agentrun_tasks (delivered when the enqueuing transaction commits). Workers LISTEN
(``manage.py agentrun_worker``); SQLite has no NOTIFY and workers poll there."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION agentrun_notify_task_enqueued() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('agentrun_tasks', '');
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS agentrun_task_enqueued ON django_tasks_database_dbtaskresult;
CREATE TRIGGER agentrun_task_enqueued AFTER INSERT ON django_tasks_database_dbtaskresult
    FOR EACH STATEMENT EXECUTE FUNCTION agentrun_notify_task_enqueued();
"""
DROP = """
DROP TRIGGER IF EXISTS agentrun_task_enqueued ON django_tasks_database_dbtaskresult;
DROP FUNCTION IF EXISTS agentrun_notify_task_enqueued();
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0005_decision_service"),
        ("django_tasks_database", "0021_conditional_partial_index_ordering"),
    ]

    operations = [migrations.RunPython(create, drop)]

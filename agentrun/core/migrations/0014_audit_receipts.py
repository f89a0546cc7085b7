"""Audit receipts (docs/security.md, "Audit receipts"): the receipts and the chain's head; the decisions
recorded before this migration are sealed by it, in the order they were decided (with the signing key
configured when it runs); decisions and receipts become append-only, and a trigger moves the chain's head
with each receipt (triggers re-installed after every migration by ``agentrun.core.apps``)."""

import django.utils.timezone
from django.db import migrations, models


def seal_existing(apps, schema_editor):
    from agentrun.core import receipts

    Decision = apps.get_model("agentrun", "Decision")
    AuditReceipt = apps.get_model("agentrun", "AuditReceipt")
    AuditChainHead = apps.get_model("agentrun", "AuditChainHead")
    for decision in Decision.objects.order_by("decided_at", "id").iterator(chunk_size=1000):
        receipts.seal(decision, receipts=AuditReceipt, heads=AuditChainHead)


def install_triggers(apps, schema_editor):
    from agentrun.core import receipts

    receipts.install_triggers(schema_editor.connection.alias)


def remove_guards(apps, schema_editor):
    from agentrun.core import receipts

    receipts.remove_guards()


class Migration(migrations.Migration):

    dependencies = [
        ('agentrun', '0013_safety_core'),
    ]

    operations = [
        migrations.CreateModel(
            name='AuditChainHead',
            fields=[
                ('id', models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ('seq', models.BigIntegerField(default=0)),
                ('hash', models.CharField(default='0000000000000000000000000000000000000000000000000000000000000000', max_length=64)),
                ('decision_id', models.CharField(blank=True, max_length=40, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='AuditReceipt',
            fields=[
                ('seq', models.BigIntegerField(primary_key=True, serialize=False)),
                ('decision_id', models.CharField(max_length=40, unique=True)),
                ('key_id', models.CharField(max_length=16)),
                ('prev_hash', models.CharField(max_length=64)),
                ('signature', models.CharField(max_length=100)),
                ('hash', models.CharField(max_length=64)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                'ordering': ['seq'],
            },
        ),
        migrations.RunPython(install_triggers, remove_guards),  # the head row and its trigger first
        migrations.RunPython(seal_existing, migrations.RunPython.noop),
    ]

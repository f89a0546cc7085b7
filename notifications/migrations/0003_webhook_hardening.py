"""Webhook endpoints: secrets encrypted at rest, and an owner whose scope bounds what they receive."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def seal_secrets(apps, schema_editor):
    from agentrun.core import secretbox

    WebhookEndpoint = apps.get_model("notifications", "WebhookEndpoint")
    for endpoint in WebhookEndpoint.objects.all():
        endpoint.sealed_secret = secretbox.seal(endpoint.secret)
        endpoint.save(update_fields=["sealed_secret"])


def unseal_secrets(apps, schema_editor):
    from agentrun.core import secretbox

    WebhookEndpoint = apps.get_model("notifications", "WebhookEndpoint")
    for endpoint in WebhookEndpoint.objects.all():
        endpoint.secret = secretbox.unseal(endpoint.sealed_secret)
        endpoint.save(update_fields=["secret"])


class Migration(migrations.Migration):

    dependencies = [
        ("notifications", "0002_retention_indexes"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookendpoint",
            name="owner",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="webhookendpoint",
            name="sealed_secret",
            field=models.TextField(default=""),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="webhookendpoint", name="secret", field=models.CharField(max_length=255, default="")
        ),
        migrations.RunPython(seal_secrets, unseal_secrets),
        migrations.RemoveField(model_name="webhookendpoint", name="secret"),
    ]

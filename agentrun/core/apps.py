from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class CoreConfig(AppConfig):
    """agentrun's tables. The label stays ``agentrun`` (table names, migrations, permissions, admin URLs)."""

    name = "agentrun.core"
    label = "agentrun"
    verbose_name = "Agent runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from agentrun.core.access import ensure_groups

        post_migrate.connect(ensure_groups, sender=self, dispatch_uid="agentrun.ensure_groups")

from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class AgentrunConfig(AppConfig):
    name = "agentrun"
    verbose_name = "Agent runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from agentrun.access import ensure_groups
        from agentrun.engine.agents import load_configured_agents

        post_migrate.connect(ensure_groups, sender=self, dispatch_uid="agentrun.ensure_groups")
        load_configured_agents()

from __future__ import annotations

import importlib

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_migrate


class AgentrunConfig(AppConfig):
    name = "agentrun"
    verbose_name = "Agent runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from agentrun.access import ensure_groups

        post_migrate.connect(ensure_groups, sender=self, dispatch_uid="agentrun.ensure_groups")
        load_configured_agents()


def load_configured_agents() -> None:
    """Register the demo agents (``AGENTRUN_DEMO_AGENTS``) and those named in ``AGENTRUN_AGENTS``
    (``module`` — agents built on import register themselves — or ``module:attribute``)."""
    from agentrun.engine.agents import Agent, register_agent

    if settings.AGENTRUN_DEMO_AGENTS:
        importlib.import_module("agentrun.demo")
    for path in settings.AGENTRUN_AGENTS:
        module_path, _, attr = path.partition(":")
        module = importlib.import_module(module_path)
        if attr and isinstance(obj := getattr(module, attr), Agent):
            register_agent(obj)

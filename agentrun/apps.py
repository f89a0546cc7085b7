from __future__ import annotations

import importlib

from django.apps import AppConfig
from django.conf import settings


class AgentrunConfig(AppConfig):
    """The project package as an app: what sits above the engine and needs Django's app loading — the
    admin (``agentrun.admin``), the management commands, and the configured agents. The tables belong
    to ``agentrun.core`` (app label ``agentrun``)."""

    name = "agentrun"
    label = "agentrun_site"
    verbose_name = "agentrun"

    def ready(self) -> None:
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

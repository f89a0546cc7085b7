"""agentrun: durable agent runs that suspend for people.

``from agentrun import Agent, tool, ToolContext, get_agent, get_run, AgentRunError`` works in a plain
script: the first access sets Django up with ``agentrun.settings`` unless settings are configured.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["Agent", "AgentRunError", "ToolContext", "get_agent", "get_run", "list_agents", "tool"]

_EXPORTS = {
    "Agent": ("agentrun.engine.agents", "Agent"),
    "get_agent": ("agentrun.engine.agents", "get_agent"),
    "list_agents": ("agentrun.engine.agents", "all_agents"),
    "tool": ("agentrun.engine.tools", "tool"),
    "ToolContext": ("agentrun.engine.tools", "ToolContext"),
    "AgentRunError": ("agentrun.core.errors", "AgentRunError"),
}


def _ensure_django() -> None:
    from django.apps import apps

    if apps.ready or apps.loading:
        return
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
    import django

    django.setup()


async def get_run(run_id: str) -> Any:
    """The run (``.status``, ``.last_error``, ``.to_dict()``), or ``AgentRunError(RUN_NOT_FOUND)``."""
    _ensure_django()
    from agentrun.core.errors import AgentRunError
    from agentrun.core.models import Run

    try:
        return await Run.objects.aget(pk=run_id)
    except Run.DoesNotExist:
        raise AgentRunError("RUN_NOT_FOUND", f"No run {run_id}.") from None


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        if name != "AgentRunError":
            _ensure_django()
        module, attr = _EXPORTS[name]
        import importlib

        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'agentrun' has no attribute {name!r}")

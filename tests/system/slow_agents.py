"""An agent whose approved tool is slow, so a test can kill the process running it mid-way.

Loaded by the servers under test through AGENTRUN_AGENTS=tests.system.slow_agents.
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async

from agentrun.core.errors import AgentRunError
from agentrun.engine.agents import Agent, get_agent
from agentrun.engine.tools import ToolContext, tool


@sync_to_async
def _apply_once(ctx: ToolContext, to: str) -> None:
    from agentrun.core.models import ToolEffect

    ToolEffect.objects.get_or_create(
        tool_call_id=ctx.tool_call_id, defaults={"run_id": ctx.run_id, "tool_name": "slow-send", "payload": {"to": to}}
    )


@tool(id="slow-send", requires_approval=True, description="Send, slowly.")
async def slow_send(to: str, seconds: float = 3, *, ctx: ToolContext) -> dict:
    await _apply_once(ctx, to)  # the side effect, keyed by the tool call id
    await asyncio.sleep(seconds)
    return {"sent": True, "to": to}


@tool(id="explode", description="Always fails (a tool exception).")
async def explode(reason: str = "boom") -> dict:
    raise RuntimeError(reason)


try:
    slow_agent = get_agent("slow-agent")
except AgentRunError:
    slow_agent = Agent(id="slow-agent", tools=[slow_send, explode])

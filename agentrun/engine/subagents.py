"""Sub-agents (docs/runs.md#sub-agents): a supervisor's tool ``agent-<id>`` runs another agent on its thread.

The inner run is a run of its own (its own memory, steps and chunks). When it waits for a person, its
open call surfaces on the supervisor's call (``InnerRunSuspended``); deciding that call carries the same
decision to the inner call and resumes the inner run (``Segment._decide_inner``).
"""

from __future__ import annotations

from typing import Any

import pydantic

from agentrun.engine.lease import create_run_to_drive
from agentrun.engine.loop import Segment, inner_outcome
from agentrun.engine.runtime import db
from agentrun.engine.tools import InnerRunSuspended, Tool, ToolContext
from agentrun.engine.types import AgentSpec


class SubAgentArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    message: str


class SubAgentTool(Tool):
    """``agent-<id>``: runs a sub-agent on the outer run's thread; its approvals surface on the outer call."""

    def __init__(self, agent: AgentSpec) -> None:
        super().__init__(
            None,
            id=f"agent-{agent.id}",
            description=agent.description or f"Ask the {agent.name} agent.",
            args_model=SubAgentArgs,
        )
        self.agent = agent

    async def execute(self, args: dict, ctx: ToolContext) -> Any:
        run = await db(create_run_to_drive)(
            agent_id=self.agent.id,
            messages=[{"role": "user", "content": args["message"]}],
            thread_id=ctx.thread_id,
            resource_id=ctx.resource_id,
            metadata={},
            options={},
            parent_run_id=ctx.run_id,
            parent_tool_call_id=ctx.tool_call_id,
        )
        await Segment(self.agent, run.id, created=run).run()
        outcome = await inner_outcome(self.agent, run.id)
        if outcome.status == "suspended":
            assert outcome.waiting is not None
            raise InnerRunSuspended(outcome.waiting)
        if outcome.status == "error":
            raise RuntimeError(outcome.output)
        return outcome.result

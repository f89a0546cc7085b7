"""The demo agents (docs/runs.md#demo-agents), registered when AGENTRUN_DEMO_AGENTS is on (the default)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import pydantic
from asgiref.sync import sync_to_async

from agentrun.core.models import ToolEffect
from agentrun.engine.agents import Agent
from agentrun.engine.tools import ToolContext, tool


@sync_to_async
def _apply_once(ctx: ToolContext, tool_name: str, payload: dict) -> None:
    # The tool call id is the idempotency key: a retried continuation does not send twice. One
    # statement (INSERT … ON CONFLICT DO NOTHING): the first effect stays.
    ToolEffect.objects.bulk_create(
        [ToolEffect(tool_call_id=ctx.tool_call_id, run_id=ctx.run_id, tool_name=tool_name, payload=payload)],
        ignore_conflicts=True,
    )


@tool(id="send-email", requires_approval=True, risk="medium", description="Send an email to a customer.")
async def send_email(to: str, subject: str, body: str, *, ctx: ToolContext) -> dict:
    await _apply_once(ctx, "send-email", {"to": to, "subject": subject, "body": body})
    return {"sent": True, "to": to}


@tool(id="delete-record", requires_approval=True, risk="high", description="Delete a record from a table.")
async def delete_record(table: str, id: str | int, *, ctx: ToolContext) -> dict:  # noqa: A002
    await _apply_once(ctx, "delete-record", {"table": table, "id": id})
    return {"deleted": True}


class AskAnswer(pydantic.BaseModel):
    answer: Annotated[str, pydantic.Field(min_length=1, description="Your answer")]


@tool(id="ask-user", resume_schema=AskAnswer, description="Ask the user a question and wait for the answer.")
async def ask_user(question: str, *, ctx: ToolContext) -> dict:
    if ctx.resume_data is None:
        await ctx.suspend({"question": question})
    return {"answer": ctx.resume_data["answer"]}


@tool(id="lookup-order", description="Look up the status of an order.")
async def lookup_order(orderId: str) -> dict:  # noqa: N803 - the argument name the model uses
    return {"orderId": orderId, "status": "shipped"}


@tool(id="research", background=True, description="Research a topic (takes a while; runs in the background).")
async def research(topic: str, seconds: float = 1) -> dict:
    await asyncio.sleep(max(0.0, min(float(seconds), 3600.0)))
    return {"topic": topic, "summary": f"A short summary of {topic}."}


@tool(id="echo", description="Return the value it is given.")
async def echo(value: Any) -> dict:
    return {"value": value}


@tool(id="refund", requires_approval=True, risk="high", description="Refund an order.")
async def refund(
    orderId: str,  # noqa: N803
    amount: Annotated[float, pydantic.Field(gt=0)],
    *,
    ctx: ToolContext,
) -> dict:
    await _apply_once(ctx, "refund", {"orderId": orderId, "amount": amount})
    return {"refunded": amount, "orderId": orderId}


@tool(
    id="pay-invoice",
    requires_approval=True,
    approvals_required=2,
    description="Pay a supplier's invoice (two people approve every payment).",
)
async def pay_invoice(invoiceId: str, amount: Annotated[float, pydantic.Field(gt=0)], *, ctx: ToolContext) -> dict:  # noqa: N803
    await _apply_once(ctx, "pay-invoice", {"invoiceId": invoiceId, "amount": amount})
    return {"paid": amount, "invoiceId": invoiceId}


support_agent = Agent(
    id="support-agent",
    name="Support agent",
    description="Answers customers; asks before sending email or deleting data.",
    instructions="You are a helpful support agent. Ask for approval before acting on a customer's behalf.",
    tools=[send_email, delete_record, ask_user, lookup_order, research, echo],
)

billing_agent = Agent(
    id="billing-agent",
    name="Billing agent",
    description="Handles refunds (every refund needs approval) and pays invoices (two people approve).",
    instructions="You handle billing. Refunds need a person's approval; payments need two people's.",
    tools=[refund, pay_invoice],
)

support_supervisor = Agent(
    id="support-supervisor",
    name="Support supervisor",
    description="Delegates billing to the billing agent.",
    instructions="You supervise support. Delegate refunds to the billing agent.",
    tools=[lookup_order],
    agents=[billing_agent],
)

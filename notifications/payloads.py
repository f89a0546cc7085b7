"""What a webhook POSTs: the standard body ``{id, type, createdAt, data}``, or a Slack message."""

from __future__ import annotations

import json

from django.conf import settings
from django.urls import reverse

from agentrun.core.models import OutboxEvent
from approvals.public import thread_path
from notifications.models import WebhookEndpoint


def public_url(path: str) -> str:
    """``path`` (from ``reverse``) under ``AGENTRUN_PUBLIC_URL``: the base of links in messages."""
    return f"{settings.AGENTRUN_PUBLIC_URL}{path}"


def thread_url(thread_id: str) -> str:
    return public_url(thread_path(thread_id))


def run_url(run_id: str) -> str:
    return public_url(reverse("approvals:run", args=[run_id]))


def body(endpoint: WebhookEndpoint, event: OutboxEvent) -> bytes:
    payload = slack_message(event) if endpoint.format == WebhookEndpoint.Format.SLACK else event.envelope()
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# --- Slack --------------------------------------------------------------------------------------
AUTOMATIC = {"policy": "a policy", "system": "the system"}


def escape(text: object) -> str:
    """Slack mrkdwn: &, < and > are control characters; everything else is text."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_escape = escape


def _args(args: object, limit: int = 300) -> str:
    text = json.dumps(args, ensure_ascii=False, sort_keys=True)
    return _escape(text if len(text) <= limit else text[: limit - 1] + "…")


def _seen(call: dict) -> tuple[str, object]:
    """A listed call as the reviewer sees it: ``billing-agent → refund`` and the inner call's arguments
    for a call surfaced from a sub-agent."""
    inner = call.get("subAgent")
    if inner:
        return f"{inner['agentId']} → {inner['toolName']}", inner["args"]
    return call["toolName"], call["args"]


def _decided_tool(data: dict) -> str:
    inner = data.get("subAgent")
    return f"{inner['agentId']} → {inner['toolName']}" if inner else data["toolName"]


def summary(event: OutboxEvent) -> tuple[str, str]:
    """One line saying what happened (Slack mrkdwn), and the dashboard page about it."""
    data = event.data
    agent = f"*{_escape(event.agent_id)}*"
    if event.type == "run.suspended":
        calls = "; ".join(
            f"`{_escape(_seen(c)[0])}` {_args(_seen(c)[1])}"
            + (f" (risk {c.get('risk')})" if c.get("requiresApproval") else " (waits for an answer)")
            for c in data.get("toolCalls", [])
        )
        text = f":hourglass_flowing_sand: {agent} waits for a decision on thread `{_escape(data['threadId'])}`: {calls}"
        return text, thread_url(data["threadId"])
    if event.type == "toolcall.decided":
        who = AUTOMATIC.get(data["via"]) or _escape(data.get("decidedBy") or "someone")
        text = f"{agent}: `{_escape(_decided_tool(data))}` {data['kind']}d by {who} (via {data['via']})"
        return text, run_url(data["runId"])
    if event.type in ("approval.timeout_warning", "approval.escalated"):
        call = data["toolCall"]
        if event.type == "approval.escalated":
            groups = ", ".join(_escape(g) for g in data.get("escalateTo", []))
            tool = _escape(_seen(call)[0])
            text = f":rotating_light: {agent}: nobody approved `{tool}` in time; escalated to {groups}"
        else:
            text = (
                f":alarm_clock: {agent}: `{_escape(_seen(call)[0])}` {_args(_seen(call)[1])} will be decided by its "
                f"timeout policy ({data['onTimeout']}) at {data['timeoutAt']} unless someone decides first"
            )
        return text, thread_url(data["threadId"])
    status = event.type.removeprefix("run.")
    error = (data.get("lastError") or {}).get("message")
    text = f"{agent}: run `{_escape(event.run_id)}` {status}" + (f": {_escape(error)}" if error else "")
    return text, run_url(event.run_id)


def slack_message(event: OutboxEvent) -> dict:
    """A Slack incoming-webhook payload: the summary and a link to the dashboard."""
    text, url = summary(event)
    return {
        "text": f"{text} — <{url}|Open in agentrun>",
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {
                "type": "actions",
                "elements": [
                    {"type": "button", "text": {"type": "plain_text", "text": "Open in agentrun"}, "url": url}
                ],
            },
        ],
    }

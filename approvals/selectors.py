"""Reads behind the reviewer pages. Each page is a fixed, small number of queries (no N+1).

Every read takes ``hidden``: the agents the reader is outside of (``agentrun.access.hidden_agent_ids``),
whose runs, calls, messages and decisions it leaves out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Exists, Min, OuterRef, Q, QuerySet
from django.utils import timezone

from agentrun.engine.agents import get_agent
from agentrun.errors import AgentRunError
from agentrun.models import Decision, Message, Snapshot, SuspendedToolCall
from approvals.resume_form import ResumeField, build_fields

OPEN = SuspendedToolCall.Status.OPEN


def live_snapshots(hidden: frozenset[str] = frozenset()) -> QuerySet[Snapshot]:
    """Snapshots of runs that still wait (a run past its time to live is no longer listed)."""
    snapshots = Snapshot.objects.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))
    return snapshots.exclude(agent_id__in=hidden) if hidden else snapshots


def inbox_threads(
    *, agent_id: str = "", resource_id: str = "", tool_name: str = "", hidden: frozenset[str] = frozenset()
) -> list[dict]:
    """One row per (thread, agent, resource) with open calls: counts and the oldest wait, oldest first.

    One query: snapshots grouped by thread, joined to their open calls.
    """
    snapshots = live_snapshots(hidden)
    if agent_id:
        snapshots = snapshots.filter(agent_id=agent_id)
    if resource_id:
        snapshots = snapshots.filter(resource_id=resource_id)
    if tool_name:
        snapshots = snapshots.filter(
            Exists(SuspendedToolCall.objects.filter(run_id=OuterRef("run_id"), status=OPEN, tool_name=tool_name))
        )
    open_calls = Q(run__suspended_calls__status=OPEN)
    rows = (
        snapshots.values("thread_id", "agent_id", "resource_id")
        .annotate(
            open_count=Count("run__suspended_calls", filter=open_calls),
            run_count=Count("run_id", distinct=True),
            oldest=Min("run__suspended_calls__created_at", filter=open_calls),
        )
        .filter(open_count__gt=0)
        .order_by("oldest", "thread_id")
    )
    return list(rows)


def inbox_filter_choices(hidden: frozenset[str] = frozenset()) -> dict[str, list[str]]:
    """Values present among waiting runs, for the filter menus."""
    snapshots = live_snapshots(hidden)
    return {
        "agents": sorted(set(snapshots.values_list("agent_id", flat=True))),
        "resources": sorted({r for r in snapshots.values_list("resource_id", flat=True) if r}),
        "tools": sorted(
            set(
                SuspendedToolCall.objects.filter(status=OPEN, run__snapshot__in=snapshots).values_list(
                    "tool_name", flat=True
                )
            )
        ),
    }


@dataclass
class OpenCallView:
    """An open call as the thread page shows it."""

    call: SuspendedToolCall
    description: str
    args: Any  # the arguments the tool would run with (the inner call's for a sub-agent call)
    inner_tool_name: str | None
    resume_fields: list[ResumeField] | None
    # Form state after a rejected submission (shown inline, nothing decided).
    error: str = ""
    error_items: list[str] = field(default_factory=list)
    failed_action: str = ""
    edit_text: str | None = None
    reason: str = ""
    resume_json: str = ""

    @property
    def tool_call_id(self) -> str:
        return self.call.tool_call_id

    @property
    def is_approval(self) -> bool:
        return self.call.requires_approval

    @property
    def edit_value(self) -> str:
        return self.args_json if self.edit_text is None else self.edit_text

    @property
    def args_json(self) -> str:
        return json.dumps(self.args, indent=2, ensure_ascii=False, sort_keys=False)

    @property
    def payload_json(self) -> str:
        return json.dumps(self.call.suspend_payload, indent=2, ensure_ascii=False)


def _description(agent_id: str, tool_name: str) -> str:
    try:
        tool = get_agent(agent_id).tools.get(tool_name)
    except AgentRunError:
        return ""
    return tool.description if tool is not None else ""


def open_call_views(calls: list[SuspendedToolCall]) -> list[OpenCallView]:
    """Decorate calls with their tool's description; a sub-agent call shows the inner call it waits on."""
    inner_keys = [(c.inner_run_id, c.inner_tool_call_id) for c in calls if c.inner_run_id]
    inner: dict[tuple[str, str], SuspendedToolCall] = {}
    if inner_keys:
        q = Q()
        for run_id, tool_call_id in inner_keys:
            q |= Q(run_id=run_id, tool_call_id=tool_call_id)
        inner = {(c.run_id, c.tool_call_id): c for c in SuspendedToolCall.objects.filter(q)}
    views = []
    for c in calls:
        inner_call = inner.get((c.inner_run_id, c.inner_tool_call_id)) if c.inner_run_id else None
        if inner_call is not None:
            description = _description(c.inner_agent_id or "", inner_call.tool_name)
            args, inner_name = inner_call.args, inner_call.tool_name
        else:
            description = _description(c.run.agent_id, c.tool_name)
            args, inner_name = c.args, None
        views.append(
            OpenCallView(
                call=c,
                description=description,
                args=args,
                inner_tool_name=inner_name,
                resume_fields=None if c.requires_approval else build_fields(c.resume_schema),
            )
        )
    return views


def thread_open_calls(thread_id: str, hidden: frozenset[str] = frozenset()) -> list[SuspendedToolCall]:
    return list(
        SuspendedToolCall.objects.filter(
            status=OPEN, run__thread_id=thread_id, run__snapshot__in=live_snapshots(hidden)
        )
        .select_related("run")
        .order_by("created_at", "run_id", "position", "id")
    )


def recent_messages(thread_id: str, limit: int = 12, hidden: frozenset[str] = frozenset()) -> list[Message]:
    messages = Message.objects.filter(thread_id=thread_id)
    if hidden:
        messages = messages.exclude(run__agent_id__in=hidden)
    return list(reversed(messages.order_by("-created_at", "-id")[:limit]))


def latest_decision(run_id: str, tool_call_id: str) -> Decision | None:
    return Decision.objects.filter(run_id=run_id, tool_call_id=tool_call_id).order_by("-decided_at", "-id").first()


def decisions_for_calls(tool_call_ids: list[str], hidden: frozenset[str] = frozenset()) -> dict[str, Decision]:
    """The latest decision of each call (to tell a page who decided calls that left it)."""
    found: dict[str, Decision] = {}
    decisions = Decision.objects.filter(tool_call_id__in=tool_call_ids)
    if hidden:
        decisions = decisions.exclude(agent_id__in=hidden)
    for d in decisions.order_by("decided_at", "id"):
        found[d.tool_call_id] = d
    return found

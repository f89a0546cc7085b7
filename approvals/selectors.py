"""Reads behind the reviewer pages. Each page is a fixed, small number of queries (no N+1).

Every read takes ``hidden``: the agents the reader is outside of (``agentrun.core.access.hidden_agent_ids``),
whose runs, calls, messages and decisions it leaves out.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from django.db.models import (
    BooleanField,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Window,
)
from django.db.models.functions import RowNumber
from django.utils import timezone

from agentrun.core import claims
from agentrun.core.errors import AgentRunError
from agentrun.core.models import Decision, Message, Snapshot, StandingGrant, SuspendedToolCall, args_fingerprint
from agentrun.core.selectors import decision_history, waiting_runs_by_agent
from agentrun.engine.agents import get_agent
from agentrun.engine.decisions import approvals_given, shown_args
from agentrun.engine.registry import all_agents
from approvals.resume_form import ResumeField, build_fields

OPEN = SuspendedToolCall.Status.OPEN


def waits(hidden: frozenset[str] = frozenset()) -> Exists:
    """A call whose run still waits: its snapshot is there and not past its time to live (a run past it is
    no longer listed), for an agent the reader may see. A semi-join on the snapshot's key: no join of
    the snapshots table into the calls' rows."""
    snapshots = Snapshot.objects.filter(run_id=OuterRef("run_id")).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    )
    return Exists(snapshots.exclude(agent_id__in=hidden) if hidden else snapshots)


def surfaced_by_a_supervisor(hidden: frozenset[str] = frozenset()) -> Exists:
    """An open call that a (visible, waiting) supervisor's open call surfaces: a sub-agent's call waits
    once, shown and decided as the supervisor's call only (inbox and thread page alike)."""
    return Exists(
        SuspendedToolCall.objects.filter(
            waits(hidden),
            status=OPEN,
            inner_run_id__isnull=False,  # says so to the planner: it hashes the supervisors' calls only
            inner_run_id=OuterRef("run_id"),
            inner_tool_call_id=OuterRef("tool_call_id"),
        )
    )


RISK_ORDER = {"low": 0, "medium": 1, "high": 2}
INBOX_MAX_ROWS = 200  # threads on one inbox page (docs/dashboard.md#inbox)
INBOX_CALLS_PER_ROW = 5


@dataclass
class InboxRow:
    """One thread with open calls: what waits there, for whom, and since when."""

    thread_id: str
    open_count: int
    oldest: Any
    newest: Any
    calls: list[OpenCallView] = field(default_factory=list)

    @property
    def risk(self) -> str:
        """The highest risk among the row's calls shown (the row is flagged by it)."""
        return max((c.call.risk for c in self.calls), key=RISK_ORDER.__getitem__, default="low")

    @property
    def more(self) -> int:
        return self.open_count - len(self.calls)

    @property
    def agent_ids(self) -> list[str]:
        return sorted({c.call.run.agent_id for c in self.calls})

    @property
    def resource_ids(self) -> list[str]:
        return sorted({c.call.run.resource_id for c in self.calls if c.call.run.resource_id})


def inbox_open_calls(
    *,
    agent_id: str = "",
    resource_id: str = "",
    tool_name: str = "",
    risk: str = "",
    mine: Any = None,
    hidden: frozenset[str] = frozenset(),
) -> QuerySet[SuspendedToolCall]:
    """Open calls of live snapshots matching the inbox filters (empty filters are ignored). A call
    surfaced from a sub-agent is shown as its supervisor's call and matches both agents and the inner
    tool (what the card shows), so a sub-agent's count and its filter agree."""
    calls = SuspendedToolCall.objects.filter(waits(hidden), status=OPEN)
    calls = calls.exclude(surfaced_by_a_supervisor(hidden))
    if agent_id:
        calls = calls.filter(Q(run__agent_id=agent_id) | Q(inner_agent_id=agent_id))
    if tool_name:
        inner = SuspendedToolCall.objects.filter(
            run_id=OuterRef("inner_run_id"), tool_call_id=OuterRef("inner_tool_call_id"), tool_name=tool_name
        )
        calls = calls.filter(Q(inner_run_id__isnull=True, tool_name=tool_name) | Exists(inner))
    for lookup, value in (("run__resource_id", resource_id), ("risk", risk)):
        if value:
            calls = calls.filter(**{lookup: value})
    if mine is not None:  # "Mine": claimed by, assigned or routed to this user (docs/dashboard.md#shared-work)
        calls = calls.filter(claims.mine(mine))
    return calls


@dataclass
class InboxPage:
    """One page of the inbox (docs/dashboard.md#inbox): its rows, and how much waits in all."""

    rows: list[InboxRow]
    number: int  # 1-based
    per_page: int
    total_threads: int  # threads with matching open calls, on every page
    total_calls: int

    @property
    def first_index(self) -> int:
        return (self.number - 1) * self.per_page + 1 if self.rows else 0

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.rows) - 1 if self.rows else 0

    @property
    def has_next(self) -> bool:
        return self.number * self.per_page < self.total_threads

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def pages(self) -> int:
        return max(1, -(-self.total_threads // self.per_page))


def inbox_page(*, newest_first: bool = False, page: int = 1, per_page: int | None = None, **filters: Any) -> InboxPage:
    """The inbox, a page at a time: one row per thread with matching open calls, each row naming its
    calls (tool, arguments, risk, agent, resource). Oldest wait first, or most recent call first; ties
    by thread id, so pages neither overlap nor skip.

    Five queries whatever the number of rows or of calls a thread holds: the totals with the page's
    grouped rows, the first few calls of each (ids), those calls, the agents' words before them and the
    inner calls of sub-agent calls among them (``open_call_views``).
    """
    per_page = per_page or INBOX_MAX_ROWS
    calls = inbox_open_calls(**filters)
    grouped = calls.values("run__thread_id").annotate(
        open_count=Count("id"), oldest=Min("created_at"), newest=Max("created_at")
    )
    number = max(1, page)
    found, total_threads, total_calls = _grouped_page(
        grouped, newest_first=newest_first, number=number, per_page=per_page
    )
    if not found and number > 1:  # past the end (decisions shrink the inbox): the last page
        total_threads = calls.order_by().aggregate(n=Count("run__thread_id", distinct=True))["n"]
        number = max(1, -(-total_threads // per_page))
        found, total_threads, total_calls = _grouped_page(
            grouped, newest_first=newest_first, number=number, per_page=per_page
        )
    rows = {
        g["run__thread_id"]: InboxRow(
            thread_id=g["run__thread_id"], open_count=g["open_count"], oldest=g["oldest"], newest=g["newest"]
        )
        for g in found
    }
    if rows:
        # The first few calls of each listed thread, chosen in SQL on narrow rows (a thread may hold
        # thousands of waiting calls); then only those are read whole.
        order = [F("created_at"), F("run_id"), F("position"), F("id")]
        first_few = (
            calls.filter(run__thread_id__in=list(rows))
            .annotate(place=Window(RowNumber(), partition_by=F("run__thread_id"), order_by=order))
            .filter(place__lte=INBOX_CALLS_PER_ROW)
            .values_list("id", flat=True)
        )
        # By their ids (not as a subquery: the planner cannot see the window's cut and joined every call).
        members = SuspendedToolCall.objects.filter(id__in=list(first_few)).select_related(*claims.RELATED)
        for view in open_call_views(list(members.order_by(*order))):
            rows[view.call.run.thread_id].calls.append(view)
    return InboxPage(
        rows=list(rows.values()),
        number=number,
        per_page=per_page,
        total_threads=total_threads,
        total_calls=total_calls,
    )


def _grouped_page(grouped: QuerySet, *, newest_first: bool, number: int, per_page: int) -> tuple[list[dict], int, int]:
    """One page of the per-thread groups and the totals of all of them, in one scan of the open calls:
    the totals are window functions over the groups, computed before the page is cut (PostgreSQL and
    SQLite alike)."""
    from django.db import connections

    sql, params = grouped.order_by().query.sql_with_params()
    order = "g.newest DESC, g.run__thread_id" if newest_first else "g.oldest, g.run__thread_id"
    wrapped = (
        "SELECT g.run__thread_id, g.open_count, g.oldest, g.newest, COUNT(*) OVER (), SUM(g.open_count) OVER () "
        f"FROM ({sql}) g ORDER BY {order} LIMIT %s OFFSET %s"
    )
    connection = connections[grouped.db]
    with connection.cursor() as cursor:
        cursor.execute(wrapped, [*params, per_page, (number - 1) * per_page])
        fetched = cursor.fetchall()
    if not fetched:
        return [], 0, 0
    convert = (
        connection.ops.convert_datetimefield_value if hasattr(connection.ops, "convert_datetimefield_value") else None
    )
    found = []
    for thread_id, open_count, oldest, newest, _threads, _calls in fetched:
        if convert is not None:
            oldest, newest = convert(oldest, None, connection), convert(newest, None, connection)
        found.append({"run__thread_id": thread_id, "open_count": open_count, "oldest": oldest, "newest": newest})
    return found, fetched[0][4], int(fetched[0][5])


def inbox_facets(*, resource_id: str = "", hidden: frozenset[str] = frozenset(), menus: bool = True) -> dict[str, list]:
    """The filter menus (agents, resources, tools among waiting calls; two queries, each a scan of the
    waiting calls) and the runs waiting per registered agent the reader may see, for the chosen
    resource: the listing's exact totals, from the snapshot counters
    (``agentrun.core.selectors.waiting_runs_by_agent``: one query, whatever the number of runs). The tool
    and risk filters narrow the rows, not these counts. ``menus=False``: the counts only (the inbox's
    live refresh and its filters swap the rows and counts, never the menus)."""
    visible = [a.id for a in all_agents() if a.id not in hidden]
    counts = [{"agent_id": a, "waiting": n} for a, n in waiting_runs_by_agent(visible, resource_id=resource_id).items()]
    if not menus:
        return {"agents": [], "resources": [], "tools": [], "agent_counts": counts}
    open_calls = inbox_open_calls(hidden=hidden)
    # The tool a sub-agent's call would run is the inner call's: looked up for those calls only (a
    # correlated subquery on every waiting call cost more than the rest of the page).
    inner_tools = SuspendedToolCall.objects.filter(
        Exists(
            open_calls.filter(
                inner_run_id__isnull=False,
                inner_run_id=OuterRef("run_id"),
                inner_tool_call_id=OuterRef("tool_call_id"),
            )
        )
    ).values_list("tool_name", flat=True)
    combos = open_calls.annotate(
        surfaced=ExpressionWrapper(Q(inner_run_id__isnull=False), output_field=BooleanField())
    ).values_list("run__agent_id", "inner_agent_id", "run__resource_id", "tool_name", "surfaced")
    agents, resources, tools = set(), set(), set(inner_tools.distinct().order_by())
    for agent, inner_agent, resource, tool, surfaced in combos.distinct().order_by():
        agents.update(a for a in (agent, inner_agent) if a)
        if resource:
            resources.add(resource)
        if not surfaced:
            tools.add(tool)
    return {"agents": sorted(agents), "resources": sorted(resources), "tools": sorted(tools), "agent_counts": counts}


@dataclass
class OpenCallView:
    """An open call as the thread page shows it: one card (a sub-agent's call is the supervisor's
    surfaced call, showing the inner call that would run)."""

    call: SuspendedToolCall
    description: str
    args: Any  # the arguments the tool would run with (the inner call's for a sub-agent call)
    inner_tool_name: str | None
    resume_fields: list[ResumeField] | None
    reason: str = ""  # the agent's last text before the call: why it wants this
    # Form state after a submission that decided nothing (shown inline).
    error: str = ""
    error_items: list[str] = field(default_factory=list)
    failed_action: str = ""
    edit_text: str | None = None
    note: str = ""  # the reason box's text, kept
    resume_json: str = ""
    confirming: str = ""  # a high-risk approval waiting for its second step: "approve" | "edit" | "grant"
    # "Always approve" waiting for that step: the grant it would make (unsaved) and the chosen duration.
    grant: StandingGrant | None = None
    grant_expires_in: str = ""
    # A call that needs several approvals: the ones given on the arguments shown ({by, at}).
    approvals: list[dict] = field(default_factory=list)
    notice: str = ""  # said on the card after a decision that left it waiting (an approval towards a quorum)
    claim: claims.ClaimState = field(default_factory=claims.ClaimState)  # who is on it (shared work)
    args_schema: dict | None = None  # the tool's arguments' JSON Schema: the editor's fields

    @property
    def tool_call_id(self) -> str:
        return self.call.tool_call_id

    @property
    def is_approval(self) -> bool:
        return self.call.requires_approval

    @property
    def risk(self) -> str:
        return self.call.risk

    @property
    def high_risk(self) -> bool:
        return self.call.risk == SuspendedToolCall.Risk.HIGH

    @property
    def approvals_required(self) -> int:
        return self.call.approvals_required

    @property
    def approvals_progress(self) -> str:
        """ "1 of 2 approvals" for a call that needs several people (empty otherwise)."""
        if self.call.approvals_required <= 1:
            return ""
        return f"{len(self.approvals)} of {self.call.approvals_required} approvals"

    @property
    def grantable(self) -> bool:
        """Whether "Always approve…" may be offered: never for a high-risk call or one that needs
        several people (the decision service refuses such grants whatever the door)."""
        return self.is_approval and not self.high_risk and self.call.approvals_required <= 1

    @property
    def title(self) -> str:
        """What would run: ``refund``, or ``billing-agent → refund`` for a sub-agent's call."""
        if self.inner_tool_name:
            return f"{self.call.inner_agent_id} → {self.inner_tool_name}"
        return self.call.tool_name

    @property
    def fingerprint(self) -> str:
        """The displayed arguments' fingerprint, sent with every decision (``ARGS_CHANGED`` if stale)."""
        return args_fingerprint(self.args)

    @property
    def schema_dom_id(self) -> str:
        """The id of the card's ``<script type="application/json">`` holding ``args_schema``."""
        return "schema-" + hashlib.sha1(self.tool_call_id.encode()).hexdigest()[:16]

    @property
    def editing(self) -> bool:
        return self.edit_text is not None

    @property
    def edit_args(self) -> Any:
        """The edit as JSON (for its field-level diff), or None when it does not parse."""
        try:
            return json.loads(self.edit_text) if self.edit_text is not None else None
        except (ValueError, RecursionError):
            return None

    @property
    def edit_value(self) -> str:
        return self.args_json if self.edit_text is None else self.edit_text

    @property
    def args_json(self) -> str:
        return json.dumps(self.args, indent=2, ensure_ascii=False, sort_keys=False)

    @property
    def question(self) -> str:
        """A ``suspend()`` call's question as prose (``{"question": ...}`` or a plain string payload)."""
        payload = self.call.suspend_payload
        if isinstance(payload, str):
            return payload
        if isinstance(payload, dict):
            for key in QUESTION_KEYS:
                if isinstance(payload.get(key), str):
                    return payload[key]
        return ""

    @property
    def payload_extra(self) -> Any:
        """What the payload holds besides its question (shown as JSON only when there is any)."""
        payload = self.call.suspend_payload
        if not self.question:
            return payload
        if isinstance(payload, dict):
            rest = {k: v for k, v in payload.items() if k not in QUESTION_KEYS}
            return rest or None
        return None

    @property
    def payload_json(self) -> str:
        return json.dumps(self.payload_extra, indent=2, ensure_ascii=False)


QUESTION_KEYS = ("question", "prompt", "message", "text")


def _tool_facts(agent_id: str, tool_name: str) -> tuple[str, dict | None]:
    """The tool's description and its arguments' JSON Schema (the card's per-field editor)."""
    try:
        tool = get_agent(agent_id).tools.get(tool_name)
    except AgentRunError:
        return "", None
    if tool is None:
        return "", None
    try:
        schema = tool.parameters_schema
    except Exception:  # a schema that cannot be written out: the raw JSON editor still works
        schema = None
    return tool.description, schema


def validate_edited_args(view: OpenCallView, args: Any) -> None:
    """Raise the engine's ``ARGS_INVALID`` for edited arguments its tool would refuse (nothing decided)."""
    agent_id = view.call.inner_agent_id if view.inner_tool_name else view.call.run.agent_id
    tool_name = view.inner_tool_name or view.call.tool_name
    tool = get_agent(agent_id or "").tools.get(tool_name)
    if tool is not None:
        tool.validate_args(args)


def _reasons(calls: list[SuspendedToolCall], inner: dict[tuple[str, str], SuspendedToolCall]) -> dict[str, str]:
    """Per run: what the agent last said before each of its calls (one query).

    The reason of a call is the text of the assistant message that made it, else the run's latest
    assistant text before it. A sub-agent's call is explained by the sub-agent's own words.
    """
    run_ids = {c.run_id for c in calls} | {k[0] for k in inner}
    said = (
        Message.objects.filter(run_id__in=run_ids, role=Message.Role.ASSISTANT)
        .exclude(content="")
        .order_by("created_at", "id")
        .values_list("run_id", "content", "tool_calls", "created_at")
    )
    by_run: dict[str, list[tuple[str, Any, Any]]] = {}
    for run_id, content, tool_calls, created_at in said:
        by_run.setdefault(run_id, []).append((content, tool_calls, created_at))
    reasons: dict[str, str] = {}
    for c in [*calls, *inner.values()]:
        best = ""
        for content, tool_calls, created_at in by_run.get(c.run_id, ()):
            if created_at > c.created_at:
                break  # in time order: nothing later explains this call
            best = content
            if any(isinstance(t, dict) and t.get("id") == c.tool_call_id for t in tool_calls or []):
                break
        reasons[f"{c.run_id} {c.tool_call_id}"] = best.strip()
    return reasons


def open_call_views(calls: list[SuspendedToolCall]) -> list[OpenCallView]:
    """Decorate calls with their tool's description; a sub-agent call shows the inner call it waits on."""
    inner_keys = [(c.inner_run_id, c.inner_tool_call_id) for c in calls if c.inner_run_id]
    inner: dict[tuple[str, str], SuspendedToolCall] = {}
    if inner_keys:
        q = Q()
        for run_id, tool_call_id in inner_keys:
            q |= Q(run_id=run_id, tool_call_id=tool_call_id)
        inner = {(c.run_id, c.tool_call_id): c for c in SuspendedToolCall.objects.filter(q)}
    reasons = _reasons(calls, inner) if calls else {}
    now = timezone.now()
    facts: dict[tuple[str, str], tuple[str, dict | None]] = {}  # per tool, once (an inbox page shows many calls)

    def _tool_facts_once(agent_id: str, tool_name: str) -> tuple[str, dict | None]:
        if (agent_id, tool_name) not in facts:
            facts[agent_id, tool_name] = _tool_facts(agent_id, tool_name)
        return facts[agent_id, tool_name]

    views = []
    for c in calls:
        inner_call = inner.get((c.inner_run_id, c.inner_tool_call_id)) if c.inner_run_id else None
        reason = reasons.get(f"{c.run_id} {c.tool_call_id}", "")
        if inner_call is not None:
            description, schema = _tool_facts_once(c.inner_agent_id or "", inner_call.tool_name)
            inner_name = inner_call.tool_name
            reason = reasons.get(f"{inner_call.run_id} {inner_call.tool_call_id}") or reason
        else:
            description, schema = _tool_facts_once(c.run.agent_id, c.tool_name)
            inner_name = None
        # What the reviewer approves: an earlier approver's edit still short of its quorum, the inner
        # call's arguments (what would run), or the call's own.
        args = shown_args(c, inner_call)
        views.append(
            OpenCallView(
                call=c,
                description=description,
                args=args,
                inner_tool_name=inner_name,
                resume_fields=None if c.requires_approval else build_fields(c.resume_schema),
                reason=reason,
                approvals=[{"by": d.decided_by_username, "at": d.decided_at} for d in approvals_given(c)],
                claim=claims.state_of(c, now=now),
                args_schema=schema,
            )
        )
    return views


def thread_open_calls(thread_id: str, hidden: frozenset[str] = frozenset()) -> list[SuspendedToolCall]:
    """The thread's open calls, one per decision to make: a sub-agent's call that its supervisor
    surfaces is shown (and decided) as the supervisor's call only."""
    return list(
        SuspendedToolCall.objects.filter(waits(hidden), status=OPEN, run__thread_id=thread_id)
        .exclude(surfaced_by_a_supervisor(hidden))
        .select_related(*claims.RELATED)
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


def history_decisions(*, hidden: frozenset[str] = frozenset(), **filters: Any) -> QuerySet[Decision]:
    """The history page's decisions: the one audit-trail filter (``agentrun.core.selectors.decision_history``,
    also behind ``GET /api/decisions``), newest first, with the run's resource for its column."""
    decisions = decision_history(hidden=hidden, **filters)
    return decisions.annotate(resource_id=F("run__resource_id")).order_by("-decided_at", "-id")


@dataclass
class TimelineCall:
    """A call of a tool_calls step as it ran: an edited call ran with ``edited`` (``arguments`` was asked)."""

    id: str
    name: str
    arguments: Any
    output: str | None
    decision: Decision | None

    @property
    def edited(self) -> Any:
        return self.decision.edited_args if self.decision is not None else None

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, indent=2, ensure_ascii=False)


def timeline_steps(run: Any, decisions: list[Decision]) -> list[tuple[Any, list[TimelineCall]]]:
    """The run's steps, each with its calls joined to their decision (one query: the steps)."""
    by_call = {d.tool_call_id: d for d in decisions}  # in decision order: a call's latest decision wins
    steps = []
    for step in run.steps.order_by("created_at", "id"):
        calls = []
        if step.step_details.get("type") == "tool_calls":
            for tc in step.step_details.get("toolCalls") or []:
                function = tc.get("function") or {}
                try:
                    arguments = json.loads(function.get("arguments") or "null")
                except ValueError:
                    arguments = function.get("arguments")
                calls.append(
                    TimelineCall(
                        id=tc.get("id", ""),
                        name=function.get("name", ""),
                        arguments=arguments,
                        output=function.get("output"),
                        decision=by_call.get(tc.get("id", "")),
                    )
                )
        steps.append((step, calls))
    return steps

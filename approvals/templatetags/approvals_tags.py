from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any
from urllib.parse import quote

from django import template
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import dateformat, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from approvals.urls import thread_path

register = template.Library()


@register.filter
def pretty_json(value: Any) -> str:
    """JSON for a <pre>: autoescaping still applies where it is printed."""
    if value is None:
        return "null"
    return json.dumps(value, indent=2, ensure_ascii=False)


@register.filter
def waited(since: datetime | None) -> str:
    """How long ago, compactly: 42s, 5m, 3h 10m, 2d 4h."""
    if since is None:
        return ""
    seconds = max(0, int((timezone.now() - since).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if hours < 1:
        return f"{minutes}m"
    if days < 1:
        return f"{hours}h {minutes % 60}m"
    return f"{days}d {hours % 24}h"


@register.filter
def dom_id(value: str) -> str:
    """A stable id-safe token for any string (thread ids may hold any character)."""
    return hashlib.sha1(str(value).encode()).hexdigest()[:16]


@register.filter
def thread_url(thread_id: str) -> str:
    """``{{ run.thread_id|thread_url }}``: the thread page of any id (``approvals.urls.thread_path``)."""
    return thread_path(thread_id)


@register.filter
def usage_total(usage: dict | None) -> str:
    if not usage:
        return ""
    return f"{usage.get('promptTokens', 0)} in · {usage.get('completionTokens', 0)} out"


DECISION_VERBS = {"approve": "Approved", "decline": "Declined", "resume": "Resumed", "expire": "Expired"}


@register.filter
def decision_verb(kind: str) -> str:
    return DECISION_VERBS.get(kind, kind)


SUMMARY_LENGTH = 100


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@register.filter
def args_summary(args: Any) -> str:
    """Arguments on one line: ``to=ann@example.com · subject=Your order``, cut at about 100 characters."""
    pairs = args.items() if isinstance(args, dict) else [(None, args)]
    text = " · ".join(_compact(v) if k is None else f"{k}={_compact(v)}" for k, v in pairs)
    text = " ".join(text.split())  # line breaks in a value would break the line
    return text if len(text) <= SUMMARY_LENGTH else text[: SUMMARY_LENGTH - 1] + "…"


@register.filter
def arg_changes(original: Any, edited: Any) -> list[dict]:
    """What an edit changed, key by key: ``[{key, before, after, change: same|changed|added|removed}]``.

    Arguments that are not objects compare whole (one entry, key ``None``)."""
    if not isinstance(original, dict) or not isinstance(edited, dict):
        same = original == edited
        return [
            {
                "key": None,
                "before": _compact(original),
                "after": _compact(edited),
                "change": "same" if same else "changed",
            }
        ]
    changes = []
    for key in [*original, *(k for k in edited if k not in original)]:
        if key not in edited:
            changes.append({"key": key, "before": _compact(original[key]), "after": None, "change": "removed"})
        elif key not in original:
            changes.append({"key": key, "before": None, "after": _compact(edited[key]), "change": "added"})
        else:
            same = original[key] == edited[key]
            before, after = _compact(original[key]), _compact(edited[key])
            changes.append({"key": key, "before": before, "after": after, "change": "same" if same else "changed"})
    return changes


# --- the inbox's rows (docs/dashboard.md#inbox) -----------------------------------------------------
# A page holds up to 200 threads and their calls: rendered here in Python, a row in a few dozen
# microseconds, where the template language spent more than a millisecond on each (docs/performance.md).
# Every value goes through format_html, which escapes it.
@register.simple_tag(takes_context=True)
def inbox_rows(context: template.Context, rows: list) -> str:
    username = context["user"].get_username()
    can_decide = bool(context.get("can_decide"))
    decide = reverse("approvals:decide", args=["RUN", "CALL"])
    return mark_safe("".join(_inbox_row(t, username, can_decide, decide) for t in rows))  # noqa: S308 - built by format_html


def _inbox_row(t: Any, username: str, can_decide: bool, decide: str) -> str:
    turl = thread_path(t.thread_id)
    agent_ids = t.agent_ids
    resources = format_html_join(", ", "<strong>{}</strong>", ((r,) for r in t.resource_ids)) or mark_safe(
        "<strong>no resource</strong>"
    )
    oldest = dateformat.format(timezone.localtime(t.oldest), "Y-m-d H:i:s T") if t.oldest else ""
    head = format_html(
        '<li class="thread-row risk-{}" data-thread-id="{}"><div class="row-head">'
        '<a class="thread-link" href="{}">{}</a>'
        ' <span class="count" title="open calls">{} open call{}</span>'
        ' <span class="waited" title="oldest open call since {}">waiting {}</span></div>'
        '<div class="row-meta">{}<span class="who">for {}</span></div><ul class="row-calls">',
        t.risk, t.thread_id, turl, t.thread_id, t.open_count, pluralize(t.open_count), oldest, waited(t.oldest),
        format_html_join("", '<span class="tag">{}</span> ', ((a,) for a in agent_ids)), resources,
    )  # fmt: skip
    calls = "".join(_inbox_call(c, turl, len(agent_ids) > 1, username, can_decide, decide) for c in t.calls)
    more = format_html('<li class="muted small">and {} more</li>', t.more) if t.more > 0 else ""
    return head + calls + more + "</ul></li>"


def _inbox_call(c: Any, turl: str, several_agents: bool, username: str, can_decide: bool, decide: str) -> str:
    call, claim = c.call, c.claim
    # Keys a / d decide from here (static/approvals.js builds the reason box d opens); tabindex: j/k move
    # between calls, Enter opens the thread at this call.
    decide_url = ""
    if can_decide and c.is_approval:
        url = decide.replace("RUN", quote(call.run_id, safe="")).replace("CALL", quote(c.tool_call_id, safe=""))
        decide_url = format_html(' data-decide-url="{}"', url)
    tags = []
    if c.inner_tool_name:
        tags.append(format_html('<span class="muted small">via {}</span>', call.inner_agent_id))
    if several_agents:
        tags.append(format_html('<span class="tag agent">{}</span>', call.run.agent_id))
    if not c.is_approval:
        tags.append(mark_safe('<span class="tag info">question</span>'))
    if claim.claimed_by:
        who = "you are on it" if claim.claimed_by == username else f"{claim.claimed_by} is looking"
        tags.append(format_html('<span class="tag claimer" data-testid="row-claim">{}</span>', who))
    if claim.assignee or claim.assignee_group:
        tags.append(format_html('<span class="tag assigned">→ {}</span>', claim.assignee or claim.assignee_group))
    return format_html(
        '<li class="row-call" data-tool-call-ref="{}" data-risk="{}" data-fingerprint="{}" tabindex="-1"'
        ' data-card-url="{}#call-{}"{}>'
        '<span class="risk risk-{}" title="risk">{}{}</span> <code class="tool">{}</code> {}'
        ' <span class="summary">{}</span> <span class="muted small call-waited">{}</span></li>',
        c.tool_call_id, call.risk, c.fingerprint, turl, dom_id(c.tool_call_id), decide_url,
        call.risk, call.risk, " risk" if call.risk == "high" else "", c.inner_tool_name or call.tool_name,
        mark_safe(" ".join(tags)), args_summary(c.args), waited(call.created_at),  # noqa: S308 - format_html's
    )  # fmt: skip

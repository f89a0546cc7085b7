from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

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

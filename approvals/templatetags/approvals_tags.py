from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

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
def one_line(value: Any, limit: int = 120) -> str:
    """Arguments on one line for a list: compact JSON, cut at ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


@register.filter
def usage_total(usage: dict | None) -> str:
    if not usage:
        return ""
    return f"{usage.get('promptTokens', 0)} in · {usage.get('completionTokens', 0)} out"


DECISION_VERBS = {"approve": "Approved", "decline": "Declined", "resume": "Resumed", "expire": "Expired"}


@register.filter
def decision_verb(kind: str) -> str:
    return DECISION_VERBS.get(kind, kind)

from __future__ import annotations

from datetime import UTC, datetime

from agentrun.core.errors import AgentRunError


def iso(dt: datetime | None) -> str | None:
    """ISO 8601 in UTC with microseconds: a returned timestamp used as a filter bound matches itself."""
    if dt is None:
        return None
    return dt.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_datetime_bound(value: datetime | str | None, name: str) -> datetime | None:
    """An aware datetime (naive = UTC) from a datetime or an ISO 8601 string; INVALID_DATE otherwise."""
    if value is None or value == "":
        return None
    parsed = None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            parsed = None
    if parsed is None:
        raise AgentRunError("INVALID_DATE", f"{name} must be an ISO 8601 date-time, got {value!r}")
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        # In UTC: PostgreSQL refuses some offsets Python accepts (up to ±24 h).
        return parsed.astimezone(UTC)
    except (OverflowError, ValueError):
        raise AgentRunError("INVALID_DATE", f"{name} is out of range: {value!r}") from None

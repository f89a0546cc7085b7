"""drf-spectacular hooks."""

from __future__ import annotations

from typing import Any


def drop_slash_aliases(endpoints: list[tuple], **kwargs: Any) -> list[tuple]:
    """Each route exists twice (with and without the trailing slash): document the contract's one."""
    seen: dict[tuple[str, str], tuple] = {}
    for endpoint in endpoints:
        path, _regex, method, _callback = endpoint
        key = (path.rstrip("/"), method)
        canonical = seen.get(key)
        # The contract spells collections of the root with a slash (/api/agents/) and the rest without.
        prefer_slash = path.rstrip("/") in {"/api/agents", "/api/schema", "/api/docs", "/api/webhook-endpoints"}
        if canonical is None or (path.endswith("/") == prefer_slash):
            seen[key] = endpoint
    return list(seen.values())

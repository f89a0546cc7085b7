"""Open websockets, counted by route for ``/metrics`` (docs/operations.md "Metrics")."""

from __future__ import annotations

from typing import Any

from agentrun.core import metrics


def websocket_route(path: str) -> str:
    """The route of a websocket path, without its ids: ``ws/runs``, ``ws/agents``, ``ws/approvals``."""
    parts = [p for p in path.split("/") if p]
    return "/".join(parts[:2]) if parts[:1] == ["ws"] else "other"


def count_websockets(app: Any) -> Any:
    """ASGI wrapper: the websocket connections this process is serving, on ``/metrics``."""

    async def counted(scope: dict, receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            return await app(scope, receive, send)
        gauge = metrics.WEBSOCKET_CONNECTIONS.labels(websocket_route(scope.get("path", "")))
        gauge.inc()
        try:
            return await app(scope, receive, send)
        finally:
            gauge.dec()

    return counted

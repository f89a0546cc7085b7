"""Every request, observed (docs/operations.md): its duration by route on ``/metrics``, its log lines
tagged with a request id and the agent, run and tool call its URL names, a span when tracing is on.
(Open websockets are counted by ``agentrun.ws.observed``.)
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase
from django.urls import Resolver404, ResolverMatch, resolve

from agentrun.core import logcontext, metrics, tracing

# A request id a client or proxy sends is kept if it looks like one (it is logged and echoed back).
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# URL keyword arguments that name what a log line is about.
URL_FIELDS = {"agent_id": "agent_id", "run_id": "run_id", "tool_call_id": "tool_call_id"}


def _match(request: HttpRequest) -> ResolverMatch | None:
    if request.resolver_match is not None:  # resolved before the middleware (agentrun.asgi's handler)
        return request.resolver_match
    try:
        return resolve(request.path_info)
    except Resolver404:
        return None


class RequestObservation:
    """Middleware (first in ``MIDDLEWARE``): runs sync or async, as the handler does."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def _begin(self, request: HttpRequest) -> tuple[str, str, dict[str, Any]]:
        given = request.headers.get("X-Request-ID", "")
        request_id = given if REQUEST_ID.match(given) else uuid.uuid4().hex
        match = _match(request)
        route = match.route if match is not None and match.route else "unmatched"
        named = {field: match.kwargs.get(kwarg) for kwarg, field in URL_FIELDS.items()} if match else {}
        return request_id, route, {k: str(v) for k, v in named.items() if v is not None}

    @staticmethod
    def _end(request: HttpRequest, response: HttpResponseBase, route: str, request_id: str, started: float) -> None:
        response["X-Request-ID"] = request_id
        status = f"{response.status_code // 100}xx"
        metrics.HTTP_REQUEST_DURATION.labels(route, request.method, status).observe(time.perf_counter() - started)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        started = time.perf_counter()
        request_id, route, named = self._begin(request)
        with (
            logcontext.bound(request_id=request_id, **named),
            tracing.span(f"HTTP {request.method} {route}", request_id=request_id, **named),
        ):
            response = self.get_response(request)
        self._end(request, response, route, request_id, started)
        return response

    async def __acall__(self, request: HttpRequest) -> Any:
        started = time.perf_counter()
        request_id, route, named = self._begin(request)
        with (
            logcontext.bound(request_id=request_id, **named),
            tracing.span(f"HTTP {request.method} {route}", request_id=request_id, **named),
        ):
            response = await self.get_response(request)
        self._end(request, response, route, request_id, started)
        return response

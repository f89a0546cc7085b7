"""The REST API's HTTP plumbing: bounded JSON bodies, negotiation, permissions, query parameters."""

from __future__ import annotations

import io
import json
from typing import Any

from rest_framework import exceptions
from rest_framework.authentication import SessionAuthentication
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agentrun.api.authentication import BearerTokenAuthentication, GuardedTokenAuthentication
from agentrun.api.bodies import max_body_size, parse_json
from agentrun.api.exceptions import too_large
from agentrun.api.throttling import ApiRateThrottle
from agentrun.core.access import VIEW_PERMISSION
from agentrun.core.errors import AgentRunError
from agentrun.engine.inputs import json_problem

EVENT_STREAM = "text/event-stream"


def check_text(value: Any, where: str) -> None:
    """Refuse what the databases cannot store (NUL characters, lone surrogates, infinite numbers) and
    what is nested too deeply to handle safely: a 400, never a 500."""
    if problem := json_problem(value):
        raise AgentRunError("INVALID_REQUEST", f"{where} {problem}")


class BoundedJSONParser(BaseParser):
    """JSON, whatever the declared content type, read no further than 1 MiB (then 413)."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        limit = max_body_size()
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise too_large()
        if not raw.strip():
            return {}
        return parse_json(raw, where="the body")


class EventStreamRenderer(BaseRenderer):
    """Lets ``Accept: text/event-stream`` through negotiation; the views stream the body themselves."""

    media_type = EVENT_STREAM
    format = "sse"
    charset = None

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: dict | None = None) -> bytes:
        return json.dumps(data).encode()


class LenientNegotiation(DefaultContentNegotiation):
    """An unsatisfiable ``Accept`` gets JSON rather than a 406 the contract does not name."""

    def select_renderer(self, request: Request, renderers: list, format_suffix: str | None = None) -> tuple:
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except exceptions.NotAcceptable:
            return renderers[0], renderers[0].media_type


class HasRequiredPermission(BasePermission):
    """The view's ``required_permissions[method]`` (default: read permission)."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        perm = getattr(view, "required_permissions", {}).get(request.method, VIEW_PERMISSION)
        return user.has_perm(perm)


class ApiView(APIView):
    """Base of every endpoint: Token first, so anonymous requests get 401 with a challenge."""

    authentication_classes = [GuardedTokenAuthentication, BearerTokenAuthentication, SessionAuthentication]
    permission_classes = [HasRequiredPermission]
    parser_classes = [BoundedJSONParser]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = LenientNegotiation
    required_permissions: dict[str, str] = {}

    def initialize_request(self, request: Any, *args: Any, **kwargs: Any) -> Request:
        # DRF reads no body at all without a Content-Length: a chunked request (ASGI) would reach the
        # view as an empty body — and an empty approve body approves. Read it here, bounded.
        if not request.META.get("CONTENT_LENGTH"):
            raw = request.read(max_body_size() + 1)
            request.META["CONTENT_LENGTH"] = str(len(raw))  # over the limit: initial() answers 413
            request._body, request._stream, request._read_started = raw, io.BytesIO(raw), False
        return super().initialize_request(request, *args, **kwargs)

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > max_body_size():
            raise too_large()
        super().initial(request, *args, **kwargs)
        check_text(list(kwargs.values()), "the path")
        check_text([v for values in request.query_params.lists() for v in values[1]], "the query")
        check_text(list(request.query_params.keys()), "the query")
        check_text(request.headers.get("Idempotency-Key") or "", "the Idempotency-Key header")  # it is stored

    def permission_denied(self, request: Request, message: str | None = None, code: str | None = None) -> None:
        # Refused before the throttle ran: a count taken with the token check is taken back (ApiRateThrottle).
        ApiRateThrottle.take_back(request)
        super().permission_denied(request, message=message, code=code)

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        # Every Response of this API is JSON, errors included, even when the client asked for an
        # event stream (event streams are StreamingHttpResponses, which DRF does not render).
        if isinstance(response, Response):
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = "application/json"
        return super().finalize_response(request, response, *args, **kwargs)

    def body(self) -> dict:
        data = self.request.data
        if hasattr(data, "dict"):  # an empty body: DRF hands back an empty QueryDict
            data = data.dict()
        return data


def wants_event_stream(request: Request) -> bool:
    return EVENT_STREAM in request.META.get("HTTP_ACCEPT", "")


# --- query parameters ----------------------------------------------------------------------------
def int_param(value: str | None, *, name: str, default: int, minimum: int, maximum: int) -> int:
    if value is None or value == "":
        return default
    text = value.strip()
    if not text.lstrip("-").isdigit() or len(text) > 12:
        raise AgentRunError("INVALID_REQUEST", f"{name} must be an integer, got {value!r}")
    number = int(text)
    if not minimum <= number <= maximum:
        raise AgentRunError("INVALID_REQUEST", f"{name} must be between {minimum} and {maximum}, got {number}")
    return number


def choice_param(value: str | None, *, name: str, choices: tuple[str, ...], default: str | None) -> str | None:
    if value is None or value == "":
        return default
    if value not in choices:
        raise AgentRunError("INVALID_REQUEST", f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value

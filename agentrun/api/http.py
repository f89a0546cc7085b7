"""The REST API's HTTP plumbing: bounded JSON bodies, negotiation, permissions, query parameters."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework import exceptions
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agentrun.access import VIEW_PERMISSION
from agentrun.api.exceptions import too_large
from agentrun.errors import AgentRunError

EVENT_STREAM = "text/event-stream"


def max_body_size() -> int:
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 1024 * 1024


def check_text(value: Any, where: str) -> None:
    """Refuse what the databases cannot store (NUL characters, lone surrogates): a 400, never a 500."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise AgentRunError("INVALID_REQUEST", f"{where} must not contain NUL characters")
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise AgentRunError("INVALID_REQUEST", f"{where} must be valid Unicode text") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


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
        try:
            data = json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise exceptions.ParseError(f"The body is not valid JSON: {exc}") from None
        check_text(data, "the body")
        return data


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


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

    authentication_classes = [TokenAuthentication, SessionAuthentication]
    permission_classes = [HasRequiredPermission]
    parser_classes = [BoundedJSONParser]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = LenientNegotiation
    required_permissions: dict[str, str] = {}

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > max_body_size():
            raise too_large()
        super().initial(request, *args, **kwargs)
        check_text(list(kwargs.values()), "the path")
        check_text([v for values in request.query_params.lists() for v in values[1]], "the query")
        check_text(list(request.query_params.keys()), "the query")

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

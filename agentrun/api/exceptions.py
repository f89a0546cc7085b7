"""The one exception handler of the REST API: every error becomes the envelope of docs/api.md#errors.

``{"error": {"code", "message", "details"?}}`` — contract errors (``AgentRunError``) keep their code
and status; DRF's and Django's own errors are mapped to the contract's codes.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import Http404, JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response

from agentrun.core import outages
from agentrun.core.errors import AgentRunError
from agentrun.core.throttle import retry_after

# DRF's errors that the contract names; anything else keeps its status with a generic code.
_DRF_CODES: list[tuple[type[exceptions.APIException], str]] = [
    (exceptions.NotAuthenticated, "NOT_AUTHENTICATED"),
    (exceptions.AuthenticationFailed, "NOT_AUTHENTICATED"),
    (exceptions.PermissionDenied, "PERMISSION_DENIED"),
    (exceptions.NotFound, "NOT_FOUND"),
    (exceptions.ParseError, "INVALID_REQUEST"),
    (exceptions.ValidationError, "INVALID_REQUEST"),
    (exceptions.UnsupportedMediaType, "INVALID_REQUEST"),
    (exceptions.MethodNotAllowed, "METHOD_NOT_ALLOWED"),
    (exceptions.NotAcceptable, "NOT_ACCEPTABLE"),
    (exceptions.Throttled, "THROTTLED"),
]


def envelope(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if details:
        error["details"] = details
    return {"error": error}


def _message(detail: Any) -> str:
    if isinstance(detail, list | tuple) and detail:
        return _message(detail[0])
    if isinstance(detail, dict) and detail:
        key, value = next(iter(detail.items()))
        return f"{key}: {_message(value)}"
    return str(detail)


def too_large() -> AgentRunError:
    return AgentRunError("PAYLOAD_TOO_LARGE", "The request body is larger than 1 MiB.")


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """REST_FRAMEWORK["EXCEPTION_HANDLER"]. Unknown exceptions return None: they are bugs (a 500)."""
    if isinstance(exc, RequestDataTooBig | TooManyFieldsSent):
        exc = too_large()
    if isinstance(exc, outages.INFRASTRUCTURE_ERRORS):
        exc = outages.unavailable(exc)  # the database or the channel layer is away (docs/operations.md)
    if isinstance(exc, AgentRunError):
        if exc.http_status == 503:
            headers = {"Retry-After": str(outages.RETRY_AFTER_SECONDS)}
            return outages.counted(Response(exc.to_dict(), status=503, headers=headers))
        return Response(exc.to_dict(), status=exc.http_status)
    if isinstance(exc, Http404):
        return Response(envelope("NOT_FOUND", "Not found."), status=404)
    if isinstance(exc, DjangoPermissionDenied):
        return Response(envelope("PERMISSION_DENIED", "You do not have permission to do this."), status=403)
    if not isinstance(exc, exceptions.APIException):
        return None
    code = next((c for cls, c in _DRF_CODES if isinstance(exc, cls)), "INVALID_REQUEST")
    details = {"fields": exc.detail} if isinstance(exc, exceptions.ValidationError) else None
    headers = {}
    if auth_header := getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = auth_header
    if wait := getattr(exc, "wait", None):
        headers["Retry-After"] = retry_after(wait)
    status = exc.status_code
    if code == "INVALID_REQUEST":
        status = 400  # a body that is not JSON is bad input like any other (no 415 in the contract)
    if status == 403 and code == "NOT_AUTHENTICATED":
        # DRF downgrades to 403 when no authenticator offers a WWW-Authenticate challenge.
        code = "PERMISSION_DENIED"
    return Response(envelope(code, _message(exc.detail), details), status=status, headers=headers)


def api_not_found(request: Any, *args: Any, **kwargs: Any) -> JsonResponse:
    """Any path under /api/ that names no endpoint."""
    return JsonResponse(envelope("NOT_FOUND", f"No endpoint {request.path}."), status=404)

"""HTTP answers while the database or the channel layer is unreachable (docs/operations.md "Outages").

The REST API answers 503 ``SERVICE_UNAVAILABLE`` through its own exception handler
(``agentrun.api.exceptions``); this module covers every other view and what escapes a view:

- ``OutageMiddleware``: an infrastructure error raised by a view answers 503 with ``Retry-After`` — the
  JSON error envelope under ``/api/``, a short "try again" page elsewhere (the dashboard, the admin).
- ``server_error`` (``handler500``): an error no view handled answers in the same words — 503 while a
  service is known to be away, else 500 (JSON under ``/api/``, never Django's bare HTML there).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin

from agentrun.core import outages

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · agentrun</title></head>
<body style="font-family: system-ui, sans-serif; max-width: 36rem; margin: 4rem auto; padding: 0 1rem">
<h1>{title}</h1><p>{text}</p></body></html>
"""


def _answer(request: HttpRequest, status: int, code: str, message: str) -> HttpResponse:
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"error": {"code": code, "message": message}}, status=status)
    elif status == 503:
        text = f"{message} Nothing you did was lost: go back and try again in a few seconds."
        response = HttpResponse(PAGE.format(title="Try again in a moment", text=text), status=status)
    else:
        text = "Something went wrong on our side. Try again; if it keeps happening, tell your administrator."
        response = HttpResponse(PAGE.format(title="Server error", text=text), status=status)
    if status == 503:
        response["Retry-After"] = str(outages.RETRY_AFTER_SECONDS)
        outages.counted(response)
    return response


def unavailable_response(request: HttpRequest, exc: BaseException) -> HttpResponse:
    error = outages.unavailable(exc)
    return _answer(request, 503, error.code, error.message)


class OutageMiddleware(MiddlewareMixin):
    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, outages.INFRASTRUCTURE_ERRORS):
            return unavailable_response(request, exception)
        return None


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``. Django does not pass the error (and under ASGI it is no longer at hand): a service
    known to be away right now is the likely cause."""
    for dependency in (outages.database, outages.channel_layer):
        if dependency.down:
            message = f"The {dependency.name} is unreachable; try again in {outages.RETRY_AFTER_SECONDS} s."
            return _answer(request, 503, "SERVICE_UNAVAILABLE", message)
    return _answer(request, 500, "server_error", "The server failed to answer this request.")

"""DRF throttles for API use (``REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"]``): per person, whether they
come with a token or a session, and per address for anonymous requests. 429 ``THROTTLED`` with
``Retry-After`` (the exception handler). Counted with ``agentrun.core.throttle`` (two integers per key,
not DRF's list of timestamps, which grows with the rate). Rates: docs/security.md, "Throttling"."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from agentrun.core.throttle import RateLimit, client_address


def api_rate(user: Any) -> RateLimit:
    """The API rate limit of a request by ``user`` (anonymous: per address)."""
    if user is not None and user.is_authenticated:
        return RateLimit("api-user", settings.AGENTRUN_API_RATE)
    return RateLimit("api-anon", settings.AGENTRUN_API_ANON_RATE)


class ApiRateThrottle(BaseThrottle):
    """``AGENTRUN_API_RATE`` per user (token or session), ``AGENTRUN_API_ANON_RATE`` per address.

    A request whose token authentication counted it already (``counted``: the failed-token check and
    this count in one cache round trip) is not counted again; one refused by permissions before its
    throttle ran has its count taken back (``take_back``), as if it had never been counted."""

    @staticmethod
    def counted(request: Request, key: str, wait: float | None) -> None:
        """``request`` was counted for ``key`` already, allowed (``wait`` None) or not."""
        request._api_rate_counted = (key, wait)  # type: ignore[attr-defined]

    @staticmethod
    def take_back(request: Request) -> None:
        """Undo the count of a request counted early that its throttle will not see (refused before)."""
        counted = request.__dict__.pop("_api_rate_counted", None)
        if counted is not None and counted[1] is None:
            api_rate(request.user).take_back(counted[0])

    def allow_request(self, request: Request, view: Any) -> bool:
        user = request.user
        limit = api_rate(user)
        key = str(user.pk) if user is not None and user.is_authenticated else client_address(request.META)
        counted = request.__dict__.pop("_api_rate_counted", None)
        if counted is not None and counted[0] == key:
            self._wait = counted[1]
        else:
            self._wait = limit.check_and_hit(key)
        return self._wait is None

    def wait(self) -> float | None:
        return self._wait

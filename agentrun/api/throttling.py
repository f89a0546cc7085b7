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


class ApiRateThrottle(BaseThrottle):
    """``AGENTRUN_API_RATE`` per user (token or session), ``AGENTRUN_API_ANON_RATE`` per address."""

    def allow_request(self, request: Request, view: Any) -> bool:
        user = request.user
        if user is not None and user.is_authenticated:
            limit, key = RateLimit("api-user", settings.AGENTRUN_API_RATE), str(user.pk)
        else:
            limit, key = RateLimit("api-anon", settings.AGENTRUN_API_ANON_RATE), client_address(request.META)
        self._wait = limit.check_and_hit(key)
        return self._wait is None

    def wait(self) -> float | None:
        return self._wait

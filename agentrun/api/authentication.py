"""Token authentication for the REST API: ``Token <key>`` (DRF's) and ``Bearer <key>``
(docs/api.md#authentication-and-permissions), with failed attempts limited per client address *before*
a token is looked up.

DRF's throttles run after authentication, so a guessed token would get 401 forever; here an address
that failed ``AGENTRUN_TOKEN_FAILURE_RATE`` times (30 a minute by default) gets 429 ``THROTTLED`` with
``Retry-After`` instead, and its guesses are not even checked until then (docs/security.md,
"Throttling"). Websockets share the same count (``agentrun.ws.auth``).

A module of its own: ``REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]`` names it, and DRF imports
those while it is still importing its views, so this must not import them back.
"""

from __future__ import annotations

import copy
from typing import Any

from django.conf import settings
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication, get_authorization_header
from rest_framework.request import Request

from agentrun.api.throttling import ApiRateThrottle, api_rate
from agentrun.core import authcache
from agentrun.core.throttle import RateLimit, client_address, wait_then_count

TOO_MANY_FAILURES = "Too many failed token authentications from this address."


def token_failures() -> RateLimit:
    return RateLimit("token-failures", settings.AGENTRUN_TOKEN_FAILURE_RATE)


class GuardedTokenAuthentication(TokenAuthentication):
    """``Authorization: Token <key>``; an address past its failed-attempt limit gets 429."""

    def authenticate(self, request: Request) -> Any:
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None  # not this scheme: nothing to count
        address = client_address(request.META)
        limit = token_failures()
        if (known := self._known_token(request, header, address, limit)) is not None:
            return known
        if (wait := limit.wait(address)) is not None:
            raise exceptions.Throttled(wait=wait, detail=TOO_MANY_FAILURES)
        try:
            return super().authenticate(request)
        except exceptions.AuthenticationFailed:
            limit.hit(address)
            raise

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        """DRF's, with the token and its user kept for a few seconds (``agentrun.core.authcache``: a
        revoked token or a deactivated user is refused at once in the process that changed them, within
        the TTL in the others). Each request gets its own copies."""
        found = authcache.cached(("token", key), lambda: self._token(key))
        if found is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        token, user = copy.copy(found), copy.copy(found.user)
        if not user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        token.user = user
        return user, token

    def _known_token(self, request: Request, header: list[bytes], address: str, limit: RateLimit) -> Any:
        """A token this process knows already (``authcache``), of an active person, on a view limited by
        ``ApiRateThrottle``: the failed-token check and the API count in one cache round trip
        (``wait_then_count``), the count handed to the throttle. The same answers as the two steps: an
        address past its failure limit gets 429 whatever the token, and nothing is counted then. None:
        take the usual steps (an unknown token, an inactive person, another view, not Redis)."""
        view = (getattr(request, "parser_context", None) or {}).get("view")
        if len(header) != 2 or ApiRateThrottle not in getattr(view, "throttle_classes", ()):
            return None
        try:
            key = header[1].decode()
        except UnicodeError:
            return None
        found, _ = authcache.get(("token", key))
        if found is None or not found.user.is_active:
            return None
        counted = wait_then_count((limit, address), (api_rate(found.user), str(found.user.pk)))
        if counted is None:
            return None
        refused, wait = counted
        if refused is not None:
            raise exceptions.Throttled(wait=refused, detail=TOO_MANY_FAILURES)
        token, user = copy.copy(found), copy.copy(found.user)
        token.user = user
        ApiRateThrottle.counted(request, str(user.pk), wait)
        return user, token

    def _token(self, key: str) -> Any:
        return self.get_model().objects.select_related("user").filter(key=key).first()


class BearerTokenAuthentication(GuardedTokenAuthentication):
    """``Authorization: Bearer <key>``: the same API tokens, spelt the way OpenAI, Azure and Mastra
    clients send them."""

    keyword = "Bearer"

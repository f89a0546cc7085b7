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

from agentrun.core import authcache
from agentrun.core.throttle import RateLimit, client_address


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
        if (wait := limit.wait(address)) is not None:
            raise exceptions.Throttled(wait=wait, detail="Too many failed token authentications from this address.")
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

    def _token(self, key: str) -> Any:
        return self.get_model().objects.select_related("user").filter(key=key).first()


class BearerTokenAuthentication(GuardedTokenAuthentication):
    """``Authorization: Bearer <key>``: the same API tokens, spelt the way OpenAI, Azure and Mastra
    clients send them."""

    keyword = "Bearer"

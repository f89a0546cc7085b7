"""Websocket authentication: the session cookie, ``Authorization: Token <key>`` (or ``Bearer <key>``), or
``?token=<key>``; the origin check (``OriginCheck``); and the limits of docs/security.md ("Throttling")
that apply before a consumer runs:

- failed token authentications count per client address together with REST's
  (``AGENTRUN_TOKEN_FAILURE_RATE``); past the limit a token is not even looked up (the socket is
  anonymous, so refused as any anonymous one);
- a person has at most ``AGENTRUN_WS_MAX_PER_USER`` sockets open on one web process; one more is
  accepted and closed at once with code ``4029`` ("too many open websockets").
"""

from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import parse_qs

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from channels.security.websocket import AllowedHostsOriginValidator
from django.conf import settings

from agentrun.api.authentication import token_failures
from agentrun.core.throttle import client_address

TOO_MANY_SOCKETS = 4029


@database_sync_to_async
def _user_for_token(key: str) -> Any:
    from rest_framework.authtoken.models import Token

    token = Token.objects.select_related("user").filter(key=key).first()
    return token.user if token is not None and token.user.is_active else None


def _client_address(scope: dict) -> str:
    meta = {"REMOTE_ADDR": (scope.get("client") or [""])[0]}
    for name, value in scope.get("headers", []):
        if name == b"x-forwarded-for":
            meta["HTTP_X_FORWARDED_FOR"] = value.decode("latin-1")
    return client_address(meta)


def token_of(scope: dict) -> str | None:
    """The key a handshake offers: ``Authorization: Token|Bearer <key>``, else ``?token=<key>``."""
    key = None
    for name, value in scope.get("headers", []):
        keyword, _, rest = value.partition(b" ")
        if name == b"authorization" and keyword.lower() in (b"token", b"bearer"):
            key = rest.decode("latin-1").strip()
    if key is None:
        key = (parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token") or [None])[0]
    return key or None


class OriginCheck:
    """docs/api.md#websockets: a handshake with an ``Origin`` must name an allowed host (Channels'
    ``AllowedHostsOriginValidator``); one without needs a token, and only the token authenticates it.

    Every browser sends ``Origin`` on a websocket handshake, so its absence means a program (Python
    ``websockets``, a Node service), which no other site's page can drive: the origin check protects a
    browser's cookie and has nothing to protect there. The cookie of such a handshake is dropped, so a
    program without a token is anonymous and refused as one; a cookie alone without ``Origin`` is
    refused at the handshake as before.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.browsers = AllowedHostsOriginValidator(inner)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        headers = scope.get("headers", [])
        if scope.get("type") == "websocket" and token_of(scope) and not any(n == b"origin" for n, _ in headers):
            scope = dict(scope, headers=[(n, v) for n, v in headers if n != b"cookie"])
            return await self.inner(scope, receive, send)
        return await self.browsers(scope, receive, send)


class TokenAuthMiddleware(BaseMiddleware):
    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        if key := token_of(scope):
            address, limit = _client_address(scope), token_failures()
            user = None if limit.wait(address) is not None else await _user_for_token(key)
            if user is not None:
                scope = dict(scope, user=user)
            else:
                limit.hit(address)
        return await super().__call__(scope, receive, send)


class SocketCap(BaseMiddleware):
    """At most ``AGENTRUN_WS_MAX_PER_USER`` open sockets per person in this process (the event loop's
    thread is the only one counting: no lock)."""

    open_sockets: Counter = Counter()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        user = scope.get("user")
        if scope.get("type") != "websocket" or not getattr(user, "is_authenticated", False):
            return await super().__call__(scope, receive, send)
        cap = settings.AGENTRUN_WS_MAX_PER_USER
        if cap and self.open_sockets[user.pk] >= cap:
            await receive()  # the handshake: accepted only to say why it closes
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": TOO_MANY_SOCKETS, "reason": "too many open websockets"})
            return None
        self.open_sockets[user.pk] += 1
        try:
            return await super().__call__(scope, receive, send)
        finally:
            self.open_sockets[user.pk] -= 1
            if not self.open_sockets[user.pk]:
                del self.open_sockets[user.pk]


def AuthStack(inner: Any) -> Any:  # noqa: N802 - reads like Channels' own AuthMiddlewareStack
    # Session first, then a token (when given) replaces the anonymous user; then the per-person cap.
    return AuthMiddlewareStack(TokenAuthMiddleware(SocketCap(inner)))

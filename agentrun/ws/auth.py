"""Websocket authentication: the session cookie, ``Authorization: Token <key>`` (or ``Bearer <key>``), or
``?token=<key>``."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware


@database_sync_to_async
def _user_for_token(key: str) -> Any:
    from rest_framework.authtoken.models import Token

    token = Token.objects.select_related("user").filter(key=key).first()
    return token.user if token is not None and token.user.is_active else None


class TokenAuthMiddleware(BaseMiddleware):
    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        key = None
        for name, value in scope.get("headers", []):
            keyword, _, rest = value.partition(b" ")
            if name == b"authorization" and keyword.lower() in (b"token", b"bearer"):
                key = rest.decode("latin-1").strip()
        if key is None:
            key = (parse_qs(scope.get("query_string", b"").decode()).get("token") or [None])[0]
        if key:
            user = await _user_for_token(key)
            if user is not None:
                scope = dict(scope, user=user)
        return await super().__call__(scope, receive, send)


def AuthStack(inner: Any) -> Any:  # noqa: N802 - reads like Channels' own AuthMiddlewareStack
    # Session first, then a token (when given) replaces the anonymous user.
    return AuthMiddlewareStack(TokenAuthMiddleware(inner))

"""ASGI entry point: HTTP (Django, static files) and websockets (Channels)."""

from __future__ import annotations

import asyncio
import os
from contextlib import closing
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")

import django  # noqa: E402

django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application does

from asgiref.sync import iscoroutinefunction, sync_to_async  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core import signals  # noqa: E402
from django.core.exceptions import RequestAborted  # noqa: E402
from django.core.handlers.asgi import ASGIHandler, get_script_prefix  # noqa: E402
from django.http import FileResponse  # noqa: E402
from django.urls import Resolver404, get_resolver, set_script_prefix  # noqa: E402

from agentrun.engine import runtime, sweeper  # noqa: E402
from agentrun.routing import websocket_urlpatterns  # noqa: E402
from agentrun.ws.auth import AuthStack, OriginCheck  # noqa: E402
from agentrun.ws.consumers import OutageGuard  # noqa: E402
from agentrun.ws.observed import count_websockets  # noqa: E402


class OneHopASGIHandler(ASGIHandler):
    """Django's ASGI handler, with a request for a sync view served in one hop to the sync thread.

    Under ASGI Django runs its middleware in async mode: each ``MiddlewareMixin`` method
    (``process_request``, ``process_response``…) of each of the ten middlewares is a hop of its own to the
    thread that runs sync code (``sync_to_async``), the sync view one more, and the ``request_started``
    signal and the response's ``close()`` (``request_finished``: database connections back to the pool) one
    each: some fifteen thread handoffs for one ``GET /api/agents/``, which on two busy cores cost several
    milliseconds (docs/performance.md#request-floor-unpaged-listing-date-totals-third-pass).

    Every REST view is sync (DRF), so here a request for a sync view is served by one call on that thread:
    ``request_started``, the middleware chain as WSGI runs it (every middleware and the view), and — for a
    response that is not streamed, whose body is already in memory — its ``close()``, before the bytes are
    sent. A streamed response is closed after its last byte, as Django does. A request for an async view
    (``/healthz``, ``/readyz``: they answer while the database is away, so they must not wait for the sync
    thread) goes through Django's own handler, unchanged. The rest is Django's ``ASGIHandler``: reading the
    body, watching for the client's disconnect, sending the response.
    """

    def __init__(self) -> None:
        super().__init__()
        self._async_views = ASGIHandler()  # Django's own (async middleware chain), for async views

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)  # the chain WSGI runs

    async def handle(self, scope: dict, receive: Any, send: Any) -> None:
        if _async_view(scope):
            return await self._async_views.handle(scope, receive, send)
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        with closing(body_file):
            set_script_prefix(get_script_prefix(scope))

            def serve() -> tuple[Any, bool]:
                """The response, and whether it is closed already."""
                signals.request_started.send(sender=self.__class__, scope=scope)
                request, response = self.create_request(scope, body_file)
                if request is not None:
                    response = self.get_response(request)
                    response._handler_class = self.__class__
                    if isinstance(response, FileResponse):
                        response.block_size = self.chunk_size
                if response.streaming:
                    return response, False
                response.close()
                return response, True

            class RequestProcessed(Exception):
                pass

            response, closed = None, False
            try:
                try:
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self.listen_for_disconnect(receive))
                        response, closed = await sync_to_async(serve, thread_sensitive=True)()
                        await self.send_response(response, send)
                        raise RequestProcessed
                except* (RequestProcessed, RequestAborted):
                    pass
            except BaseExceptionGroup as group:
                if len(group.exceptions) == 1:
                    raise group.exceptions[0] from None
                raise
            if response is None:
                await signals.request_finished.asend(sender=self.__class__)
            elif not closed:
                await sync_to_async(response.close)()


def _async_view(scope: dict) -> bool:
    path, root = scope["path"], scope.get("root_path", "")
    try:
        match = get_resolver().resolve(path.removeprefix(root) if root else path)
    except Resolver404:
        return False
    return iscoroutinefunction(match.func)


# Django's ASGI handler, a request for a sync view in one hop to the sync thread (above).
django_asgi = OneHopASGIHandler()

router = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_asgi),
        # The guard outside the authentication: checking a user needs the database too. The origin
        # check lets a handshake without Origin through only with a token (docs/api.md#websockets).
        "websocket": count_websockets(OriginCheck(OutageGuard(AuthStack(URLRouter(websocket_urlpatterns))))),
    }
)


async def application(scope, receive, send):  # noqa: ANN001, ANN201 - the ASGI signature
    # Runs dispatched from sync views execute on this loop (see agentrun.engine.runtime); on the embedded
    # default the server sweeps too (production leaves that to the workers).
    loop = asyncio.get_running_loop()
    if runtime.bind_loop(loop) and settings.AGENTRUN_EMBEDDED_SWEEPER:
        runtime.keep(loop.create_task(sweeper.run_forever()))
    return await router(scope, receive, send)

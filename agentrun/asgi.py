"""ASGI entry point: HTTP (Django, static files) and websockets (Channels)."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")

import django  # noqa: E402

django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application does

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, sync_to_async  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core import signals  # noqa: E402
from django.core.exceptions import RequestAborted  # noqa: E402
from django.core.handlers.asgi import ASGIHandler, get_script_prefix  # noqa: E402
from django.http import FileResponse  # noqa: E402
from django.urls import Resolver404, ResolverMatch, get_resolver, set_script_prefix  # noqa: E402

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

    Each request's sync code runs on a thread of its own, as under Django's handler, but the thread is
    lent from a few kept between requests (``RequestThreads``) instead of started for the request and
    joined by yet another thread after it: two thread starts per request, a few milliseconds on two
    busy cores. A request that the client leaves while its view runs waits for the view to finish, then
    closes what it answered, so that a thread is lent again only with nothing of a request left on it.
    Only a streamed answer is sent while watching for the client leaving: an answer in memory is sent
    at once (the view's thread was not cancellable anyway).
    """

    def __init__(self) -> None:
        super().__init__()
        self._async_views = ASGIHandler()  # Django's own (async middleware chain), for async views
        self.threads = RequestThreads()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor, done = self.threads.lend(), False
        try:
            # Every thread-sensitive call of the request (the view, a stream's batches, close()) on it.
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
            done = True
        finally:
            self.threads.take_back(executor, reusable=done)

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)  # the chain WSGI runs

    def resolve_request(self, request: Any) -> Any:
        """The match ``handle`` found already for this request's path (one URL resolution a request,
        not three: here, ``RequestObservation`` and Django's handler), else Django's resolution."""
        match = getattr(request, "_resolved_early", None)
        if match is not None and match is request.resolver_match and not hasattr(request, "urlconf"):
            return match
        return super().resolve_request(request)

    async def handle(self, scope: dict, receive: Any, send: Any) -> None:
        path, match = _resolve(scope)
        if match is not None and iscoroutinefunction(match.func):
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
                if request is not None and match is not None and request.path_info == path:
                    request.resolver_match = request._resolved_early = match
                if request is not None:
                    response = self.get_response(request)
                    response._handler_class = self.__class__
                    if isinstance(response, FileResponse):
                        response.block_size = self.chunk_size
                if response.streaming:
                    return response, False
                response.close()
                return response, True

            # The view runs to its end on its thread whatever the client does (a thread cannot be
            # cancelled), so nothing watches for the client leaving meanwhile.
            response, closed = await sync_to_async(serve, thread_sensitive=True)()
            if closed:
                # A body in memory, closed already (request_finished sent): sent as it is. To a client
                # that left, the server sends nothing.
                await self.send_response(response, send)
                return
            # A stream: sent while watching for the client leaving, then closed (its cursor and its
            # transaction end) on the request's thread, before the thread serves anyone else.
            try:
                try:
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self.listen_for_disconnect(receive))
                        await self.send_response(response, send)
                        raise RequestProcessed
                except* (RequestProcessed, RequestAborted):
                    pass
            except BaseExceptionGroup as group:
                if len(group.exceptions) == 1:
                    raise group.exceptions[0] from None
                raise
            finally:
                await sync_to_async(response.close)()


class RequestProcessed(Exception):
    """Ends ``handle``'s task group once the response is sent (the disconnect listener with it)."""


class RequestThreads:
    """Single-thread executors lent to requests, one each, and kept for the next ones (at most ``KEEP``
    idle). ``take_back(reusable=False)`` (the request ended with an error or was cancelled) lets the
    thread end once its work is done instead of lending it again."""

    KEEP = 32

    def __init__(self) -> None:
        self._idle: list[ThreadPoolExecutor] = []
        self._lock = threading.Lock()

    def lend(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")

    def take_back(self, executor: ThreadPoolExecutor, *, reusable: bool) -> None:
        with self._lock:
            if reusable and len(self._idle) < self.KEEP:
                self._idle.append(executor)
                return
        executor.shutdown(wait=False)


def _resolve(scope: dict) -> tuple[str, ResolverMatch | None]:
    """The request's path (as Django's ``path_info``) and the view it names (None: no route)."""
    path, root = scope["path"], get_script_prefix(scope)
    path = path.removeprefix(root) if root else path
    try:
        return path, get_resolver().resolve(path)
    except Resolver404:
        return path, None


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

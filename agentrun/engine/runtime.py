"""Where server-side coroutines run: the event loop of the ASGI server, whatever thread asks.

A sync view (DRF, a form post) runs in a worker thread; the run it dispatches must run on the
server's loop so it shares the channel layer with the websockets and outlives the request.
Outside a server (a script, a management command) a private loop in a daemon thread is used.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

_bound: asyncio.AbstractEventLoop | None = None
_private: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()
_tasks: set[asyncio.Task] = set()


def bind_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Called by the ASGI application: remember the server's loop, and sweep on it (embedded default)."""
    global _bound
    if _bound is loop:
        return
    _bound = loop
    from django.conf import settings

    if settings.AGENTRUN_EMBEDDED_SWEEPER:
        from agentrun.engine.sweeper import run_forever

        _keep(loop.create_task(run_forever()))


def _private_loop() -> asyncio.AbstractEventLoop:
    global _private
    with _lock:
        if _private is None or not _private.is_running():
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            threading.Thread(target=serve, name="agentrun-engine", daemon=True).start()
            started.wait()
            _private = loop
        return _private


def _keep(task: asyncio.Task) -> None:
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


def submit(coro: Coroutine[Any, Any, Any]) -> None:
    """Run ``coro`` in the background, on the current loop, the server's loop, or a private one."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        _keep(loop.create_task(coro))
        return
    target = _bound if _bound is not None and _bound.is_running() and not _bound.is_closed() else _private_loop()

    async def wrapper() -> Any:
        _keep(asyncio.current_task())  # type: ignore[arg-type]
        return await coro

    asyncio.run_coroutine_threadsafe(wrapper(), target)

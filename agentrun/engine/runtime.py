"""Where the engine's work runs: database calls in asgiref's thread, coroutines on the right event loop.

``db(fn)`` is how async engine code calls the ORM. It also remembers the calling event loop, so that
work ``fn`` hands to the in-process task runner (a continuation enqueued by a decision) runs on the
loop of the caller — a script's, a test's, or the ASGI server's — and shares its channel layer.

``submit(coro)`` runs a coroutine in the background: on the current loop, the loop that called
``db()``, the server's loop (a sync view under ASGI), or a private loop in a daemon thread (a
management command); ``submit(coro, detached=True)`` skips the first two, for work that must outlive a
script's loop. It imports nothing from the engine.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

_bound: asyncio.AbstractEventLoop | None = None
_private: asyncio.AbstractEventLoop | None = None
_caller_loop: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "agentrun_caller_loop", default=None
)
_lock = threading.Lock()
_tasks: set[asyncio.Task] = set()


def db(fn: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
    """``fn`` (sync, touching the database) as a coroutine function, in asgiref's database thread."""
    run_sync = sync_to_async(fn, thread_sensitive=True)

    async def call(*args: Any, **kwargs: Any) -> Any:
        # asgiref runs ``fn`` in a copy of this context: submit() finds the loop there.
        token = _caller_loop.set(asyncio.get_running_loop())
        try:
            return await run_sync(*args, **kwargs)
        finally:
            _caller_loop.reset(token)

    return call


def bind_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Called by the ASGI application: remember the server's loop. True the first time for this loop."""
    global _bound
    if _bound is loop:
        return False
    _bound = loop
    return True


def _usable(loop: asyncio.AbstractEventLoop | None) -> bool:
    return loop is not None and loop.is_running() and not loop.is_closed()


def _private_loop() -> asyncio.AbstractEventLoop:
    global _private
    with _lock:
        if not _usable(_private):
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            threading.Thread(target=serve, name="agentrun-engine", daemon=True).start()
            started.wait()
            _private = loop
        return _private  # type: ignore[return-value]


def keep(task: asyncio.Task) -> asyncio.Task:
    """Hold a strong reference to a background task until it ends (the loop only keeps weak ones)."""
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return task


def submit(coro: Coroutine[Any, Any, Any], *, detached: bool = False) -> asyncio.AbstractEventLoop:
    """Run ``coro`` in the background, on the best loop for it (see the module docstring); that loop.

    ``detached``: work that must outlive its caller's loop and shares nothing with it (the
    notifications queue's tasks) runs on the server's loop or on the private one, never on a script's
    or a test's loop — that loop ends when its ``asyncio.run`` does, and cancels what was left on it.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None and (not detached or loop is _bound):
        keep(loop.create_task(coro))
        return loop
    caller = None if detached else _caller_loop.get()
    target: asyncio.AbstractEventLoop
    if caller is not None and _usable(caller):
        target = caller
    elif _bound is not None and _usable(_bound):
        target = _bound
    else:
        target = _private_loop()

    def launch() -> None:
        # A fresh context: the caller's (a thread inside sync_to_async) would make every database call
        # of the coroutine refuse to run ("would deadlock"), and the work outlives the caller anyway.
        keep(target.create_task(coro, context=contextvars.Context()))

    target.call_soon_threadsafe(launch, context=contextvars.Context())
    return target


def recover_connection() -> None:
    """Drop this thread's database connection if an error broke it (a database restart, say).

    Django does this in ``close_old_connections`` at the edges of requests and tasks only; the engine's
    long-lived threads (the sweeper, segments driven outside a request) call this instead. It leaves
    a healthy connection and an open transaction alone, so it is safe anywhere, tests included.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.errors_occurred and not conn.in_atomic_block:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                conn.close()

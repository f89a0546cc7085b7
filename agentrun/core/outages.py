"""The services every process depends on — the database and the channel layer (Redis) — going away and
coming back (docs/operations.md, "Outages").

Infrastructure errors are those of the services, never of a run, a tool or a request: the engine does
not record them as a tool's result or a run's failure (the run is continued once the service is back),
and the doors answer them with 503 / a close code a client can act on. They are:

- the database: ``django.db.OperationalError`` (a refused or dropped connection, a server shutting down
  or starting up, a deadlock or serialization failure, no pooled connection within the pool's timeout)
  and ``django.db.InterfaceError`` (a connection already closed), and psycopg's own
  ``OperationalError`` where psycopg is used directly;
- the channel layer: ``redis.exceptions.ConnectionError`` (refused, reset, closed) and
  ``redis.exceptions.TimeoutError``.

A tool that uses a database or Redis of its own and wants their errors to be its result catches them.

Each process logs one warning when a service becomes unreachable and one line when it answers again,
with how long it was away and how many operations failed meanwhile (``Dependency``), instead of a
traceback per operation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import psycopg
from django.db import InterfaceError, OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agentrun.core.errors import AgentRunError

logger = logging.getLogger("agentrun.outages")

DATABASE_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError, psycopg.OperationalError)
CHANNEL_LAYER_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError)
INFRASTRUCTURE_ERRORS = DATABASE_ERRORS + CHANNEL_LAYER_ERRORS

# What a client is told to wait before trying again (503 ``Retry-After``, close reasons): a database
# restart takes about a second, a Redis restart a few.
RETRY_AFTER_SECONDS = 2
# How often psycopg's pool tries to replace the connections an outage killed (``tune_database_pool``).
POOL_RECONNECT_SECONDS = 0.5


class Dependency:
    """One service as this process sees it: reachable, or down since the first failure of an outage."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.down_since: float | None = None
        self.failures = 0
        self._lock = threading.Lock()
        self._listeners: set[Callable[[], None]] = set()

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, exc: BaseException) -> None:
        """An operation failed on this service: the first failure of an outage is logged (a warning,
        no traceback) and told to the listeners; the others are counted."""
        with self._lock:
            self.failures += 1
            if self.down_since is not None:
                return
            self.down_since = time.monotonic()
            listeners = list(self._listeners)
        logger.warning("%s unreachable: %s: %s", self.name, type(exc).__name__, str(exc).strip()[:300])
        for listener in listeners:
            try:
                listener()
            except Exception:  # a listener gone stale (its event loop closed) must not fail the caller
                logger.debug("an outage listener failed", exc_info=True)

    def reached(self) -> None:
        """An operation succeeded on this service: if it was down, say how long and what it cost."""
        if self.down_since is None:  # the common case, without the lock
            return
        with self._lock:
            if self.down_since is None:
                return
            seconds, failures = time.monotonic() - self.down_since, self.failures
            self.down_since, self.failures = None, 0
        logger.warning("%s reachable again after %.1f s (%d operations failed meanwhile)", self.name, seconds, failures)

    def on_down(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` (from any thread) when the service becomes unreachable; returns the undo."""
        with self._lock:
            self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)


database = Dependency("database")
channel_layer = Dependency("channel layer")


def failed(exc: BaseException) -> Dependency | None:
    """Record ``exc`` against its service; None when it is not an infrastructure error."""
    dependency = (
        database
        if isinstance(exc, DATABASE_ERRORS)
        else channel_layer
        if isinstance(exc, CHANNEL_LAYER_ERRORS)
        else None
    )
    if dependency is not None:
        dependency.failed(exc)
    return dependency


def unavailable(exc: BaseException, **details: object) -> AgentRunError:
    """The contract's error for an infrastructure error (503 ``SERVICE_UNAVAILABLE``), recorded."""
    dependency = failed(exc) or database
    message = f"The {dependency.name} is unreachable; try again in {RETRY_AFTER_SECONDS} s."
    return AgentRunError("SERVICE_UNAVAILABLE", message, details=details or None)


def counted(response: object) -> object:
    """Mark a 503 answered for an outage as logged: the outage has its one warning (``Dependency``), so
    Django does not log a "Service Unavailable" line per request (its ``log_response`` checks this)."""
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def database_connected(**kwargs: object) -> None:
    """``connection_created`` receiver: a new database connection means the database answers."""
    database.reached()


def tune_database_pool() -> None:
    """psycopg's pool waits 1 s, then 2, 4, 8 s… between its attempts to replace the connections an
    outage killed, so a process saw a database restarted in under a second only 3 to 15 s later
    (/healthz included). It tries every ``POOL_RECONNECT_SECONDS`` instead: whole again within a second
    of the database answering. (The pool takes no option for this; its attempts read these.)"""
    from psycopg_pool.base import AttemptWithBackoff

    AttemptWithBackoff.INITIAL_DELAY = POOL_RECONNECT_SECONDS
    AttemptWithBackoff.DELAY_BACKOFF = 1.0


class OutageLogFilter(logging.Filter):
    """Libraries log each failed operation while a service is away: channels_redis's receive loop a
    traceback a second ("Unexpected exception in receive task"), psycopg's pool a warning per connection
    attempt and per connection found dead. Those become the service's failures (one warning per outage,
    ``Dependency``); other records pass."""

    DEAD_CONNECTION = ("discarding broken connection", "discarding closed connection")

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None and isinstance(record.args, tuple):
            exc = next((a for a in record.args if isinstance(a, BaseException)), None)
        if exc is not None and failed(exc) is not None:
            return False
        # A pooled connection an outage killed, found at hand-out and replaced: nothing to act on.
        return not (record.name == "psycopg.pool" and str(record.msg).startswith(self.DEAD_CONNECTION))


def watch_libraries() -> None:
    """At start-up (core/apps.py): the libraries' outage logs are counted, the pool reconnects fast."""
    for name in ("channels_redis.pubsub", "psycopg.pool"):
        logging.getLogger(name).addFilter(OutageLogFilter())
    tune_database_pool()

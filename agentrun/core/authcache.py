"""Who a request is, remembered for a few seconds: a token's user, a person's permissions and groups.

Every REST request, websocket and page used to read them from the database (a token query, a
permission query, a group query when agents are restricted:
docs/performance.md#request-floor-unpaged-listing-date-totals-third-pass). Here each process keeps
them for ``AGENTRUN_AUTH_CACHE_SECONDS`` (5 s by default; 0 turns it off), and forgets *everything* it
keeps whenever anything that decides them changes (docs/security.md#cached-identities):

- a token saved or deleted (revoked, rotated), a user saved or deleted (deactivated, made or unmade a
  superuser), a group saved or deleted (renamed: the agent scope goes by group names), a permission saved
  or deleted; a person added to or removed from a group, a permission given to or taken from a person or
  a group (``m2m_changed``); ``AGENTRUN_AGENT_REVIEWERS`` or this setting changed (``setting_changed``).

In the process that makes the change this takes effect at once: the signal clears the cache in the
same call, and again when the transaction commits, and a lookup that began before either cannot store
what it read (each lookup notes the cache's generation before it reads and stores only if no clear
happened meanwhile: a read racing a change, or made before the change committed, is dropped). Other
processes learn of it when their entries expire, within the TTL. Changes that send no signal (a
``QuerySet.update`` of users, raw SQL) also take effect within the TTL, everywhere.

Nothing failed is remembered: an unknown token is looked up every time, and counted by the failed-token
limit (``agentrun.api.authentication``). Entries are the values read, never objects handed to a request:
each request gets its own copies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction

_MAX_ENTRIES = 10_000  # past this many, the cache starts again empty (a flood of distinct tokens)


class _Cache:
    def __init__(self) -> None:
        self._entries: dict[Any, tuple[float, Any]] = {}
        self._generation = 0
        self._lock = threading.Lock()

    def get(self, key: Any) -> tuple[Any, int]:
        """The fresh value under ``key`` (None: none), and the generation to ``put`` a value read now with."""
        generation = self._generation
        entry = self._entries.get(key)
        if entry is not None and entry[0] > time.monotonic():
            return entry[1], generation
        return None, generation

    def put(self, key: Any, value: Any, generation: int) -> None:
        """Keep ``value`` (read after ``get`` gave ``generation``) unless the cache was cleared since."""
        ttl = seconds()
        if value is None or ttl <= 0 or key is None:
            return
        with self._lock:
            if generation == self._generation:
                if len(self._entries) >= _MAX_ENTRIES:
                    self._entries.clear()
                self._entries[key] = (time.monotonic() + ttl, value)

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._entries.clear()


_cache = _Cache()


def seconds() -> float:
    return float(getattr(settings, "AGENTRUN_AUTH_CACHE_SECONDS", 0) or 0)


def cached(key: Any, load: Callable[[], Any]) -> Any:
    """``load()``'s value for ``key`` (a tuple naming what it is), from this process's cache when fresh."""
    value, generation = _cache.get(key)
    if value is None:
        value = load()
        _cache.put(key, value, generation)
    return value


def get(key: Any) -> tuple[Any, int]:
    """For async readers: the fresh value (None: none) and the generation to ``put`` what they read with."""
    return _cache.get(key)


def put(key: Any, value: Any, generation: int) -> None:
    _cache.put(key, value, generation)


def forget_all(**_: Any) -> None:
    """Forget every identity this process keeps, now and once the current transaction commits (so that
    nothing read before the commit is kept after it)."""
    _cache.clear()
    transaction.on_commit(_cache.clear)


def _on_setting_changed(setting: str, **_: Any) -> None:
    if setting in ("AGENTRUN_AGENT_REVIEWERS", "AGENTRUN_AUTH_CACHE_SECONDS", "AUTHENTICATION_BACKENDS"):
        _cache.clear()


def connect_signals() -> None:
    """What invalidates (the module's docstring); called from ``CoreConfig.ready``."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission
    from django.core.signals import setting_changed
    from django.db.models.signals import m2m_changed, post_delete, post_save
    from rest_framework.authtoken.models import Token

    user = get_user_model()
    for model in (Token, user, Group, Permission):
        for name, signal in (("saved", post_save), ("deleted", post_delete)):
            signal.connect(forget_all, sender=model, dispatch_uid=f"agentrun.authcache.{name}.{model.__name__}")
    for through in (user.groups.through, user.user_permissions.through, Group.permissions.through):
        m2m_changed.connect(forget_all, sender=through, dispatch_uid=f"agentrun.authcache.m2m.{through.__name__}")
    setting_changed.connect(_on_setting_changed, dispatch_uid="agentrun.authcache.settings")

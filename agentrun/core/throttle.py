"""Rate limits kept in Django's cache, shared by every process that shares the cache (Redis in
production, this process's memory in the embedded default), and the client's address they key on.

One mechanism for every limit (docs/security.md, "Throttling"): failed token authentications per
client address (REST and websockets, checked *before* a token is looked up), API use per person, password
reset requests. Each is a sliding-window counter: two integer counters per key (this window's and the
previous one's, the latter weighted by how much of it still overlaps the last ``period`` seconds), so a
check and a hit are one cache round trip each whatever the rate, and a burst across a window's edge is
still counted. Logins are django-axes' (kept in the database, per account and per address).

A cache that cannot be reached lets requests through (logged): a limit is a brake, not a gate, and an
outage of Redis must not lock everyone out.

Also here: ``SharedRedisCache``, the cache backend these counters are read through (``CACHES``).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from django.utils.functional import cached_property

logger = logging.getLogger("agentrun.throttle")

_clients: dict[tuple[str, ...], Any] = {}
_clients_lock = threading.Lock()


class SharedRedisCache(RedisCache):
    """Django's Redis cache with one client, and so one connection pool, per process (``CACHES``).

    Django keeps a cache object per thread and per asynchronous context, and each ``RedisCache`` object
    makes its own client with its own connection pool. Under ASGI every request runs in a context of its
    own, so every request made a new pool and opened a new TCP connection to Redis for its first cache
    call (the API throttle, the failed-token check): one connection per request, the largest share of the
    request floor on a busy machine (docs/performance.md#request-floor-unpaged-listing-date-totals-third-pass).
    Here the cache objects of a process with the same servers and options share one client, whose pool
    keeps its connections open between requests (redis-py's pools are thread-safe, and start again
    empty in a forked child)."""

    @cached_property
    def _cache(self) -> Any:
        own = vars(self)  # RedisCache's attributes (not in its type stubs)
        servers, options = own["_servers"], own["_options"]
        key = (*servers, repr(sorted(options.items())))
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = own["_class"](servers, **options)
        return client


_PERIODS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600, "d": 86400}


def parse_rate(rate: str | None) -> tuple[int, int] | None:
    """``"30/minute"`` → (30, 60); ``None``, ``""`` or ``"off"`` → None (no limit)."""
    if not rate or rate.strip().lower() in {"off", "none", "0"}:
        return None
    count, _, period = rate.strip().partition("/")
    try:
        return int(count), _PERIODS[period.strip().lower()]
    except (KeyError, ValueError):
        raise ValueError(f"a rate is N/second|minute|hour|day, not {rate!r}") from None


@dataclass(frozen=True)
class RateLimit:
    """At most ``rate`` events per key (``"30/minute"``; None or "off": unlimited)."""

    name: str
    rate: str | None

    def _keys(self, key: str, now: float) -> tuple[str, str, float, int]:
        limit = parse_rate(self.rate)
        assert limit is not None
        period = limit[1]
        window = int(now // period)
        elapsed = (now - window * period) / period  # how far into this window
        base = f"agentrun:throttle:{self.name}:{key}"
        return f"{base}:{window}", f"{base}:{window - 1}", elapsed, period

    def wait(self, key: str) -> float | None:
        """Seconds to wait before the next event is allowed, or None if it is allowed now."""
        limit = parse_rate(self.rate)
        if limit is None:
            return None
        count, period = limit
        now = time.time()
        current, previous, elapsed, _ = self._keys(key, now)
        try:
            counts = cache.get_many([current, previous])
        except Exception as exc:  # the cache is down: let it through
            logger.warning("throttle %s: the cache cannot be read (%s); not limiting", self.name, exc)
            return None
        return _wait_for(counts.get(current, 0), counts.get(previous, 0), elapsed, count, period)

    def hit(self, key: str) -> None:
        """Count one event."""
        if parse_rate(self.rate) is None:
            return
        current, _, _, period = self._keys(key, time.time())
        try:
            if not cache.add(current, 1, timeout=2 * period):
                cache.incr(current)
        except ValueError:  # expired between add and incr
            cache.add(current, 1, timeout=2 * period)
        except Exception as exc:
            logger.warning("throttle %s: the cache cannot be written (%s); not counting", self.name, exc)

    def take_back(self, key: str) -> None:
        """Uncount one event counted in this window (``hit`` undone)."""
        if parse_rate(self.rate) is None:
            return
        current, _, _, _ = self._keys(key, time.time())
        try:
            cache.decr(current)
        except ValueError:  # the window ended meanwhile: its count goes with it
            pass
        except Exception as exc:
            logger.warning("throttle %s: the cache cannot be written (%s); not uncounting", self.name, exc)

    def check_and_hit(self, key: str) -> float | None:
        """Count one event if it is allowed now; else the seconds to wait (nothing counted)."""
        if parse_rate(self.rate) is not None and isinstance(backend := caches["default"], RedisCache):
            return self._check_and_hit_redis(backend, key)
        wait = self.wait(key)
        if wait is None:
            self.hit(key)
        return wait

    def _check_and_hit_redis(self, backend: RedisCache, key: str) -> float | None:
        """``check_and_hit`` in one round trip (every API request pays it:
        docs/performance.md#request-floor-unpaged-listing-date-totals-third-pass):
        count the event and read both windows at once, and take the count back when refused."""
        limit = parse_rate(self.rate)
        assert limit is not None
        count, period = limit
        current, previous, elapsed, _ = self._keys(key, time.time())
        current, previous = backend.make_and_validate_key(current), backend.make_and_validate_key(previous)
        try:
            client = backend._cache.get_client(current, write=True)
            pipe = client.pipeline(transaction=False)
            pipe.incr(current)
            pipe.expire(current, 2 * period)
            pipe.get(previous)
            this, _, last = pipe.execute()
            wait = _wait_for(this - 1, int(last or 0), elapsed, count, period)
            if wait is not None:
                client.decr(current)
        except Exception as exc:
            logger.warning("throttle %s: the cache cannot be used (%s); not limiting", self.name, exc)
            return None
        return wait


def wait_then_count(
    check: tuple[RateLimit, str], count: tuple[RateLimit, str]
) -> tuple[float | None, float | None] | None:
    """``check``'s ``wait`` and then, only if it allows, ``count``'s ``check_and_hit``, in one Redis round
    trip instead of two: (the first's wait, the second's wait — None when the first refused, nothing
    counted then). A cached token's request pays this, its failed-token check and its API count
    together (docs/performance.md#request-floor-unpaged-listing-date-totals-third-pass). None (nothing
    read, nothing counted) when the cache is not Redis or a limit is off: the caller takes the two steps
    one after the other. A cache that cannot be used lets the request through: (None, None)."""
    (first, first_key), (second, second_key) = check, count
    first_rate, second_rate = parse_rate(first.rate), parse_rate(second.rate)
    if first_rate is None or second_rate is None or not isinstance(backend := caches["default"], RedisCache):
        return None
    now = time.time()
    f_current, f_previous, f_elapsed, _ = first._keys(first_key, now)
    s_current, s_previous, s_elapsed, _ = second._keys(second_key, now)
    f_current, f_previous, s_current, s_previous = (
        backend.make_and_validate_key(key) for key in (f_current, f_previous, s_current, s_previous)
    )
    try:
        client = backend._cache.get_client(s_current, write=True)
        pipe = client.pipeline(transaction=False)
        pipe.get(f_current)
        pipe.get(f_previous)
        pipe.incr(s_current)
        pipe.expire(s_current, 2 * second_rate[1])
        pipe.get(s_previous)
        failed_now, failed_before, this, _, last = pipe.execute()
        refused = _wait_for(int(failed_now or 0), int(failed_before or 0), f_elapsed, *first_rate)
        if refused is not None:
            client.decr(s_current)
            return refused, None
        wait = _wait_for(this - 1, int(last or 0), s_elapsed, *second_rate)
        if wait is not None:
            client.decr(s_current)
    except Exception as exc:  # the cache is down: let it through, as each limit alone does
        logger.warning("throttle %s/%s: the cache cannot be used (%s); not limiting", first.name, second.name, exc)
        return None, None
    return None, wait


def _wait_for(this: int, last: int, elapsed: float, count: int, period: int) -> float | None:
    """The sliding window's answer: None if one more event is allowed with ``this`` window's and the
    ``last`` one's counts, ``elapsed`` (a fraction) into this window; else the seconds to wait."""
    if this + last * (1 - elapsed) < count:
        return None
    # Allowed again once the previous window's share has faded enough, or this window ends.
    if this >= count:
        return max(1.0, (1 - elapsed) * period)
    needed = 1 - (count - this) / last  # the elapsed fraction at which the weighted sum drops below count
    return max(1.0, (needed - elapsed) * period)


def retry_after(wait: float) -> str:
    """The ``Retry-After`` header's value: whole seconds, rounded up."""
    return str(max(1, math.ceil(wait)))


def client_address(meta: dict) -> str:
    """The client's address: ``REMOTE_ADDR``, or — behind ``AGENTRUN_TRUSTED_PROXIES`` proxies that each
    append to ``X-Forwarded-For`` — the entry that many places from its right end. Only what the
    trusted proxies wrote is believed: a client cannot pick its address by sending the header itself."""
    remote = meta.get("REMOTE_ADDR") or ""
    proxies = settings.AGENTRUN_TRUSTED_PROXIES
    if proxies and (forwarded := meta.get("HTTP_X_FORWARDED_FOR")):
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        if len(hops) >= proxies:
            remote = hops[-proxies]
    try:
        return str(ipaddress.ip_address(remote))
    except ValueError:
        return remote[:64] or "unknown"


def axes_client_address(request: object) -> str | None:
    """django-axes' ``AXES_CLIENT_IP_CALLABLE``: the same address every other limit uses (None for a
    request made in-process, such as the test client's ``force_login``: axes stores it as an IP)."""
    address = client_address(getattr(request, "META", {}))
    return None if address == "unknown" else address

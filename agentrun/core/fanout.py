"""The stream fan-out: every chunk of a run reaches every subscriber, in order, once.

Writers: a segment's ``RunPublisher`` sends its chunks to the channel-layer group ``run.<id>`` as they
are produced (batched per event-loop tick, encoded once: the message carries the frames), while
``ChunkLog`` writes them to the database in batches.
Readers: ``subscribe_batches(run_id, after)`` (``subscribe``: one chunk at a time) joins the group first,
then replays the log after ``after``, then yields live chunks. A process is one member of the group per
run (``_RunFeed``) whatever the number of its subscribers: it decodes each message once and hands the
same chunks, with their encodings made once, to all of them, which share their reads of the log and of
the run's state (docs/performance.md "Fan-out (third pass)"). A live chunk ahead of what the log holds
(it was produced before we joined but is not flushed yet) makes it re-read the log until the gap is
filled: no gap, no duplicate.

The log is the truth; a chunk given live is only the driver's word until the log shows it. A driver
that dies leaves chunks it published but never logged, and its taker writes other chunks under those
seqs (README "Production"). A resyncing reader (``resync=True``: ``ws/runs``, SSE) checks every chunk
it gave live against the log as soon as the log holds that seq, and whatever the order in which the
taker's chunks reach it (live, from the log, or not at all); a reader resuming ``after`` a seq checks
that no takeover replaced what its client may hold up to there. Either way: ``SubscriberReset``.

Reviewers' feed: ``notify_approvals`` tells the ``approvals`` group when calls open or are decided.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync, sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import connection
from django.utils import timezone
from django.utils.html import format_html

from agentrun.core import outages, prepared
from agentrun.core.chunks import FeedEvent
from agentrun.core.models import Run, RunChunk

logger = logging.getLogger("agentrun.core.fanout")

APPROVALS_GROUP = "approvals"
GAP_POLL_SECONDS = 0.05
LOG_POLL_SECONDS = 0.25  # following a run from the log alone, while the channel layer is down


class SubscriberBehind(Exception):  # noqa: N818 - a state, not an error of ours
    """The subscriber reads slower than the run produces: more than ``max_lag`` live chunks wait for it.
    It should reconnect after ``resume_after``, the last seq it was given (the log has the rest)."""

    def __init__(self, resume_after: int) -> None:
        super().__init__(f"resume after={resume_after}")
        self.resume_after = resume_after


class SubscriberInterrupted(Exception):  # noqa: N818 - a state, not an error of ours
    """The database stayed unreachable longer than ``OUTAGE_PATIENCE_SECONDS``: the subscriber cannot go
    on. It should reconnect after ``resume_after``, the last seq it was given, once the database is back."""

    def __init__(self, resume_after: int) -> None:
        super().__init__(f"resume after={resume_after}")
        self.resume_after = resume_after


class SubscriberReset(Exception):  # noqa: N818 - a state, not an error of ours
    """A process took the run over after its predecessor died: the chunks this subscriber was given
    after ``resume_after`` were published live but never logged, and the log now holds other chunks
    under those seqs. The subscriber should drop them and resume after ``resume_after``."""

    def __init__(self, resume_after: int) -> None:
        super().__init__(f"resume after={resume_after}")
        self.resume_after = resume_after


# How long a subscriber keeps trying to read the log while the database does not answer (a restart
# takes about a second) before it gives up with SubscriberInterrupted.
OUTAGE_PATIENCE_SECONDS = 5.0
# A resyncing subscriber re-reads the log once this many chunks it gave live wait to be confirmed.
RECENT_CHUNKS = 1024
# ... and waits for a read of the log only when this many wait: below it, the log as this process last
# read it confirms them, and a read for everyone starts in the background (live chunks keep flowing).
UNCONFIRMED_MAX = 4 * RECENT_CHUNKS
# The code of the finish a taker writes for its dead predecessor's segment (engine.loop.TAKEOVER_FINISH).
TAKEOVER_CODE = "driver_lost"
# At most how many chunks a driver publishes that its log does not hold yet: those of one model call
# up to ChunkLog.BATCH (the log is written when full), and a few more. A client resuming after a seq
# this close to a takeover may hold the dead driver's version of the seqs between them.
TAKEOVER_WINDOW = 2 * 200


def _is_takeover(chunk: dict) -> bool:
    return chunk["type"] == "finish" and ((chunk["payload"] or {}).get("error") or {}).get("code") == TAKEOVER_CODE


def _same(a: dict, b: dict) -> bool:
    """The same chunk (``b`` as read from the log, or live). Once per process for a pair of chunks read
    once for all the subscribers here: the answer is kept on ``b``."""
    if isinstance(b, WireChunk) and b.same_as is a:
        return True
    if a["type"] != b["type"]:
        return False
    if a["payload"] != b["payload"] and json.dumps(a["payload"], sort_keys=True, default=str) != json.dumps(
        b["payload"], sort_keys=True, default=str
    ):
        return False
    if isinstance(b, WireChunk):
        b.same_as = a
    return True


def run_group(run_id: str) -> str:
    return f"run.{run_id}"


class RunPublisher:
    """A chunk sink: publishes to ``run.<id>`` without ever blocking or failing the run.

    Each chunk is encoded here, once for the whole run: the message carries the frames (the JSON text
    every ``ws/runs`` socket is sent), and no reading process encodes it again (docs/performance.md
    "Fan-out (third pass)")."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.layer = get_channel_layer()
        self.pending: list[dict] = []
        self.task: asyncio.Task | None = None

    def __call__(self, chunk: dict) -> None:
        if self.layer is None:
            return
        self.pending.append(chunk)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self.pending:
            batch, self.pending = self.pending, []
            try:
                frames = [ws_text(chunk) for chunk in batch]
                await self.layer.group_send(run_group(self.run_id), {"type": "run.frames", "frames": frames})
            except outages.CHANNEL_LAYER_ERRORS as exc:  # subscribers follow the log meanwhile
                outages.channel_layer.failed(exc)
            except Exception:  # a subscriber recovers from the log; the run must not fail for this
                logger.warning("could not publish %d chunks of %s", len(batch), self.run_id, exc_info=True)
            else:
                outages.channel_layer.reached()

    async def aclose(self) -> None:
        while self.task is not None and not self.task.done():
            await self.task


# --- encoded once -----------------------------------------------------------------------------------
class WireChunk(dict):
    """A chunk read by this process (from the channel layer or the log), shared by all its subscribers
    of the run, with its encodings kept: each transport's bytes are made once per process, not once per
    subscriber. Never mutated once made."""

    __slots__ = ("text", "frame", "event", "same_as")

    def __init__(self, chunk: dict, text: str | None = None) -> None:
        super().__init__(chunk)
        self.text = text
        self.frame: bytes | None = None
        self.event: bytes | None = None
        self.same_as: dict | None = None  # a chunk found the same as this one (``_same``)


def ws_text(chunk: dict) -> str:
    """The websocket frame's text of a chunk: what channels' ``send_json`` sends (``json.dumps``)."""
    if isinstance(chunk, WireChunk):
        if chunk.text is None:
            chunk.text = json.dumps(chunk)
        return chunk.text
    return json.dumps(chunk)


def ws_frame(chunk: dict) -> bytes:
    """The whole websocket frame of a chunk, as a server sends it (one unmasked, unfragmented text
    frame, RFC 6455 §5.2), for servers that take frames as they are (``agentrun.server.web``)."""
    if isinstance(chunk, WireChunk) and chunk.frame is not None:
        return chunk.frame
    data = ws_text(chunk).encode()
    size = len(data)
    if size < 126:
        head = bytes((0x81, size))
    elif size < 65536:
        head = bytes((0x81, 126)) + size.to_bytes(2, "big")
    else:
        head = bytes((0x81, 127)) + size.to_bytes(8, "big")
    frame = head + data
    if isinstance(chunk, WireChunk):
        chunk.frame = frame
    return frame


def sse_event(chunk: dict) -> bytes:
    """The server-sent event of a chunk (docs/api.md#server-sent-events): compact JSON."""
    if isinstance(chunk, WireChunk) and chunk.event is not None:
        return chunk.event
    event = f"id: {chunk['seq']}\nevent: chunk\ndata: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()
    if isinstance(chunk, WireChunk):
        chunk.event = event
    return event


def _wire(message: dict) -> list[WireChunk]:
    """The chunks of a ``run.<id>`` message: frames (``run.frames``), or chunks from a process that
    published them unencoded (``run.chunks``, before this version)."""
    if "frames" in message:
        return [WireChunk(json.loads(text), text) for text in message["frames"]]
    return [WireChunk(chunk) for chunk in message.get("chunks", [])]


def release_connection() -> None:
    """Give this thread's database connection back to its pool (PostgreSQL's pool only).

    A stream (SSE, a decision followed live) may wait minutes between two reads: holding a pooled
    connection meanwhile, a few open streams would take every connection of the process
    (``AGENTRUN_DB_POOL_MAX``) and stall its requests. Without a pool, keeping it is cheaper.
    """
    if connection.settings_dict["OPTIONS"].get("pool") and not connection.in_atomic_block:
        connection.close()


@contextlib.contextmanager
def _reading() -> Iterator[None]:
    """A relay's read: the connection it opened is given back after it (``release_connection``); one
    this thread held already stays — the engine driving the run in this process shares asgiref's
    database thread with the streams it relays, and taking its connection away made its next
    statement borrow one again, with the pool's check (docs/performance.md#sixth-pass)."""
    opened_here = connection.connection is None
    try:
        yield
    finally:
        if opened_here:
            release_connection()


def _drop_broken_connection() -> None:
    """After a database error: a connection it broke is closed, so the next read opens a fresh one."""
    connection.close_if_unusable_or_obsolete()


def _load_chunks(run_id: str, after: int, upto: int | None = None) -> list[WireChunk]:
    """The log's chunks after ``after`` (up to ``upto``): one query on the log's (run, seq) key, and no
    model instance nor ORM converter per row (a process reads every chunk of a run it relays once, to
    confirm what it gave live: docs/performance.md "Fan-out (third pass)", "Fourth pass")."""
    where, params = '"run_id" = %s AND "seq" > %s', [run_id, after]
    if upto is not None:
        where, params = f'{where} AND "seq" <= %s', [*params, upto]
    loads = json.loads
    with _reading():
        rows = prepared.table(RunChunk).values(("seq", "type", "payload"), where, params, order='"seq"')
    return [
        WireChunk({"type": type_, "runId": run_id, "from": "AGENT", "seq": seq, "payload": loads(payload)})
        for seq, type_, payload in rows
    ]


def _resume_state(run_id: str, after: int) -> tuple[int | None, int]:
    """For a client resuming after ``after``: (the first takeover finish in the window below it, the
    last seq the log holds). One row each, on the log's (run, seq) key."""
    with _reading():
        chunks = RunChunk.objects.filter(run_id=run_id)
        near = chunks.filter(seq__gt=after - TAKEOVER_WINDOW, seq__lte=after, type="finish").order_by("seq")
        takeover = next(
            (
                seq
                for seq, payload in near.values_list("seq", "payload")
                if _is_takeover({"type": "finish", "payload": payload})
            ),
            None,
        )
        end = chunks.order_by("-seq").values_list("seq", flat=True).first() or 0
    return takeover, end


def _run_state(run_id: str) -> tuple[str | None, bool]:
    """(status, someone is driving it)."""
    with _reading():  # no queryset: read after every live batch a stream relays
        rows = prepared.table(Run).values(("status", "lease_owner", "lease_expires_at"), '"id" = %s', [run_id])
    row = rows[0] if rows else None
    if row is None:
        return None, False
    status, owner, expires = row
    if isinstance(expires, str):  # (SQLite without its converters registered)
        expires = datetime.fromisoformat(expires)
    if expires is not None and expires.tzinfo is None:  # SQLite keeps UTC without saying so
        expires = expires.replace(tzinfo=UTC)
    driving = bool(owner) and expires is not None and expires > timezone.now()
    return status, driving


FINAL = {"completed", "failed", "cancelled", "expired"}


# A subscriber's client that has not kept up for this long (its connection stayed full) while more than
# max_lag chunks wait for it is behind (``SubscriberBehind``). A client that reads gets over a burst
# within it: the benchmark's 100 clients, one Python process, take up to ~0.5 s to read theirs.
CLIENT_STALL_SECONDS = 2.0
# At most this many chunks are handed to a consumer at once (a long replay goes out in pieces).
HANDED_AT_ONCE = 500
# How many of a run's logged chunks a process keeps for its subscribers' re-reads of the log: at
# least LOG_KEPT, more while a subscriber here still needs them, at most LOG_KEPT_MAX.
LOG_KEPT = 4096
LOG_KEPT_MAX = 65536


def _seq(chunk: dict) -> int:
    return chunk["seq"]


class _Batch(list):
    """Chunks that arrived together, as this process decoded them once for all its subscribers.
    ``run``: their seqs follow each other and none is a ``finish`` (a subscriber takes them whole)."""

    __slots__ = ("by_seq", "run", "top")

    def __init__(self, chunks: list[WireChunk]) -> None:
        super().__init__(chunks)
        seqs = [c["seq"] for c in chunks]
        self.top = max(seqs)
        self.run = seqs == list(range(seqs[0], seqs[0] + len(seqs))) and all(c["type"] != "finish" for c in chunks)
        self.by_seq = dict(zip(seqs, chunks, strict=True))


class _Inbox:
    """One subscriber's live chunks, in the batches they arrived in (shared lists: never mutated), and
    whether it is behind (``behind``: its client's lag, never its process's)."""

    __slots__ = (
        "batches",
        "client_full",
        "excused",
        "full_since",
        "given",
        "low",
        "max_lag",
        "newest",
        "on_stall",
        "ready",
        "sending",
    )

    def __init__(
        self,
        after: int,
        client_full: Callable[[], bool] | None = None,
        max_lag: int | None = None,
        on_stall: Callable[[int], None] | None = None,
    ) -> None:
        self.batches: deque[list[WireChunk]] = deque()  # _Batch, or what a subscriber put back
        self.newest = after  # the highest seq published since it joined
        self.given = after  # the highest seq handed to its consumer
        self.sending = False  # its consumer is sending what it was handed
        self.max_lag = max_lag
        self.on_stall = on_stall  # called once if its client stalls while its consumer's send waits
        # Whether its client reads (the server says so, agentrun.ws.frames): its connection is full
        # when the client has not taken what it was sent. Full at every look since ``full_since``.
        self.client_full = client_full
        self.full_since: float | None = None
        # Without client_full: chunks count against it when they arrive while its consumer's send
        # waits; any other arrival excuses everything up to it (``excused``).
        self.excused = after
        self.low = after  # the subscriber may read the log after this seq (to confirm, or to catch up)
        self.ready = asyncio.Event()

    def put(self, batch: _Batch) -> None:
        self.batches.append(batch)
        if batch.top > self.newest:
            self.newest = batch.top
        if self.client_full is None:
            if not self.sending:
                self.excused = self.newest
        elif self.sending:
            self._look()
        self.ready.set()

    def _look(self) -> None:
        """A look at its client while its consumer's send waits on it. A client that stopped reading
        would hold that send until it reads again, and the subscriber would never see that it is
        behind: ``on_stall`` tells its consumer to stop waiting (once)."""
        if not self.stalled() or self.on_stall is None or self.max_lag is None:
            return
        if self.newest - self.given > self.max_lag:
            on_stall, self.on_stall = self.on_stall, None
            on_stall(self.given)

    def stalled(self) -> bool:
        """Its client has not kept up for CLIENT_STALL_SECONDS: its connection was full at every look."""
        assert self.client_full is not None
        if not self.client_full():
            self.full_since = None
            return False
        now = time.monotonic()
        if self.full_since is None:
            self.full_since = now
        return now - self.full_since >= CLIENT_STALL_SECONDS

    def behind(self, given: int, max_lag: int) -> bool:
        """More than ``max_lag`` chunks after ``given`` wait for it because of its client: its client has
        stalled (not because this process was busy for everyone: then the client took all it was sent),
        or, unknown that, they came while its consumer's send waited."""
        if self.client_full is None:
            return self.newest - max(given, self.excused) > max_lag
        return self.newest - given > max_lag and self.stalled()

    def take(self, limit: int) -> list[list[WireChunk]]:
        """Whole batches, about ``limit`` chunks at most (a long backlog goes out in pieces)."""
        batches: list[list[WireChunk]] = []
        count = 0
        while self.batches and (not batches or count + len(self.batches[0]) <= limit):
            batches.append(self.batches.popleft())
            count += len(batches[-1])
        if not self.batches:
            self.ready.clear()
        return batches

    def unget(self, batches: list[list[WireChunk]]) -> None:
        batches = [b for b in batches if b]
        if batches:
            self.batches.extendleft(reversed(batches))
            self.ready.set()


class _RunFeed:
    """This process's end of ``run.<id>``: one membership of the group and one decoding of each message
    whatever the number of subscribers here, and the reads of the log and of the run's state they share
    (docs/performance.md "Fan-out (third pass)")."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.layer = get_channel_layer()
        self.inboxes: set[_Inbox] = set()
        self.channel: str | None = None
        self.receiver: asyncio.Task | None = None
        self.left = False
        self.joining = asyncio.get_running_loop().create_task(self._join())
        # The log's chunks (lo, hi] as a read that began at log_at found them (rows under a seq never change).
        self.log_lock = asyncio.Lock()
        self.logged: list[WireChunk] = []
        self.lo = self.hi = -1
        self.log_at = float("-inf")
        self.refreshing: asyncio.Task | None = None
        self.state_lock = asyncio.Lock()
        self.state: tuple[str | None, bool] = (None, False)
        self.state_at = float("-inf")

    @property
    def live(self) -> bool:
        return self.receiver is not None and not self.receiver.done()

    def usable(self) -> bool:
        """A new subscriber may share it: it is joining or receiving (else it joins afresh)."""
        return not self.left and (not self.joining.done() or self.live)

    async def _join(self) -> None:
        try:
            channel = await self.layer.new_channel()
            await self.layer.group_add(run_group(self.run_id), channel)
        except outages.CHANNEL_LAYER_ERRORS as exc:  # Redis away: the log alone still carries every chunk
            outages.channel_layer.failed(exc)
        except Exception:
            logger.warning("channel layer unavailable; %s is followed from the log", self.run_id, exc_info=True)
        else:
            outages.channel_layer.reached()
            self.channel = channel
            self.receiver = asyncio.get_running_loop().create_task(self._pump())
            if self.left:  # everyone left while it joined
                await self._leave()

    async def _pump(self) -> None:
        assert self.channel is not None
        try:
            while True:
                chunks = _wire(await self.layer.receive(self.channel))
                if chunks:
                    batch = _Batch(chunks)
                    for inbox in self.inboxes:
                        inbox.put(batch)
        except outages.CHANNEL_LAYER_ERRORS as exc:  # no more live chunks: the log carries them
            outages.channel_layer.failed(exc)
        except Exception:
            logger.warning("live chunks of %s stopped; it is followed from the log", self.run_id, exc_info=True)

    async def leave(self, inbox: _Inbox) -> None:
        self.inboxes.discard(inbox)
        if self.inboxes:
            return
        self.left = True
        feeds = _feeds.get(asyncio.get_running_loop(), {})
        if feeds.get(self.run_id) is self:
            del feeds[self.run_id]
        if self.joining.done():
            await self._leave()

    async def _leave(self) -> None:
        for task in (self.receiver, self.refreshing):
            if task is not None:
                task.cancel()
        if self.channel:
            with contextlib.suppress(Exception):  # the layer went away: nothing to clean
                await self.layer.group_discard(run_group(self.run_id), self.channel)

    async def log_after(self, after: int, read: Any, cover: int | None = None, max_age: float = 0.0) -> list[WireChunk]:
        """The log's chunks after ``after``: as a query that began after this call (or at most
        ``max_age`` seconds before it) found them or, given ``cover``, as soon as this process has read
        the log up to that seq (its rows never change). ``read`` is the caller's ``from_db``.
        Subscribers share the queries and the chunks they made."""
        asked = time.monotonic() - max_age
        async with self.log_lock:
            if self.hi < 0 or after > self.hi + LOG_KEPT_MAX:
                started = time.monotonic()  # nothing kept, or all of it is far behind: start afresh
                rows = await read(_load_chunks, self.run_id, after)
                self.logged, self.lo, self.hi, self.log_at = rows, after, rows[-1]["seq"] if rows else after, started
            else:
                if after < self.lo:  # before what is kept: read that much more
                    self.logged[:0] = await read(_load_chunks, self.run_id, after, self.lo)
                    self.lo = after
                # Read on from what is kept, never afresh from ``after``: subscribers at different seqs
                # would each drop what the others still need, and read it again (docs/performance.md
                # "Fan-out (third pass)", "Fourth pass").
                if after > self.hi or ((self.log_at < asked) if cover is None else (self.hi < cover)):
                    started = time.monotonic()
                    rows = await read(_load_chunks, self.run_id, self.hi)
                    self.logged += rows
                    self.hi, self.log_at = rows[-1]["seq"] if rows else self.hi, started
            taken = self.logged[bisect.bisect_right(self.logged, after, key=_seq) :]
            if len(self.logged) > LOG_KEPT:
                # Drop what no subscriber here still needs (each says from where it may read: ``low``),
                # and past LOG_KEPT_MAX the oldest anyway.
                low = min((inbox.low for inbox in self.inboxes), default=self.hi)
                drop = max(
                    min(bisect.bisect_right(self.logged, low, key=_seq), len(self.logged) - LOG_KEPT),
                    len(self.logged) - LOG_KEPT_MAX,
                )
                if drop > 0:
                    self.lo = self.logged[drop - 1]["seq"]
                    del self.logged[:drop]
            return taken

    def kept(self, after: int, upto: int) -> list[WireChunk]:
        """The log's chunks in (after, upto] that this process holds, without reading anything."""
        start = bisect.bisect_right(self.logged, after, key=_seq)
        end = bisect.bisect_right(self.logged, upto, key=_seq)
        return self.logged[start:end]

    def refresh_log(self, cover: int) -> None:
        """Read the log up to its end in the background, unless this process holds it up to ``cover``
        or such a read is under way."""
        if self.hi < 0 or self.hi >= cover or (self.refreshing is not None and not self.refreshing.done()):
            return

        async def refresh() -> None:
            try:
                await self.log_after(self.hi, sync_to_async(_load_chunks), cover)
            except Exception:  # a subscriber that needs the log reads it itself, outages handled
                logger.debug("reading the log of %s in the background failed", self.run_id, exc_info=True)

        self.refreshing = asyncio.get_running_loop().create_task(refresh())

    async def run_state(self, read: Any, max_age: float = 0.0) -> tuple[str | None, bool]:
        """``_run_state`` as a query that began after this call (or ``max_age`` before) found it,
        shared as ``log_after``."""
        asked = time.monotonic() - max_age
        async with self.state_lock:
            if self.state_at < asked:
                started = time.monotonic()
                self.state = await read(_run_state, self.run_id)
                self.state_at = started
            return self.state


_feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _RunFeed]] = weakref.WeakKeyDictionary()


def _feed(run_id: str) -> _RunFeed:
    feeds = _feeds.setdefault(asyncio.get_running_loop(), {})
    feed = feeds.get(run_id)
    if feed is None or not feed.usable():
        feed = feeds[run_id] = _RunFeed(run_id)
    return feed


def _pieces(chunks: list[WireChunk]) -> Iterator[list[WireChunk]]:
    for i in range(0, len(chunks), HANDED_AT_ONCE):
        yield chunks[i : i + HANDED_AT_ONCE] if len(chunks) > HANDED_AT_ONCE else chunks


async def subscribe(run_id: str, after: int = 0, **options: Any) -> AsyncIterator[dict]:
    """``subscribe_batches``, one chunk at a time, each a dict of the consumer's own."""
    async with contextlib.aclosing(subscribe_batches(run_id, after, **options)) as batches:
        async for batch in batches:
            for chunk in batch:
                yield json.loads(ws_text(chunk))


async def subscribe_batches(
    run_id: str,
    after: int = 0,
    *,
    until: str = "final",
    after_a_finish: bool = False,
    max_lag: int | None = None,
    resync: bool = False,
    client_full: Callable[[], bool] | None = None,
    on_stall: Callable[[int], None] | None = None,
) -> AsyncGenerator[list[WireChunk]]:
    """Chunks of ``run_id`` with ``seq > after``: the replay, then live ones, in batches (what arrived
    together), shared with the process's other subscribers of the run: read them, never change them.

    ``until="final"`` ends once the run is final (websockets); ``until="rest"`` ends once it is
    suspended or final and nobody drives it (SSE ``GET /api/runs/{id}/stream``). ``after_a_finish``:
    not before a ``finish`` went by (a segment queued for a worker has not started yet).
    ``max_lag``: raise ``SubscriberBehind`` when more than that many chunks wait for the consumer
    because of its client: ``client_full()`` (the client's connection holds what it was sent and did
    not take) said so at every look for CLIENT_STALL_SECONDS; without it, they came while the
    consumer's send waited. A process busy for everyone makes every backlog grow while the clients
    take all they were sent: that never counts (docs/performance.md "Fan-out (third pass)").
    ``on_stall(resume_after)``: called (once) instead when the client stalls while the consumer is
    sending to it: that send would not end before the client reads again; the consumer should stop it
    and tell the client to resume after the seq given (everything handed before was sent).
    ``resync``: raise ``SubscriberReset`` when the log holds other chunks than this subscriber gave
    (chunks of a dead driver that never reached the log, re-used by its taker), or when its client,
    resuming ``after``, may hold such chunks; without it those seqs are skipped as seen.
    """
    inbox = _Inbox(after, client_full, max_lag, on_stall)
    subscription = _subscription(inbox, run_id, after, until, after_a_finish, max_lag, resync)
    async with contextlib.aclosing(subscription) as batches:
        async for batch in batches:
            # From here until the consumer asks for more, it is sending: chunks that arrive meanwhile
            # count against it while its client does not read (_Inbox.put).
            inbox.sending = True
            try:
                yield batch
            finally:
                inbox.sending = False


async def _subscription(
    inbox: _Inbox, run_id: str, after: int, until: str, after_a_finish: bool, max_lag: int | None, resync: bool
) -> AsyncGenerator[list[WireChunk]]:
    feed = _feed(run_id)
    feed.inboxes.add(inbox)  # before the join completes: nothing published after it is missed

    def poll_seconds() -> float:
        # Live chunks end each wait at once; without them (the layer is down), the log is read often.
        return 1.0 if feed.live and not outages.channel_layer.down else LOG_POLL_SECONDS

    async def from_db(read: Any, *args: Any) -> Any:
        """``read(*args)`` in a thread; while the database does not answer, tried again for
        OUTAGE_PATIENCE_SECONDS (0.25 s doubling to 2 s), then SubscriberInterrupted."""
        give_up = time.monotonic() + OUTAGE_PATIENCE_SECONDS
        delay = 0.25
        while True:
            try:
                result = await sync_to_async(read)(*args)
            except outages.DATABASE_ERRORS as exc:
                outages.database.failed(exc)
                await sync_to_async(_drop_broken_connection)()
                if time.monotonic() + delay > give_up:
                    raise SubscriberInterrupted(given) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            else:
                outages.database.reached()
                return result

    last = after  # the highest seq taken (from the log or live), in order
    given = after  # the highest seq handed to our consumer
    finished = False

    unconfirmed: dict[int, dict] = {}  # resync: chunks given live that the log has not shown yet, by seq
    confirm_at = RECENT_CHUNKS  # resync: confirm them against the log once this many wait
    # resync: (lo, hi]: seqs the client says it holds (it resumed after hi) that the log did not hold yet
    claimed: tuple[int, int] | None = None

    def check_lag() -> None:
        # Chunks the run produced that our consumer has not taken yet (duplicates of the replay do
        # not count), past max_lag because its client does not keep up: it reads too slowly to be
        # kept up to date live.
        if max_lag is not None and inbox.behind(given, max_lag):
            raise SubscriberBehind(given)

    def handed(batch: list[WireChunk], check: bool = True) -> list[WireChunk]:
        nonlocal given
        if check:
            check_lag()
        given = inbox.given = batch[-1]["seq"]
        return batch

    def accept(chunk: dict) -> bool:
        """Take the chunk if it is the next one; a duplicate or one ahead of a gap is not taken."""
        nonlocal last, finished
        if chunk["seq"] != last + 1:
            return False
        last = chunk["seq"]
        finished = finished or chunk["type"] == "finish"
        return True

    def confirm(logged: dict) -> None:
        """The log's chunk under a seq this subscriber already gave (or its client claims to hold)."""
        nonlocal claimed
        seq = logged["seq"]
        shown = unconfirmed.pop(seq, None)
        if shown is not None and not _same(shown, logged):
            raise SubscriberReset(seq - 1)
        if claimed is not None and claimed[0] < seq <= claimed[1]:
            if _is_takeover(logged):  # the client may hold the dead driver's chunks from here on
                raise SubscriberReset(seq - 1)
            claimed = (seq, claimed[1]) if seq < claimed[1] else None

    async def from_log(below: int | None = None, cover: int | None = None, max_age: float = 0.0) -> list[WireChunk]:
        start = min(last, claimed[0] if claimed else last, min(unconfirmed, default=last + 1) - 1)
        inbox.low = start
        taken = []
        logged = await feed.log_after(start, from_db, cover, max_age)
        for c in logged:
            if below is not None and c["seq"] >= below:
                break
            if c["seq"] <= last:
                confirm(c)
            elif accept(c):
                taken.append(c)
        return taken

    try:
        await asyncio.shield(feed.joining)  # joined the group (or not: the log alone carries the run)
        if resync and after > 0:
            # A client resuming after a seq may have been shown chunks a dead driver never logged: a
            # takeover that already re-used them ends this at once; one yet to come, when it is logged.
            takeover, end = await from_db(_resume_state, run_id, after)
            if takeover is not None:
                raise SubscriberReset(takeover - 1)
            claimed = (end, after) if end < after else None
        # After a wait in which nothing came live, reads of the log and of the run's state that
        # another subscriber of the run here made as long ago are as good: the run's subscribers
        # that time out together make one query, not one each (docs/performance.md "Fan-out (third
        # pass)"). On joining and after a finish, a read that begins after the call.
        patience = 0.0
        while True:
            for batch in _pieces(await from_log(max_age=patience)):
                yield handed(batch)
            status, driving = await feed.run_state(from_db, patience)
            if status is None:
                return
            # A final run produces nothing more; a suspended one may still have a queued segment to run.
            if _rested(status, driving, until) and (finished or not after_a_finish or status in FINAL):
                # Read the log once more: the final chunks may have landed after our last read.
                for batch in _pieces(await from_log()):
                    yield handed(batch)
                # Nobody drives the run and its log ends before chunks this client was shown.
                lost = [min(unconfirmed) - 1] if unconfirmed else []
                if claimed is not None:
                    lost.append(claimed[0])
                if resync and lost:
                    raise SubscriberReset(min(lost))
                return
            # Live phase: chunks as they come, until a finish (the run may rest now: re-check its state
            # and the log) or a while without any (re-check them too).
            while True:
                if not inbox.batches:
                    try:
                        await asyncio.wait_for(inbox.ready.wait(), timeout=poll_seconds())
                    except TimeoutError:
                        patience = poll_seconds()
                        break
                taken = inbox.take(max_lag or UNCONFIRMED_MAX)
                check_lag()  # too far behind? Counted once per take
                out: list[WireChunk] = []
                finish = False
                for n, chunks in enumerate(taken):
                    if isinstance(chunks, _Batch) and chunks.run and chunks[0]["seq"] == last + 1:
                        # The usual case, taken whole: no work per chunk for this subscriber.
                        out += chunks
                        last = chunks[-1]["seq"]
                        if resync:  # live: the driver's word until the log shows the same chunks
                            unconfirmed.update(chunks.by_seq)
                        i = len(chunks)
                    else:
                        i = 0
                    while i < len(chunks):
                        chunk = chunks[i]
                        if chunk["seq"] > last + 1:
                            # Produced before we joined and not flushed yet: fill the gap from the log.
                            for batch in _pieces(out):
                                yield handed(batch, check=False)
                            out = []
                            await asyncio.sleep(GAP_POLL_SECONDS)
                            for batch in _pieces(await from_log(below=chunk["seq"])):
                                yield handed(batch)
                            continue
                        i += 1
                        if accept(chunk):
                            out.append(chunk)
                            if resync:
                                unconfirmed[chunk["seq"]] = chunk
                        elif resync and chunk["seq"] in unconfirmed and not _same(unconfirmed[chunk["seq"]], chunk):
                            # Two versions of a seq, neither logged yet as far as we know: the log decides
                            # later, but one of them is not the log's (a dead driver's, and its taker's).
                            for batch in _pieces(out):
                                yield handed(batch, check=False)
                            raise SubscriberReset(chunk["seq"] - 1)
                        if chunk["type"] == "finish":
                            finish = True
                            break
                    if finish:
                        inbox.unget([chunks[i:], *taken[n + 1 :]])
                        break
                    if len(unconfirmed) >= confirm_at:
                        # Confirm them against the log as this process read it (a read for all the run's
                        # subscribers here starts meanwhile when it is behind); wait for one only when
                        # far too many wait: a subscriber never stalls on the database while it keeps up.
                        # (The oldest unconfirmed seq is the dict's first: seqs go in ascending, and
                        # confirmations take them out in the log's order.)
                        feed.refresh_log(last - RECENT_CHUNKS // 2)
                        for logged in feed.kept(next(iter(unconfirmed)) - 1, last):
                            confirm(logged)
                        inbox.low = next(iter(unconfirmed), last + 1) - 1
                        if len(unconfirmed) >= UNCONFIRMED_MAX:
                            for batch in _pieces(out):
                                yield handed(batch, check=False)
                            out = []
                            for batch in _pieces(await from_log(cover=last - RECENT_CHUNKS // 2)):
                                yield handed(batch)
                        confirm_at = max(RECENT_CHUNKS, len(unconfirmed) + RECENT_CHUNKS // 4)
                for batch in _pieces(out):
                    yield handed(batch, check=False)
                if finish:
                    patience = 0.0
                    break
    finally:
        await feed.leave(inbox)


def _rested(status: str, driving: bool, until: str) -> bool:
    if status in FINAL:
        return not driving
    return until == "rest" and status == "suspended" and not driving


def feed_fragment(message: dict[str, Any]) -> str:
    """What a reviewer's page gets for a feed message: an out-of-band swap of its ``#live-status``, whose
    arrival triggers the page's refresh (hx-trigger). Every value escaped (ids and names are anyone's).
    Built in Python, not by a template: it is on every suspension's and decision's path."""
    claim = message.get("claim") or {}
    return format_html(
        '<div id="live-status" hx-swap-oob="true" hidden data-event="{}" data-run-id="{}" data-thread-id="{}"'
        ' data-tool-call-ids="{}" data-claimed-by="{}"></div>',
        message.get("event", ""),
        message.get("runId", ""),
        message.get("threadId", ""),
        " ".join(message.get("toolCallIds") or ()),
        claim.get("claimedBy") or "",
    )


def notify_approvals(event: FeedEvent, **fields: Any) -> None:
    """Tell reviewers' pages that calls opened (``suspended``) or left (``decided``). Call after commit.

    Never waits for the channel layer: a request thread (this runs in post-commit hooks of decisions)
    or a process shutting down must not hang on Redis or on a server loop that has stopped. The send
    happens in the background, within ``NOTIFY_TIMEOUT_SECONDS``; a lost message only delays a page's
    live update.
    """
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "approvals.event", "event": event, **fields}
    # The feed's fragment, rendered once here for every reviewer's socket (docs/performance.md
    # "Fan-out (third pass)"): the message carries it.
    message["html"] = feed_fragment(message)

    async def send() -> None:
        try:
            async with asyncio.timeout(NOTIFY_TIMEOUT_SECONDS):
                await layer.group_send(APPROVALS_GROUP, message)
        except outages.CHANNEL_LAYER_ERRORS as exc:  # reviewers' pages reconnect and re-fetch
            outages.channel_layer.failed(exc)
        except Exception:
            logger.warning("could not notify reviewers of %s", event, exc_info=True)

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None and isinstance(layer, InMemoryChannelLayer):
        # In memory (the embedded default): the feed's consumers listen on the loop that called this
        # thread (a request's, the engine's: asgiref's sync_to_async), where the send is queued without
        # waiting for it — the decision's thread went back and forth once per notice before
        # (docs/performance.md#sixth-pass); from a thread of its own, async_to_sync reaches it.
        loop = _calling_loop()
        if loop is None:
            async_to_sync(send)()
            return
    target = loop or _notifier_loop()
    target.call_soon_threadsafe(lambda: _keep(target.create_task(send())))


def _calling_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop whose ``sync_to_async`` runs this thread, if one does."""
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    same_process = getattr(SyncToAsync.threadlocal, "main_event_loop_pid", None) == os.getpid()
    return loop if same_process and loop is not None and loop.is_running() else None


NOTIFY_TIMEOUT_SECONDS = 2.0
_notifier: asyncio.AbstractEventLoop | None = None
_notifier_lock = threading.Lock()
_sending: set[asyncio.Task] = set()


def _keep(task: asyncio.Task) -> None:
    _sending.add(task)
    task.add_done_callback(_sending.discard)


def _notifier_loop() -> asyncio.AbstractEventLoop:
    """A loop of our own in a daemon thread, for sends from threads without one (never joined at exit)."""
    global _notifier
    with _notifier_lock:
        if _notifier is None or _notifier.is_closed():
            _notifier = asyncio.new_event_loop()
            threading.Thread(target=_notifier.run_forever, name="agentrun-notify", daemon=True).start()
        return _notifier

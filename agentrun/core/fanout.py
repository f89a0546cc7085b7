"""The stream fan-out: every chunk of a run reaches every subscriber, in order, once.

Writers: a segment's ``RunPublisher`` sends its chunks to the channel-layer group ``run.<id>`` as they
are produced (batched per event-loop tick), while ``ChunkLog`` writes them to the database in batches.
Readers: ``subscribe(run_id, after)`` joins the group first, then replays the log after ``after``, then
yields live chunks. A live chunk ahead of what the log holds (it was produced before we joined but is
not flushed yet) makes it re-read the log until the gap is filled: no gap, no duplicate.

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
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import connection
from django.utils import timezone

from agentrun.core import outages
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
# The code of the finish a taker writes for its dead predecessor's segment (engine.loop.TAKEOVER_FINISH).
TAKEOVER_CODE = "driver_lost"
# At most how many chunks a driver publishes that its log does not hold yet: those of one model call
# up to ChunkLog.BATCH (the log is written when full), and a few more. A client resuming after a seq
# this close to a takeover may hold the dead driver's version of the seqs between them.
TAKEOVER_WINDOW = 2 * 200


def _is_takeover(chunk: dict) -> bool:
    return chunk["type"] == "finish" and ((chunk["payload"] or {}).get("error") or {}).get("code") == TAKEOVER_CODE


def _same(a: dict, b: dict) -> bool:
    return a["type"] == b["type"] and json.dumps(a["payload"], sort_keys=True, default=str) == json.dumps(
        b["payload"], sort_keys=True, default=str
    )


def run_group(run_id: str) -> str:
    return f"run.{run_id}"


class RunPublisher:
    """A chunk sink: publishes to ``run.<id>`` without ever blocking or failing the run."""

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
                await self.layer.group_send(run_group(self.run_id), {"type": "run.chunks", "chunks": batch})
            except outages.CHANNEL_LAYER_ERRORS as exc:  # subscribers follow the log meanwhile
                outages.channel_layer.failed(exc)
            except Exception:  # a subscriber recovers from the log; the run must not fail for this
                logger.warning("could not publish %d chunks of %s", len(batch), self.run_id, exc_info=True)
            else:
                outages.channel_layer.reached()

    async def aclose(self) -> None:
        while self.task is not None and not self.task.done():
            await self.task


def release_connection() -> None:
    """Give this thread's database connection back to its pool (PostgreSQL's pool only).

    A stream (SSE, a decision followed live) may wait minutes between two reads: holding a pooled
    connection meanwhile, a few open streams would take every connection of the process
    (``AGENTRUN_DB_POOL_MAX``) and stall its requests. Without a pool, keeping it is cheaper.
    """
    if connection.settings_dict["OPTIONS"].get("pool") and not connection.in_atomic_block:
        connection.close()


def _drop_broken_connection() -> None:
    """After a database error: a connection it broke is closed, so the next read opens a fresh one."""
    connection.close_if_unusable_or_obsolete()


def _load_chunks(run_id: str, after: int) -> list[dict]:
    try:
        return [c.to_chunk() for c in RunChunk.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")]
    finally:
        release_connection()


def _resume_state(run_id: str, after: int) -> tuple[int | None, int]:
    """For a client resuming after ``after``: (the first takeover finish in the window below it, the
    last seq the log holds). One row each, on the log's (run, seq) key."""
    try:
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
    finally:
        release_connection()
    return takeover, end


def _run_state(run_id: str) -> tuple[str | None, bool]:
    """(status, someone is driving it)."""
    try:
        row = Run.objects.filter(pk=run_id).values("status", "lease_owner", "lease_expires_at").first()
    finally:
        release_connection()
    if row is None:
        return None, False
    expires = row["lease_expires_at"]
    driving = bool(row["lease_owner"]) and expires is not None and expires > timezone.now()
    return row["status"], driving


FINAL = {"completed", "failed", "cancelled", "expired"}


async def subscribe(
    run_id: str,
    after: int = 0,
    *,
    until: str = "final",
    after_a_finish: bool = False,
    max_lag: int | None = None,
    resync: bool = False,
) -> AsyncIterator[dict]:
    """Chunks of ``run_id`` with ``seq > after``: the replay, then live ones.

    ``until="final"`` ends once the run is final (websockets); ``until="rest"`` ends once it is
    suspended or final and nobody drives it (SSE ``GET /api/runs/{id}/stream``). ``after_a_finish``:
    not before a ``finish`` went by (a segment queued for a worker has not started yet).
    ``max_lag``: raise ``SubscriberBehind`` when the run has published more than that many chunks
    the consumer has not taken yet (it reads slower than the run produces).
    ``resync``: raise ``SubscriberReset`` when the log holds other chunks than this subscriber gave
    (chunks of a dead driver that never reached the log, re-used by its taker), or when its client,
    resuming ``after``, may hold such chunks; without it those seqs are skipped as seen.
    """
    layer = get_channel_layer()
    group = run_group(run_id)
    live: asyncio.Queue = asyncio.Queue()
    channel: str | None = None  # set once it is in the run's group
    try:
        joining = await layer.new_channel()
        await layer.group_add(group, joining)
        channel = joining
    except outages.CHANNEL_LAYER_ERRORS as exc:  # Redis away: the log alone still carries every chunk
        outages.channel_layer.failed(exc)
    except Exception:
        logger.warning("channel layer unavailable; %s is followed from the log", run_id, exc_info=True)
    else:
        outages.channel_layer.reached()

    newest = after  # the highest seq published since we joined

    async def pump() -> None:
        nonlocal newest
        try:
            while True:
                message = await layer.receive(channel)
                for chunk in message.get("chunks", []):
                    live.put_nowait(chunk)
                    newest = max(newest, chunk["seq"])
        except outages.CHANNEL_LAYER_ERRORS as exc:  # no more live chunks: the log carries them
            outages.channel_layer.failed(exc)
        except Exception:
            logger.warning("live chunks of %s stopped; it is followed from the log", run_id, exc_info=True)

    def poll_seconds() -> float:
        # Live chunks end each wait at once; without them (the layer is down), the log is read often.
        live_ok = receiver is not None and not receiver.done() and not outages.channel_layer.down
        return 1.0 if live_ok else LOG_POLL_SECONDS

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
    given = after  # the highest seq handed to our consumer (a batch read from the log is taken at once)
    finished = False
    receiver = asyncio.get_running_loop().create_task(pump()) if channel else None

    unconfirmed: dict[int, dict] = {}  # resync: chunks given live that the log has not shown yet, by seq
    # resync: (lo, hi]: seqs the client says it holds (it resumed after hi) that the log did not hold yet
    claimed: tuple[int, int] | None = None

    def give(chunk: dict, unlogged: bool = False) -> dict:
        # Chunks the run produced that our consumer has not taken yet (duplicates of the replay do
        # not count): past max_lag it is too far behind to be kept up to date live.
        nonlocal given
        if max_lag is not None and newest - given > max_lag:
            raise SubscriberBehind(given)
        given = chunk["seq"]
        if resync and unlogged:  # live: the driver's word until the log shows the same chunk
            unconfirmed[given] = chunk
        return chunk

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

    async def from_log(below: int | None = None) -> list[dict]:
        start = min(last, claimed[0] if claimed else last, min(unconfirmed, default=last + 1) - 1)
        logged = await from_db(_load_chunks, run_id, start)
        taken = []
        for c in logged:
            if below is not None and c["seq"] >= below:
                break
            if c["seq"] <= last:
                confirm(c)
            elif accept(c):
                taken.append(c)
        return taken

    try:
        if resync and after > 0:
            # A client resuming after a seq may have been shown chunks a dead driver never logged: a
            # takeover that already re-used them ends this at once; one yet to come, when it is logged.
            takeover, end = await from_db(_resume_state, run_id, after)
            if takeover is not None:
                raise SubscriberReset(takeover - 1)
            claimed = (end, after) if end < after else None
        while True:
            for chunk in await from_log():
                yield give(chunk)
            status, driving = await from_db(_run_state, run_id)
            if status is None:
                return
            # A final run produces nothing more; a suspended one may still have a queued segment to run.
            if _rested(status, driving, until) and (finished or not after_a_finish or status in FINAL):
                # Read the log once more: the final chunks may have landed after our last read.
                for chunk in await from_log():
                    yield give(chunk)
                # Nobody drives the run and its log ends before chunks this client was shown.
                lost = [min(unconfirmed) - 1] if unconfirmed else []
                if claimed is not None:
                    lost.append(claimed[0])
                if resync and lost:
                    raise SubscriberReset(min(lost))
                return
            # Live phase: wait for chunks; re-check the run state when nothing arrives for a while.
            try:
                chunk = await asyncio.wait_for(live.get(), timeout=poll_seconds())
            except TimeoutError:
                continue
            while True:
                if chunk["seq"] > last + 1:
                    # Produced before we joined and not flushed yet: fill the gap from the log.
                    await asyncio.sleep(GAP_POLL_SECONDS)
                    for logged in await from_log(below=chunk["seq"]):
                        yield give(logged)
                    continue
                if accept(chunk):
                    yield give(chunk, unlogged=True)
                elif resync and chunk["seq"] in unconfirmed and not _same(unconfirmed[chunk["seq"]], chunk):
                    # Two versions of a seq, neither logged yet as far as we know: the log decides later,
                    # but one of them is not the log's (a dead driver's, and its taker's).
                    raise SubscriberReset(chunk["seq"] - 1)
                if chunk["type"] == "finish" or len(unconfirmed) >= RECENT_CHUNKS:
                    break  # re-check the state (the run may rest now) and the log
                try:
                    chunk = live.get_nowait()
                except asyncio.QueueEmpty:
                    break
    finally:
        if receiver is not None:
            receiver.cancel()
        if channel:
            with contextlib.suppress(Exception):  # the layer went away: nothing to clean
                await layer.group_discard(group, channel)


def _rested(status: str, driving: bool, until: str) -> bool:
    if status in FINAL:
        return not driving
    return until == "rest" and status == "suspended" and not driving


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
        # In memory (the embedded default): no network to wait on, and the feed's consumers listen on
        # the server's loop, which async_to_sync reaches from a request thread.
        async_to_sync(send)()
        return
    target = loop or _notifier_loop()
    target.call_soon_threadsafe(lambda: _keep(target.create_task(send())))


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

"""The stream fan-out: every chunk of a run reaches every subscriber, in order, once.

Writers: a segment's ``RunPublisher`` sends its chunks to the channel-layer group ``run.<id>`` as they
are produced (batched per event-loop tick), while ``ChunkLog`` writes them to the database in batches.
Readers: ``subscribe(run_id, after)`` joins the group first, then replays the log after ``after``, then
yields live chunks. A live chunk ahead of what the log holds (it was produced before we joined but is
not flushed yet) makes it re-read the log until the gap is filled: no gap, no duplicate.

Reviewers' feed: ``notify_approvals`` tells the ``approvals`` group when calls open or are decided.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import connection
from django.utils import timezone

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


class SubscriberReset(Exception):  # noqa: N818 - a state, not an error of ours
    """A process took the run over after its predecessor died: the chunks this subscriber was given
    after ``resume_after`` were published live but never logged, and the log now holds other chunks
    under those seqs. The subscriber should drop them and resume after ``resume_after``."""

    def __init__(self, resume_after: int) -> None:
        super().__init__(f"resume after={resume_after}")
        self.resume_after = resume_after


# How many recently given chunks a resyncing subscriber keeps to compare (more than a driver ever
# publishes between two log writes: ChunkLog.BATCH).
RECENT_CHUNKS = 1024


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
            except Exception:  # a subscriber recovers from the log; the run must not fail for this
                logger.warning("could not publish %d chunks of %s", len(batch), self.run_id, exc_info=True)

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


def _load_chunks(run_id: str, after: int) -> list[dict]:
    try:
        return [c.to_chunk() for c in RunChunk.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")]
    finally:
        release_connection()


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
    ``resync``: raise ``SubscriberReset`` when a takeover re-uses seqs this subscriber was given
    (chunks of a dead driver that never reached the log); without it those seqs are skipped as seen.
    """
    layer = get_channel_layer()
    group = run_group(run_id)
    live: asyncio.Queue = asyncio.Queue()
    try:
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
    except Exception:  # the layer is down (Redis away): the log alone still carries every chunk
        logger.warning("channel layer unavailable; %s is followed from the log", run_id, exc_info=True)
        channel = None
    poll = 1.0 if channel else LOG_POLL_SECONDS

    async def pump() -> None:
        nonlocal newest
        while channel:
            message = await layer.receive(channel)
            for chunk in message.get("chunks", []):
                live.put_nowait(chunk)
                newest = max(newest, chunk["seq"])

    last = after  # the highest seq taken (from the log or live), in order
    given = after  # the highest seq handed to our consumer (a batch read from the log is taken at once)
    newest = after  # the highest seq published since we joined
    finished = False
    receiver = asyncio.get_running_loop().create_task(pump())

    recent: dict[int, dict] = {}  # resync: the chunks given lately, by seq

    def give(chunk: dict) -> dict:
        # Chunks the run produced that our consumer has not taken yet (duplicates of the replay do
        # not count): past max_lag it is too far behind to be kept up to date live.
        nonlocal given
        if max_lag is not None and newest - given > max_lag:
            raise SubscriberBehind(given)
        given = chunk["seq"]
        if resync:
            recent[given] = chunk
            recent.pop(given - RECENT_CHUNKS, None)
        return chunk

    def accept(chunk: dict) -> bool:
        """Take the chunk if it is the next one; a duplicate or one ahead of a gap is not taken."""
        nonlocal last, finished
        if chunk["seq"] != last + 1:
            return False
        last = chunk["seq"]
        finished = finished or chunk["type"] == "finish"
        return True

    async def from_log(below: int | None = None) -> list[dict]:
        logged = await sync_to_async(_load_chunks)(run_id, last)
        return [c for c in logged if (below is None or c["seq"] < below) and accept(c)]

    try:
        while True:
            for chunk in await from_log():
                yield give(chunk)
            status, driving = await sync_to_async(_run_state)(run_id)
            if status is None:
                return
            # A final run produces nothing more; a suspended one may still have a queued segment to run.
            if _rested(status, driving, until) and (finished or not after_a_finish or status in FINAL):
                # Read the log once more: the final chunks may have landed after our last read.
                for chunk in await from_log():
                    yield give(chunk)
                return
            # Live phase: wait for chunks; re-check the run state when nothing arrives for a while.
            try:
                chunk = await asyncio.wait_for(live.get(), timeout=poll)
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
                    yield give(chunk)
                elif resync and chunk["seq"] <= given and not _same(recent.get(chunk["seq"], chunk), chunk):
                    raise SubscriberReset(chunk["seq"] - 1)
                if chunk["type"] == "finish":
                    break  # re-check the state: the run may rest now
                try:
                    chunk = live.get_nowait()
                except asyncio.QueueEmpty:
                    break
    finally:
        receiver.cancel()
        if channel:
            with contextlib.suppress(Exception):  # the layer went away: nothing to clean
                await layer.group_discard(group, channel)


def _rested(status: str, driving: bool, until: str) -> bool:
    if status in FINAL:
        return not driving
    return until == "rest" and status == "suspended" and not driving


def notify_approvals(event: str, **fields: Any) -> None:
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

"""Server-sent events (docs/api.md#server-sent-events): ``id: <seq>``, ``event: chunk``,
``data: <chunk JSON>``, then ``done``."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from django.http import StreamingHttpResponse

from agentrun.core import outages
from agentrun.core.errors import AgentRunError
from agentrun.core.fanout import SubscriberInterrupted, SubscriberReset, release_connection, sse_event

logger = logging.getLogger("agentrun.api")

DONE = b"event: done\ndata: [DONE]\n\n"


async def _events(batches: AsyncIterator[list[dict]]) -> AsyncIterator[bytes]:
    sent = None
    async with aclosing(batches) as source:
        try:
            async for batch in source:
                # Each chunk's event is made once per process (fanout.sse_event) and what arrived
                # together is one write (docs/performance.md "Fan-out (third pass)").
                yield b"".join([sse_event(chunk) for chunk in batch])
                sent = batch[-1]["seq"]
        except (SubscriberInterrupted, *outages.INFRASTRUCTURE_ERRORS) as exc:
            # The database or the channel layer stayed away: an error event, then the stream ends
            # without `done`, so an EventSource reconnects by itself (after `retry:` ms) with its
            # Last-Event-ID; other clients read resumeAfter (docs/api.md#server-sent-events).
            resume = exc.resume_after if isinstance(exc, SubscriberInterrupted) else sent
            error = outages.unavailable(exc, **({"resumeAfter": resume} if resume is not None else {})).to_dict()
            retry = outages.RETRY_AFTER_SECONDS * 1000
            yield f"retry: {retry}\nevent: error\ndata: {json.dumps(error)}\n\n".encode()
            return
        except SubscriberReset as reset:
            # A takeover replaced chunks this stream sent live (never logged). The event's id makes an
            # EventSource reconnect with Last-Event-ID = that seq; other clients read resumeAfter.
            data = json.dumps({"resumeAfter": reset.resume_after})
            yield f"id: {reset.resume_after}\nevent: reset\ndata: {data}\n\n".encode()
            return
        except AgentRunError as exc:
            # The response has started: the error travels as an event, then the stream ends.
            yield f"event: error\ndata: {json.dumps(exc.to_dict())}\n\n".encode()
        except Exception:
            logger.exception("an event stream failed")
            yield b'event: error\ndata: {"error": {"code": "server_error", "message": "the stream failed"}}\n\n'
    yield DONE


async def _one_by_one(chunks: AsyncIterator[dict]) -> AsyncIterator[list[dict]]:
    async with aclosing(chunks) as source:
        async for chunk in source:
            yield [chunk]


def event_stream_response(
    chunks: AsyncIterator[dict] | None = None, status: int = 200, *, batches: AsyncIterator[list[dict]] | None = None
) -> StreamingHttpResponse:
    """The chunks (or the batches of ``fanout.subscribe_batches``) as server-sent events."""
    release_connection()  # the view's: the stream may last long, and reads the database on its own
    source = batches if batches is not None else _one_by_one(chunks)  # type: ignore[arg-type]
    response = StreamingHttpResponse(_events(source), status=status, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: send each event at once
    return response

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
from agentrun.core.fanout import SubscriberInterrupted, SubscriberReset, release_connection

logger = logging.getLogger("agentrun.api")

DONE = b"event: done\ndata: [DONE]\n\n"


def chunk_event(chunk: dict) -> bytes:
    return f"id: {chunk['seq']}\nevent: chunk\ndata: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()


async def _events(chunks: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    sent = None
    async with aclosing(chunks) as source:
        try:
            async for chunk in source:
                yield chunk_event(chunk)
                sent = chunk["seq"]
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


def event_stream_response(chunks: AsyncIterator[dict], status: int = 200) -> StreamingHttpResponse:
    release_connection()  # the view's: the stream may last long, and reads the database on its own
    response = StreamingHttpResponse(_events(chunks), status=status, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: send each event at once
    return response

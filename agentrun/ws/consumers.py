"""Websockets (docs/api.md#websockets). Thin: authorize, then relay the fan-out or the Python API.

No socket goes silent: a stream that cannot go on closes with a code that says why and where to resume,
or (``ws/agents``) sends an error frame that says so (docs/api.md#websocket-close-codes); ``OutageGuard``
closes what a consumer did not handle.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from agentrun.api.bodies import decision_request, decode_frame, frame_action, stream_kwargs
from agentrun.core import outages
from agentrun.core.access import START_PERMISSION, can_decide, can_view, in_agent_scope
from agentrun.core.errors import AgentRunError
from agentrun.core.fanout import (
    SubscriberBehind,
    SubscriberInterrupted,
    SubscriberReset,
    subscribe_batches,
    ws_frame,
    ws_text,
)
from agentrun.core.models import Decision, Run
from agentrun.engine.agents import follow, get_agent
from agentrun.engine.runtime import db
from agentrun.engine.service import Decider, DecisionCommand, decide
from agentrun.ws.frames import CLIENT_FULL, FRAMES

logger = logging.getLogger("agentrun.ws")

MESSAGE_TOO_BIG = 1009
SERVER_ERROR = 1011  # a bug of ours: reconnect (ws/runs: after the seq of the reason)
TRY_AGAIN_LATER = 1013  # the database or the channel layer is unreachable: reconnect in a few seconds
SUBSCRIBER_BEHIND = 4008
SUBSCRIBER_RESET = 4009
# Our consumers relay the fan-out (fanout.subscribe joins the run's group itself): neither needs a
# channel of its own, so a socket opens, and follows the log, while Redis is away.
NO_CHANNEL_LAYER = "agentrun.no-channel-layer"


def _error(code: str, message: str, details: dict | None = None) -> dict:
    """An error frame, as REST's error envelope: ``details`` when the error has any."""
    error: dict[str, Any] = {"code": code, "message": message}
    if details:
        error["details"] = details
    return {"type": "error", "error": error}


class RunStreamConsumer(AsyncJsonWebsocketConsumer):
    """``ws/runs/<runId>/?after=<seq>``: replay after ``seq``, then live, closed (1000) once final."""

    channel_layer_alias = NO_CHANNEL_LAYER

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        self.forwarder: asyncio.Task | None = None
        await self.accept()
        if not await sync_to_async(can_view)(self.user):
            code = "NOT_AUTHENTICATED" if not getattr(self.user, "is_authenticated", False) else "PERMISSION_DENIED"
            await self.send_json(_error(code, "You may not watch runs."))
            await self.close(code=4403)
            return
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            after = int(query.get("after", ["0"])[0] or 0)
            if after < 0:
                raise ValueError
        except ValueError:
            await self.send_json(_error("INVALID_REQUEST", "after must be a non-negative integer"))
            await self.close(code=4400)
            return
        agent_id = await Run.objects.filter(pk=run_id).values_list("agent_id", flat=True).afirst()
        if agent_id is None or not await sync_to_async(in_agent_scope)(self.user, agent_id):
            # A hidden agent's run reads as missing (agentrun.core.access).
            await self.send_json(_error("RUN_NOT_FOUND", f"No run {run_id}."))
            await self.close(code=4404)
            return
        self.forwarder = asyncio.create_task(self._forward(run_id, after))

    async def _forward(self, run_id: str, after: int) -> None:
        sent = after
        stalled: list[int] = []

        def on_stall(resume_after: int) -> None:
            # Its client stopped reading while more than AGENTRUN_WS_MAX_LAG chunks wait for it: the
            # send waiting on it is stopped (what it wrote stays queued before the close frame).
            stalled.append(resume_after)
            assert self.forwarder is not None
            self.forwarder.cancel()

        try:
            # A send waits while the client's connection is backed up (agentrun.server.web). Closed 4008
            # when more than AGENTRUN_WS_MAX_LAG chunks wait because the client does not take what it was
            # sent (the server says so: agentrun.ws.frames), never because this process was busy.
            batches = subscribe_batches(
                run_id,
                after,
                until="final",
                max_lag=settings.AGENTRUN_WS_MAX_LAG,
                resync=True,
                client_full=self.scope.get("extensions", {}).get(FRAMES, {}).get(CLIENT_FULL),
                on_stall=on_stall,
            )
            async with aclosing(batches):
                async for batch in batches:
                    await self.send_chunks(batch)
                    sent = batch[-1]["seq"]
        except asyncio.CancelledError:
            if not stalled:  # the socket closed (disconnect)
                raise
            if (task := asyncio.current_task()) is not None:
                task.uncancel()
            await self.close(code=SUBSCRIBER_BEHIND, reason=f"resume after={stalled[0]}")
            return
        except SubscriberInterrupted as interrupted:
            # The database stayed away: reconnect in a few seconds after the seq named; nothing is lost.
            await self.close(code=TRY_AGAIN_LATER, reason=f"resume after={interrupted.resume_after}")
            return
        except outages.INFRASTRUCTURE_ERRORS as exc:
            outages.failed(exc)
            await self.close(code=TRY_AGAIN_LATER, reason=f"resume after={sent}")
            return
        except SubscriberBehind as behind:
            # Too far behind: a clean close that says where to resume, never a reset
            # (docs/api.md#websocket-close-codes).
            await self.close(code=SUBSCRIBER_BEHIND, reason=f"resume after={behind.resume_after}")
            return
        except SubscriberReset as reset:
            # A takeover replaced chunks this socket was sent live (never logged): the client drops
            # what it got after the seq named and resumes there (README "Production").
            await self.close(code=SUBSCRIBER_RESET, reason=f"resume after={reset.resume_after}")
            return
        except Exception:
            logger.exception("ws/runs %s: the stream failed", run_id)
            await self.close(code=SERVER_ERROR, reason=f"resume after={sent}")
            return
        await self.close(code=1000)

    async def send_chunks(self, chunks: list[dict]) -> None:
        """One frame per chunk, as ``send_json`` would; each chunk's bytes are made once per process and
        shared by every socket, and what arrived together goes to the server in one message
        (docs/performance.md "Fan-out (third pass)")."""
        if FRAMES in self.scope.get("extensions", {}):
            await self.base_send({"type": FRAMES, "frames": b"".join([ws_frame(chunk) for chunk in chunks])})
            return
        for chunk in chunks:
            await self.send(text_data=ws_text(chunk))

    async def disconnect(self, code: int) -> None:
        if self.forwarder is not None:
            self.forwarder.cancel()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        # Any frame, binary or not JSON included, is answered undecoded; the socket stays open.
        await self.receive_json(None)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        await self.send_json(_error("INVALID_REQUEST", "this socket only streams; send nothing"))


class AgentConsumer(AsyncJsonWebsocketConsumer):
    """``ws/agents/<agentId>/``: ``{"action": "stream"|"approve"|"decline"|"resume", ...}`` → chunks."""

    channel_layer_alias = NO_CHANNEL_LAYER

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        self.tasks: set[asyncio.Task] = set()
        self.agent: Any = None  # set once the user may use it; frames sent to a refused socket do nothing
        await self.accept()
        if not await sync_to_async(can_view)(self.user):
            code = "NOT_AUTHENTICATED" if not getattr(self.user, "is_authenticated", False) else "PERMISSION_DENIED"
            await self.send_json(_error(code, "You may not use agents."))
            await self.close(code=4403)
            return
        agent_id = self.scope["url_route"]["kwargs"]["agent_id"]
        try:
            agent = get_agent(agent_id)
            if not await sync_to_async(in_agent_scope)(self.user, agent.id):
                raise AgentRunError("AGENT_NOT_FOUND", f"No agent {agent_id!r} is registered.")
            self.agent = agent
        except AgentRunError as exc:
            await self.send_json(_error(exc.code, exc.message))
            await self.close(code=4404)

    async def disconnect(self, code: int) -> None:
        # Runs go on server-side; only the forwarding to this socket stops.
        for task in self.tasks:
            task.cancel()

    @classmethod
    async def decode_json(cls, text_data: str) -> Any:
        try:
            return decode_frame(text_data, None)
        except AgentRunError:
            return _MALFORMED

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        # The REST body's rules (1 MiB, strict JSON, depth, storable text): an error frame, never a crash.
        try:
            content = decode_frame(text_data, bytes_data)
        except AgentRunError as exc:
            if getattr(self, "agent", None) is not None:  # a refused socket answers nothing
                await self.send_json(_error(exc.code, exc.message))
                if exc.code == "PAYLOAD_TOO_LARGE":
                    # Over 1 MiB: the error frame, then close 1009 (message too big), as the server
                    # itself does for a frame it will not read (agentrun.server.web).
                    await self.close(code=MESSAGE_TOO_BIG)
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if self.agent is None:
            return
        if content is _MALFORMED:
            await self.send_json(_error("INVALID_REQUEST", "a frame is a JSON object with an action"))
            return
        try:
            # The REST bodies' models, strict as over REST: a frame's keys are its action's body's,
            # plus "action" and "runId".
            action, run_id, fields = frame_action(content)
            if action == "stream":
                if not await sync_to_async(self.user.has_perm)(START_PERMISSION):
                    raise AgentRunError("PERMISSION_DENIED", "You may not start runs.")
                stream = await self.agent.stream(**stream_kwargs(fields), started_by=self.user, dispatch=True)
            else:
                if not await sync_to_async(can_decide)(self.user):
                    raise AgentRunError("PERMISSION_DENIED", "You may not decide tool calls.")
                # The one decision service, as every door; the continuation runs server-side and
                # reaches this socket through the run's chunk log.
                command = DecisionCommand(
                    agent_id=self.agent.id,
                    run_id=run_id or "",
                    requests=(decision_request(action, fields),),
                    decider=Decider.person(self.user, via=Decision.Via.WEBSOCKET),
                )
                outcome = await db(decide)(command)
                if not outcome.continue_run_id:
                    # An approval towards a quorum: nothing runs yet. Say so, as REST's 202 does
                    # (docs/api.md#wsagents): the call waits for another person.
                    await self.send_json({"type": "decision", **outcome.to_dict()})
                    return
                stream = follow(outcome)
        except outages.INFRASTRUCTURE_ERRORS as exc:
            # Sending the same frame again is safe: a decision already recorded answers so.
            await self.send_json(_unavailable(exc))
            return
        except AgentRunError as exc:
            await self.send_json(_error(exc.code, exc.message, exc.details))
            return
        task = asyncio.create_task(self._forward(stream))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _forward(self, stream: Any) -> None:
        """Relay one run's chunks. When that cannot go on, an error frame names the run and the seq to
        pick it up after (``ws/runs/<runId>/?after=<resumeAfter>``); the socket stays usable."""
        sent = 0
        try:
            async for chunk in stream.full_stream:
                await self.send_json(chunk)
                sent = chunk["seq"]
        except AgentRunError as exc:  # SERVICE_UNAVAILABLE with {runId, resumeAfter} (engine/stream.py)
            await self.send_json(_error(exc.code, exc.message, exc.details))
        except outages.INFRASTRUCTURE_ERRORS as exc:
            await self.send_json(_unavailable(exc, runId=stream.run_id, resumeAfter=sent))
        except Exception:
            logger.exception("ws/agents: relaying run %s failed", stream.run_id)
            details = {"runId": stream.run_id, "resumeAfter": sent}
            await self.send_json(_error("server_error", "Relaying the run failed.", details))


def _unavailable(exc: BaseException, **details: Any) -> dict:
    return {"type": "error", **outages.unavailable(exc, **details).to_dict()}


_MALFORMED = object()


class OutageGuard:
    """ASGI middleware around the websocket routes: an error no consumer handled never leaves a socket
    open and silent, nor turns its handshake into an HTTP 500. The database or the channel layer
    unreachable (checking the user, joining a group, …): accepted and closed **1013** "try again later";
    any other error: closed **1011** (docs/api.md#websocket-close-codes)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        state = {"accepted": False, "closed": False}

        async def tracked(message: dict) -> None:
            if message["type"] == "websocket.accept":
                state["accepted"] = True
            elif message["type"] == "websocket.close":
                state["closed"] = True
            await send(message)

        try:
            await self.inner(scope, receive, tracked)
            return
        except outages.INFRASTRUCTURE_ERRORS as exc:
            outages.failed(exc)
            code, reason = TRY_AGAIN_LATER, "try again later"
        except Exception:
            logger.exception("websocket %s failed", scope.get("path"))
            code, reason = SERVER_ERROR, "server error"
        if state["closed"]:
            return
        if not state["accepted"]:  # a close code needs an open socket: a refused handshake has none
            await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": code, "reason": reason})

"""Websockets (docs/api.md#websockets). Thin: authorize, then relay the fan-out or the Python API."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from agentrun.api.bodies import decision_kwargs, decode_frame, stream_kwargs
from agentrun.core.access import START_PERMISSION, can_decide, can_view, in_agent_scope
from agentrun.core.errors import AgentRunError
from agentrun.core.fanout import SubscriberBehind, SubscriberReset, subscribe
from agentrun.core.models import Run
from agentrun.engine.agents import get_agent

MESSAGE_TOO_BIG = 1009
SUBSCRIBER_BEHIND = 4008
SUBSCRIBER_RESET = 4009


def _error(code: str, message: str) -> dict:
    return {"type": "error", "error": {"code": code, "message": message}}


class RunStreamConsumer(AsyncJsonWebsocketConsumer):
    """``ws/runs/<runId>/?after=<seq>``: replay after ``seq``, then live, closed (1000) once final."""

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
        try:
            # send_json waits while the client's connection is backed up (agentrun.server.web), so a
            # slow reader's chunks wait here, counted against AGENTRUN_WS_MAX_LAG.
            chunks = subscribe(run_id, after, until="final", max_lag=settings.AGENTRUN_WS_MAX_LAG, resync=True)
            async for chunk in chunks:
                await self.send_json(chunk)
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
        await self.close(code=1000)

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
        if content is _MALFORMED or not isinstance(content, dict):
            await self.send_json(_error("INVALID_REQUEST", "a frame is a JSON object with an action"))
            return
        action = content.get("action")
        try:
            if action == "stream":
                if not await sync_to_async(self.user.has_perm)(START_PERMISSION):
                    raise AgentRunError("PERMISSION_DENIED", "You may not start runs.")
                stream = await self.agent.stream(**stream_kwargs(content), dispatch=True)
            elif action in ("approve", "decline", "resume"):
                if not await sync_to_async(can_decide)(self.user):
                    raise AgentRunError("PERMISSION_DENIED", "You may not decide tool calls.")
                run_id = content.get("runId")
                if not isinstance(run_id, str):
                    raise AgentRunError("INVALID_REQUEST", "runId is required")
                kwargs_ = decision_kwargs(action, content)
                # The one decision service, as every door; the continuation runs server-side and
                # reaches this socket through the run's chunk log.
                if action == "resume":
                    stream = await self.agent.resume_stream(
                        kwargs_.pop("resume_data"), run_id=run_id, decided_by=self.user, via="websocket", **kwargs_
                    )
                else:
                    method = self.agent.approve_tool_call if action == "approve" else self.agent.decline_tool_call
                    stream = await method(run_id=run_id, decided_by=self.user, via="websocket", **kwargs_)
            else:
                raise AgentRunError("INVALID_REQUEST", "action must be stream, approve, decline or resume")
        except AgentRunError as exc:
            await self.send_json(_error(exc.code, exc.message))
            return
        task = asyncio.create_task(self._forward(stream))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _forward(self, stream: Any) -> None:
        async for chunk in stream.full_stream:
            await self.send_json(chunk)


_MALFORMED = object()

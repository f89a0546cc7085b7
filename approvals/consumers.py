"""``ws/approvals/``: the reviewers' live feed, as HTML fragments the htmx ``ws`` extension swaps in."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from agentrun.core import outages
from agentrun.core.access import can_view, hidden_agent_ids
from agentrun.core.fanout import APPROVALS_GROUP, feed_fragment


class ApprovalsFeedConsumer(AsyncWebsocketConsumer):
    """Tells open inbox and thread pages that calls opened or left; the pages re-fetch what changed."""

    joined = False
    hidden: frozenset[str] = frozenset()
    unwatch: Any = None
    closing: asyncio.Future | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if not await database_sync_to_async(can_view)(user):
            await self.close(code=4403)  # before accept: the handshake is refused
            return
        # Per-agent reviewers: the scope as of connecting (a group change applies on reconnect).
        self.hidden = await database_sync_to_async(hidden_agent_ids)(user)
        await self.channel_layer.group_add(APPROVALS_GROUP, self.channel_name)
        outages.channel_layer.reached()
        self.joined = True
        # Events published while the channel layer is away are lost: close (1013) so that the page
        # reconnects and fetches its cards again, instead of waiting for news that never comes.
        loop = asyncio.get_running_loop()
        self.unwatch = outages.channel_layer.on_down(lambda: loop.call_soon_threadsafe(self._layer_lost))
        await self.accept()

    def _layer_lost(self) -> None:
        self._unwatch()
        self.closing = asyncio.ensure_future(self.close(code=1013, reason="try again later"))

    def _unwatch(self) -> None:
        if self.unwatch is not None:
            self.unwatch()
            self.unwatch = None

    async def disconnect(self, code: int) -> None:
        self._unwatch()
        if self.joined:
            with contextlib.suppress(*outages.CHANNEL_LAYER_ERRORS):  # the layer went away: nothing to leave
                await self.channel_layer.group_discard(APPROVALS_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The feed only speaks; what a page sends is ignored."""

    async def approvals_event(self, message: dict[str, Any]) -> None:
        if message.get("agentId") in self.hidden:
            return  # not even that something happened: the agent is hidden from this reviewer
        # Rendered once by the sender for every socket (fanout.notify_approvals); rendered here only
        # for a message of a process that did not (an older version).
        await self.send(text_data=message.get("html") or feed_fragment(message))

"""The Redis channel layer of production (settings ``CHANNEL_LAYERS`` when ``REDIS_URL`` is set).

channels_redis's ``RedisPubSubChannelLayer`` reads its Redis connection in a loop that, while the
process holds no subscription, sleeps 100 ms a turn, and a new subscription does not wake it: the
first chunks a web process should relay after being idle (a ``ws/runs`` socket that just joined a
run, then its continuation) waited up to 100 ms in the socket's buffer (docs/performance.md). Here each
connection keeps one subscription of its own, on which nothing is ever published, so the loop always
waits on the socket and reads a message as soon as it arrives.
"""

from __future__ import annotations

from channels_redis.pubsub import RedisPubSubChannelLayer


class AwakePubSubChannelLayer(RedisPubSubChannelLayer):
    async def group_add(self, group: str, channel: str) -> None:
        layer = self._get_layer()
        for shard in layer._shards:  # idempotent: a shard subscribes to a channel once
            await shard.subscribe(f"{layer.prefix}__agentrun_awake")
        await layer.group_add(group, channel)

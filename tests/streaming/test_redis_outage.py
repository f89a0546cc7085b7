"""Issue 25 C/D: Redis (the channel layer) going away and coming back, with a redis-server of the test's
own (killed and started again on its port). No socket is left silent: the reviewers' feed closes 1013
(its page reconnects and fetches its cards again), a new socket is closed 1013 or follows the log, and
each process logs one warning per outage and one line when it ends — not a traceback per operation.

Marked ``postgres``: it runs in the pass that has the services (redis-server), not the embedded one."""

from __future__ import annotations

import logging

import pytest
from asgiref.sync import sync_to_async

from agentrun.core import outages
from agentrun.core.fanout import RunPublisher
from agentrun.engine.agents import get_agent
from agentrun.engine.types import Decider
from tests.helpers.asgi import communicator, receive_until
from tests.helpers.decisions import record_decision as decide
from tests.helpers.runs import EMAIL_LINE as EMAIL
from tests.helpers.system import PrivateRedis
from tests.helpers.users import reviewer_token

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def redis(settings, tmp_path):
    server = PrivateRedis(tmp_path)
    server.start()
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "agentrun.server.channel_layer.AwakePubSubChannelLayer",
            "CONFIG": {"hosts": [server.url]},
        }
    }
    outages.channel_layer.reached()  # whatever an earlier test left: this one starts with Redis up
    yield server
    server.kill()


async def test_the_reviewers_feed_closes_1013_when_redis_goes_away(redis):
    token = await reviewer_token("feed-out")
    feed = communicator("/ws/approvals/", token)
    assert (await feed.connect())[0]
    redis.kill()
    closed = await feed.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": 1013, "reason": "try again later"}
    await feed.disconnect()

    # While Redis is away a new feed socket is closed 1013 too (not refused with an HTTP 500) ...
    again = communicator("/ws/approvals/", token)
    assert (await again.connect(timeout=10))[0]
    assert (await again.receive_output(timeout=10))["code"] == 1013
    await again.disconnect()
    # ... and once it is back, the page's reconnect works.
    redis.start()
    back = communicator("/ws/approvals/", token)
    assert (await back.connect(timeout=10))[0]
    await back.disconnect()


async def test_a_run_socket_opens_and_follows_the_log_while_redis_is_away(redis):
    token = await reviewer_token("runs-out")
    stream = await get_agent("support-agent").stream(EMAIL, memory={"thread": "runs-out"})
    chunks = await stream.collect()
    redis.kill()
    comm = communicator(f"/ws/runs/{stream.run_id}/?after={chunks[-1]['seq']}", token)
    assert (await comm.connect(timeout=10))[0]
    await sync_to_async(decide)(
        agent_id="support-agent", run_id=stream.run_id, kind="approve", decider=Decider.system("ops")
    )
    from agentrun.engine.dispatch import continue_run

    assert await continue_run.acall("support-agent", stream.run_id) == "stop"  # publishes nothing
    rest = await receive_until(comm, lambda f: f["type"] == "finish")
    assert [c["type"] for c in rest][-3:] == ["text-end", "step-finish", "finish"]
    assert (await comm.receive_output(timeout=10))["code"] == 1000


async def test_an_outage_is_one_warning_and_one_line_when_it_ends(redis, caplog):
    publisher = RunPublisher("run_logged")
    redis.kill()
    with caplog.at_level(logging.DEBUG):
        for _ in range(5):
            publisher({"seq": 1, "type": "text-delta"})
            await publisher.aclose()
        redis.start()
        publisher({"seq": 2, "type": "text-delta"})
        await publisher.aclose()
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in lines] == ["agentrun.outages", "agentrun.outages"], [r.getMessage() for r in lines]
    assert lines[0].getMessage().startswith("channel layer unreachable: ConnectionError: ")
    assert lines[1].getMessage().startswith("channel layer reachable again after ")
    assert lines[1].getMessage().endswith("(5 operations failed meanwhile)")
    assert not any(r.exc_info for r in caplog.records)

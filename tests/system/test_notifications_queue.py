"""Webhooks go through the task queue (issue 14) in the production topology: the decision's own
transaction enqueues the event's handling; a worker of the ``notifications`` queue delivers it and
enqueues each retry with ``run_after`` its backoff; the continuation workers never see them."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from asgiref.sync import sync_to_async
from django_tasks_db.models import DBTaskResult

from agentrun.core.models import Run, SuspendedToolCall
from agentrun.engine.agents import get_agent
from notifications.models import WebhookDelivery, WebhookEndpoint
from tests.helpers.notifications import endpoint_owner
from tests.helpers.runs import EMAIL_LINE as EMAIL
from tests.helpers.users import reviewer_token

pytestmark = [pytest.mark.system, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


async def eventually(predicate, seconds: float = 30, what: str = "the condition"):  # noqa: ANN001, ANN201
    for _ in range(int(seconds / 0.05)):
        if value := await sync_to_async(predicate)():
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_decision_webhook_is_delivered_and_retried_by_the_notifications_worker(processes, receiver):  # noqa: F811
    receiver.answers = [500, 200]
    owner = await sync_to_async(endpoint_owner)()
    await WebhookEndpoint.objects.acreate(
        url=receiver.url, secret="whsec_c3lzdGVt", events=["toolcall.decided"], owner=owner
    )
    fast = {"AGENTRUN_WEBHOOK_RETRY_SECONDS": "0.5"}
    token = await reviewer_token("sysrev")
    _, port = processes.daphne("daphne", env=fast)
    processes.worker("worker", interval=0.2, env=fast)
    stream = await get_agent("support-agent").stream(EMAIL, memory={"thread": "sys-hooks"})
    assert (await stream.collect())[-1]["payload"]["finishReason"] == "suspended"

    call = await SuspendedToolCall.objects.aget(run_id=stream.run_id)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/agents/support-agent/runs/{stream.run_id}/approve",
        data=json.dumps({"toolCallId": call.tool_call_id}).encode(),
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        method="POST",
    )
    answer = await sync_to_async(urllib.request.urlopen)(request, timeout=10)
    assert answer.status == 202
    await eventually(lambda: Run.objects.filter(pk=stream.run_id, status="completed").exists(), what="the run")
    # Committed with the decision: the event's task waits on its queue, untouched by the default worker.
    queued = await sync_to_async(lambda: list(DBTaskResult.objects.values_list("queue_name", "task_path")))()
    assert ("notifications", "notifications.delivery.handle_event") in queued
    assert not receiver.requests

    processes.worker("notify", interval=5, env=fast, queues="notifications")
    row = await eventually(lambda: WebhookDelivery.objects.filter(status="delivered").first(), what="delivery")
    assert (row.attempts, row.response_status) == (2, 200)
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert second.at - first.at >= 0.5  # the retry waited for its run_after, not for the 5 s poll
    assert second.at - first.at < 4
    paths = await sync_to_async(lambda: list(DBTaskResult.objects.values_list("task_path", flat=True)))()
    assert paths.count("notifications.delivery.attempt_delivery") == 2

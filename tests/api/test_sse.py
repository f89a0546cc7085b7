"""Server-sent events (docs/api.md#server-sent-events) and decisions through the real ASGI application
(`agentrun.asgi`)."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from agentrun.core.models import Decision, RunChunk
from tests.helpers.asgi import AsgiClient, parse
from tests.helpers.runs import EMAIL, email_run, tool_line, wait_rested

pytestmark = pytest.mark.django_db(transaction=True)


async def read_events(response, *, stop_after_seq: int | None = None) -> list[dict]:
    """Read the event stream (to the end, or until ``stop_after_seq``, then hang up)."""
    events: list[dict] = []
    async for part in response.parts():
        events.extend(parse(part))
        if stop_after_seq is not None and any(e.get("id") == str(stop_after_seq) for e in events):
            await response.hang_up()
            break
    return events


def chunks_of(events: list[dict]) -> list[dict]:
    assert all(e["event"] in {"chunk", "done"} for e in events), events
    chunks = [json.loads(e["data"]) for e in events if e["event"] == "chunk"]
    for event, chunk in zip([e for e in events if e["event"] == "chunk"], chunks, strict=True):
        assert event["id"] == str(chunk["seq"])
        assert chunk["from"] == "AGENT"
    return chunks


def assert_ends_with_done(events: list[dict]) -> None:
    assert events[-1] == {"event": "done", "data": "[DONE]"}


@sync_to_async
def logged_seqs(run_id: str) -> list[int]:
    return list(RunChunk.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))


async def rested(run_id: str):
    # Not thread-sensitive: polling must not hold the one thread the engine's own DB calls need.
    return await sync_to_async(wait_rested, thread_sensitive=False)(run_id)


@pytest.fixture
def client(auth_header) -> AsgiClient:
    return AsgiClient(auth_header)


async def test_stream_a_new_run(client):
    response = await client.post("/api/agents/support-agent/stream", {"messages": "hello there friend"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache" and response["X-Accel-Buffering"] == "no"
    events = await read_events(response)
    assert_ends_with_done(events)
    chunks = chunks_of(events)
    assert [c["seq"] for c in chunks] == list(range(1, len(chunks) + 1))
    assert chunks[0]["type"] == "start" and chunks[-1]["type"] == "finish"
    assert "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta") == "Echo: hello there friend"


async def test_reconnecting_with_last_event_id_mid_stream_gets_the_rest_without_gap_or_duplicate(client):
    # The model sleeps after step-start: we hang up then, while the run is still producing.
    response = await client.post(
        "/api/agents/support-agent/stream/", {"messages": "/sleep 400\none two three four five six"}
    )
    first = chunks_of(await read_events(response, stop_after_seq=2))
    assert [c["seq"] for c in first] == [1, 2]
    run_id = first[0]["runId"]

    again = await client.get(f"/api/runs/{run_id}/stream", headers={"Last-Event-ID": "2"})
    assert again.status_code == 200
    events = await read_events(again)
    assert_ends_with_done(events)
    rest = chunks_of(events)
    seqs = [c["seq"] for c in first + rest]
    assert seqs == list(range(1, len(seqs) + 1))  # no gap, no duplicate
    assert rest[-1]["type"] == "finish"
    await rested(run_id)
    assert seqs == await logged_seqs(run_id)
    text = "".join(c["payload"]["text"] for c in rest if c["type"] == "text-delta")
    assert text.endswith("one two three four five six")


async def test_replay_with_after_and_last_event_id(client):
    response = await client.post("/api/agents/support-agent/stream", {"messages": "a b c"})
    chunks = chunks_of(await read_events(response))
    run_id = chunks[0]["runId"]
    await rested(run_id)
    replay = chunks_of(await read_events(await client.get(f"/api/runs/{run_id}/stream")))
    assert replay == chunks
    tail = chunks_of(await read_events(await client.get(f"/api/runs/{run_id}/stream/?after=3")))
    assert tail == chunks[3:]
    # Last-Event-ID wins over ?after=
    tail = chunks_of(
        await read_events(
            await client.get(f"/api/runs/{run_id}/stream?after=1", headers={"Last-Event-ID": str(len(chunks) - 1)})
        )
    )
    assert tail == chunks[-1:]


async def test_run_stream_errors(client):
    response = await client.get("/api/runs/run_nope/stream")
    assert response.status_code == 404 and (await response.json())["error"]["code"] == "RUN_NOT_FOUND"
    run_id = await sync_to_async(email_run)()
    for headers, path in (({"Last-Event-ID": "x"}, ""), ({}, "?after=-1")):
        response = await client.get(f"/api/runs/{run_id}/stream{path}", headers=headers)
        assert response.status_code == 400 and (await response.json())["error"]["code"] == "INVALID_REQUEST"
    # A suspended run rests: its stream replays and ends.
    events = await read_events(await client.get(f"/api/runs/{run_id}/stream"))
    assert_ends_with_done(events)
    assert chunks_of(events)[-1]["payload"]["finishReason"] == "suspended"


async def test_a_decision_with_accept_event_stream_streams_the_continuation(client):
    response = await client.post("/api/agents/support-agent/stream", {"messages": tool_line("send-email", EMAIL)})
    before = chunks_of(await read_events(response))
    run_id = before[0]["runId"]
    assert before[-1]["payload"]["finishReason"] == "suspended"

    response = await client.post(
        f"/api/agents/support-agent/runs/{run_id}/approve",
        {"reason": "ok"},
        headers={"Accept": "text/event-stream", "Idempotency-Key": "sse-1"},
    )
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    events = await read_events(response)
    assert_ends_with_done(events)
    after = chunks_of(events)
    assert after[0]["seq"] == before[-1]["seq"] + 1  # seq grows across segments
    assert {"tool-result", "finish"} <= {c["type"] for c in after}
    assert after[-1]["payload"]["finishReason"] == "stop"
    await rested(run_id)
    decision = await Decision.objects.aget(run_id=run_id)
    assert (decision.via, decision.reason) == ("api", "ok")

    # A retry with the same key replays the same continuation; still one decision.
    retry = await client.post(
        f"/api/agents/support-agent/runs/{run_id}/approve",
        {"reason": "ok"},
        headers={"Accept": "text/event-stream", "Idempotency-Key": "sse-1"},
    )
    assert chunks_of(await read_events(retry)) == after
    assert await Decision.objects.filter(run_id=run_id).acount() == 1
    # Without the header the retry answers the 202 body of the first answer.
    plain = await client.post(
        f"/api/agents/support-agent/runs/{run_id}/approve", {"reason": "ok"}, headers={"Idempotency-Key": "sse-1"}
    )
    assert plain.status_code == 202 and (await plain.json())["decision"] == "approve"


async def test_stream_errors_are_json_before_the_stream_starts(client):
    response = await client.post(
        "/api/agents/nobody/stream", {"messages": "x"}, headers={"Accept": "text/event-stream"}
    )
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert (await response.json())["error"]["code"] == "AGENT_NOT_FOUND"
    response = await AsgiClient().post("/api/agents/support-agent/stream", {"messages": "x"})
    assert response.status_code == 401


async def test_a_202_decision_continues_on_the_server_loop_after_the_response(client):
    run_id = await sync_to_async(email_run)()
    response = await client.post(f"/api/agents/support-agent/runs/{run_id}/approve", {})
    assert response.status_code == 202
    assert (await response.json())["status"] == "in_progress"
    run = await rested(run_id)
    assert run.status == "completed", run.last_error


async def test_a_client_that_hangs_up_does_not_stop_the_run(client):
    response = await client.post("/api/agents/support-agent/stream", {"messages": "/sleep 300\nstill here"})
    first = chunks_of(await read_events(response, stop_after_seq=1))
    run = await rested(first[0]["runId"])
    assert run.status == "completed", run.last_error

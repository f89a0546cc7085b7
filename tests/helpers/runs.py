"""Runs built the way a user builds them (through the engine), and waits for them to rest.

Runs are started with the offline ``directive`` model (docs/runs.md#the-offline-model): a line
``/tool <id> <json>`` of the user message makes a tool call. ``RecordingModel`` is the one scripted
piece: a language model that remembers what it was sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.utils import timezone

from agentrun.core.models import Decision, Run, RunChunk, RunStep, Snapshot, SuspendedToolCall
from agentrun.engine import store
from agentrun.engine.agents import get_agent
from agentrun.engine.providers import DirectiveModel

EMAIL = {"to": "ann@example.com", "subject": "Your order", "body": "It shipped."}
# The same email as one line of a user message (the directive model's tool call).
EMAIL_LINE = '/tool send-email {"to": "ada@example.com", "subject": "Hi", "body": "Hello"}'
# A supervisor's call of the billing agent as a sub-agent, which asks for a refund.
SUB_AGENT_REFUND = '/tool agent-billing-agent {"message": "/tool refund {\\"orderId\\": \\"o-1\\", \\"amount\\": 5}"}'


def tool_line(tool_id: str, args: dict | str) -> str:
    return f"/tool {tool_id} {args if isinstance(args, str) else json.dumps(args)}"


def is_rested(run: Run) -> bool:
    """Nobody drives the run (no live lease) and it rests: final, or waiting for people."""
    driven = run.lease_owner and run.lease_expires_at and run.lease_expires_at > timezone.now()
    return not driven and run.status not in (Run.Status.QUEUED, Run.Status.IN_PROGRESS)


async def rested(run_id: str, seconds: float = 10) -> Run:
    """After a 202 decision: wait until its queued continuation has run. Polls from the event loop, so
    the continuation's database calls are never stuck behind the waiting."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not is_rested(run := await Run.objects.aget(pk=run_id)):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"run {run_id} did not rest: {run.status}")
        await asyncio.sleep(0.02)
    return run


def of_type(chunks: list[dict], type_: str) -> list[dict]:
    return [c for c in chunks if c["type"] == type_]


def text_of(chunks: list[dict]) -> str:
    """The text the chunks carry (all text-deltas, joined)."""
    return "".join(c["payload"]["text"] for c in of_type(chunks, "text-delta"))


async def collect(stream_or_coro: Any) -> tuple[Any, list[dict]]:
    """Await a stream (or the coroutine returning one) and read it to the end."""
    stream = await stream_or_coro if not hasattr(stream_or_coro, "full_stream") else stream_or_coro
    chunks = await stream.collect()
    return stream, chunks


async def start(
    agent_id: str, message: str, *, thread: str | None = "thread-1", resource: str | None = "user-1", **options: Any
) -> tuple[Any, list[dict]]:
    """Start a run on a demo agent and read its first segment to the end."""
    memory = {"thread": thread, "resource": resource} if thread else None
    return await collect(get_agent(agent_id).stream(message, memory=memory, **options))


async def suspended_email_run(
    *, thread: str = "thread-1", resource: str = "user-1", agent_id: str = "support-agent", args: dict | None = None
) -> str:
    """A support-agent run waiting for approval of one ``send-email`` call; returns its run id."""
    stream, chunks = await start(agent_id, tool_line("send-email", args or EMAIL), thread=thread, resource=resource)
    assert of_type(chunks, "finish")[-1]["payload"]["finishReason"] == "suspended", chunks
    return stream.run_id


async def open_call_ids(agent_id: str, run_id: str) -> list[str]:
    page = await get_agent(agent_id).list_suspended_runs()
    run = next(r for r in page.runs if r.run_id == run_id)
    return [c.tool_call_id for c in run.tool_calls]


@sync_to_async
def set_created_at(run_id: str, created_at: datetime) -> None:
    """Move a run (and its snapshot) in time: the listing's date bounds apply to the run's createdAt."""
    Run.objects.filter(pk=run_id).update(created_at=created_at)
    Snapshot.objects.filter(run_id=run_id).update(created_at=created_at)


@sync_to_async
def load_run(run_id: str) -> Run:
    return Run.objects.get(pk=run_id)


@sync_to_async
def steps_of(run_id: str) -> list[RunStep]:
    return list(RunStep.objects.filter(run_id=run_id).order_by("created_at", "id"))


@sync_to_async
def chunk_rows(run_id: str) -> list[RunChunk]:
    return list(RunChunk.objects.filter(run_id=run_id).order_by("seq"))


# The content of the run's last assistant message (what the user reads), as the engine reads it.
final_answer = sync_to_async(store.final_answer)


@sync_to_async
def snapshot_exists(run_id: str) -> bool:
    return Snapshot.objects.filter(run_id=run_id).exists()


# --- from a synchronous test (its thread's database connection is the engine's) -------------------
def email_run(**kwargs: Any) -> str:
    """A support-agent run waiting for approval of one send-email call (made by the engine)."""
    return async_to_sync(suspended_email_run)(**kwargs)


def refund_run(*, thread: str = "thread-refund", resource: str = "user-1") -> str:
    """A billing-agent run waiting for approval of one refund call."""
    stream, _ = async_to_sync(start)(
        "billing-agent", tool_line("refund", {"orderId": "o-1", "amount": 5}), thread=thread, resource=resource
    )
    return stream.run_id


def ask_run(*, thread: str = "thread-ask", resource: str = "user-1") -> str:
    """A support-agent run whose ask-user call suspended for resume data."""
    stream, _ = async_to_sync(start)(
        "support-agent", tool_line("ask-user", {"question": "Which city?"}), thread=thread, resource=resource
    )
    return stream.run_id


def two_call_run(*, thread: str = "thread-two") -> str:
    message = "\n".join(
        [
            tool_line("send-email", {"to": "a@b.c", "subject": "s", "body": "b"}),
            tool_line("delete-record", {"table": "t", "id": 1}),
        ]
    )
    stream, _ = async_to_sync(start)("support-agent", message, thread=thread)
    return stream.run_id


@pytest.fixture
def make(db) -> dict[str, Callable[..., str]]:
    return {"email": email_run, "ask": ask_run, "two": two_call_run}


def start_run(
    message: str, *, thread: str = "thread-ui", resource: str = "user-ui", agent_id: str = "support-agent"
) -> str:
    """Start a run through the Python API and read its first segment; returns the run id."""
    stream, _ = async_to_sync(collect)(
        get_agent(agent_id).stream(message, memory={"thread": thread, "resource": resource})
    )
    return stream.run_id


def suspend(tool_id: str, args: dict | str, **kwargs: Any) -> str:
    return start_run(tool_line(tool_id, args), **kwargs)


def wait_rested(run_id: str, timeout: float = 10.0) -> Run:
    """Wait until a continuation running server-side is done: nobody holds the run's lease and it rests."""
    deadline = time.monotonic() + timeout
    while not is_rested(run := Run.objects.get(pk=run_id)):
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} did not rest: {run.status}")
        time.sleep(0.02)
    return run


def wait_until_final(run_id: str, timeout: float = 10.0) -> Run:
    """The continuation runs in the background after a dashboard decision: wait for it to end."""
    deadline = time.monotonic() + timeout
    while True:
        run = Run.objects.get(pk=run_id)
        if run.is_final:
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} is still {run.status}")
        time.sleep(0.05)


def row_counts() -> dict[str, int]:
    """What a refused request must leave as it was."""
    from agentrun.core.models import (
        Decision,
        IdempotencyKey,
        Message,
        SuspendedToolCall,
        ToolEffect,
    )

    return {
        model.__name__: model.objects.count()
        for model in (Run, Decision, Message, SuspendedToolCall, Snapshot, RunChunk, ToolEffect, IdempotencyKey)
    }


class RecordingModel(DirectiveModel):
    """The directive model, remembering the messages of every call (to check thread memory)."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[list[dict]] = []

    async def stream(self, messages: list[dict], tools: list) -> Any:
        self.calls.append([dict(m) for m in messages])
        async for event in super().stream(messages, tools):
            yield event


def bulk_suspended_runs(
    count: int,
    *,
    agents: int = 10,
    threads: int = 400,
    resources: int = 150,
    start: datetime | None = None,
    spacing_s: int = 37,
    apps: Any = None,
) -> list[str]:
    """Write ``count`` suspended runs straight to the tables (what the engine leaves behind), fast.

    Spread over ``agents`` agents (``bulk-agent-<n>``), threads and resources, with created_at one
    ``spacing_s`` apart from ``start``. For volume tests of the listing query only: nothing drives them.
    ``apps``: the models as of a migration (a migration test writes them before a later one).
    """
    from datetime import timedelta

    from django.apps import apps as current

    model = (apps or current).get_model
    Run, RunStep, Snapshot = model("agentrun", "Run"), model("agentrun", "RunStep"), model("agentrun", "Snapshot")
    SuspendedToolCall, Thread = model("agentrun", "SuspendedToolCall"), model("agentrun", "Thread")

    start = start or datetime(2024, 1, 1, tzinfo=UTC)
    thread_rows = [Thread(id=f"bulk-thread-{t}", resource_id=f"bulk-user-{t % resources}") for t in range(threads)]
    Thread.objects.bulk_create(thread_rows, batch_size=2000)
    runs, steps, snapshots, calls = [], [], [], []
    for i in range(count):
        agent_id = f"bulk-agent-{i % agents}"
        thread_id = f"bulk-thread-{(i * 7) % threads}"
        resource_id = f"bulk-user-{((i * 7) % threads) % resources}"
        created_at = start + timedelta(seconds=i * spacing_s)
        run_id, step_id, call_id = f"run_bulk_{i:07d}", f"step_bulk_{i:07d}", f"call_bulk_{i:07d}"
        runs.append(
            Run(
                id=run_id,
                agent_id=agent_id,
                thread_id=thread_id,
                resource_id=resource_id,
                status="suspended",
                created_at=created_at,
                started_at=created_at,
                suspended_at=created_at,
                step_count=1,
            )
        )
        steps.append(
            RunStep(
                id=step_id,
                run_id=run_id,
                agent_id=agent_id,
                thread_id=thread_id,
                type="tool_calls",
                created_at=created_at,
                step_details={
                    "type": "tool_calls",
                    "toolCalls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "send-email", "arguments": json.dumps(EMAIL), "output": None},
                        },
                    ],
                },
            )
        )
        snapshots.append(
            Snapshot(
                run_id=run_id,
                agent_id=agent_id,
                thread_id=thread_id,
                resource_id=resource_id,
                created_at=created_at,
                suspended_at=created_at,
                step_id=step_id,
            )
        )
        calls.append(
            SuspendedToolCall(
                run_id=run_id,
                step_id=step_id,
                tool_call_id=call_id,
                tool_name="send-email",
                args=EMAIL,
                requires_approval=True,
                created_at=created_at,
            )
        )
    for model, rows in ((Run, runs), (RunStep, steps), (Snapshot, snapshots), (SuspendedToolCall, calls)):
        model.objects.bulk_create(rows, batch_size=2000)
    return [r.id for r in runs]


# --- what a sweeper finds (tests/engine/test_sweeper.py, benchmarks/sweeper.py) --------------------
PAST = datetime(2020, 1, 1, tzinfo=UTC)


def make_due(run_ids: list[str]) -> None:
    """These waiting runs are past their time to live."""
    Snapshot.objects.filter(run_id__in=run_ids).update(expires_at=PAST)
    Run.objects.filter(pk__in=run_ids).update(expires_at=PAST)


def make_stalled(lease_expired: list[str], decided: list[str]) -> None:
    """Runs whose driver died (lease expired), and runs decided long ago that nobody continued."""
    Run.objects.filter(pk__in=lease_expired).update(
        status=Run.Status.IN_PROGRESS, lease_owner="host:1:dead", lease_expires_at=PAST
    )
    for call in SuspendedToolCall.objects.filter(run_id__in=decided).select_related("run"):
        decision = Decision.objects.create(
            run=call.run,
            agent_id=call.run.agent_id,
            thread_id=call.run.thread_id,
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            kind=Decision.Kind.APPROVE,
            via=Decision.Via.API,
            args=call.args,
            decided_at=PAST,  # decisions are append-only: made in the past, not moved there
        )
        SuspendedToolCall.objects.filter(pk=call.pk).update(status=SuspendedToolCall.Status.DECIDED, decision=decision)

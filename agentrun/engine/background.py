"""Background tool calls (docs/runs.md#background-tasks): dispatched through the Tasks framework, limited, retried,
timed out, cancellable, recovered when their process dies.

The model sees a placeholder at once; on completion the placeholder in the thread's memory is
replaced by the real result (or ``Background task failed: <msg>``) and ``background-task-*`` chunks
are appended to the run.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.tasks import task
from django.utils import timezone

from agentrun.core.chunks import ChunkType
from agentrun.core.errors import AgentRunError
from agentrun.core.models import BackgroundTask, Message, Run
from agentrun.core.timeutil import iso
from agentrun.engine.lease import announce
from agentrun.engine.registry import get_agent
from agentrun.engine.runtime import db
from agentrun.engine.store import output_text
from agentrun.engine.tools import Tool, ToolContext

logger = logging.getLogger("agentrun.background")

PLACEHOLDER = (
    'Background task started. Task ID: {id}. The tool "{name}" is running in the background. '
    "You will be notified when it completes."
)
HEARTBEAT_SECONDS = 1.0
CANCEL_POLL_SECONDS = 0.25


def placeholder(task_row: BackgroundTask) -> str:
    return PLACEHOLDER.format(id=task_row.id, name=task_row.tool_name)


def create(*, run_id: str, agent_id: str, thread_id: str, tool: Tool, tool_call_id: str, args: dict) -> BackgroundTask:
    """Record the task (pending); the caller dispatches it (``aenqueue``) once this has committed."""
    options = tool.background or {}
    with transaction.atomic():
        row, _ = BackgroundTask.objects.get_or_create(
            tool_call_id=tool_call_id,
            defaults={
                "run_id": run_id,
                "agent_id": agent_id,
                "thread_id": thread_id,
                "tool_name": tool.id,
                "args": args,
                "max_retries": int(options.get("max_retries", 0)),
                "timeout_ms": options.get("timeout_ms"),
            },
        )
    return row


# --- claiming under the concurrency limits ---------------------------------------------------------
def _agent_limit(agent_id: str) -> int | None:
    try:
        return get_agent(agent_id).background_concurrency
    except AgentRunError:
        return None


def claim(task_id: str) -> BackgroundTask | None:
    """pending → running if the global and per-agent limits allow; None otherwise (it stays queued)."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # Counting then claiming must not interleave between workers: one claimer at a time.
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [0x6167656E74])
        row = BackgroundTask.objects.select_for_update().filter(pk=task_id).first()
        if row is None or row.status != BackgroundTask.Status.PENDING:
            return None
        if row.cancel_requested:
            return None
        running = BackgroundTask.objects.filter(status=BackgroundTask.Status.RUNNING)
        if running.count() >= settings.AGENTRUN_BACKGROUND_CONCURRENCY:
            return None
        limit = _agent_limit(row.agent_id)
        if limit is not None and running.filter(agent_id=row.agent_id).count() >= limit:
            return None
        now = timezone.now()
        row.status = BackgroundTask.Status.RUNNING
        row.started_at = row.started_at or now
        row.heartbeat_at = now
        row.attempts += 1
        row.save(update_fields=["status", "started_at", "heartbeat_at", "attempts"])
    return row


def beat(task_id: str) -> bool:
    """Renew the heartbeat; True when someone asked to cancel the task."""
    BackgroundTask.objects.filter(pk=task_id, status=BackgroundTask.Status.RUNNING).update(heartbeat_at=timezone.now())
    return BackgroundTask.objects.filter(pk=task_id, cancel_requested=True).exists()


def finish(task_id: str, *, status: str, result: Any = None, error: str | None = None) -> BackgroundTask | None:
    """Record the end and replace the placeholder the model saw with the real result."""
    with transaction.atomic():
        row = BackgroundTask.objects.select_for_update().filter(pk=task_id).first()
        if row is None or row.is_final:
            return None
        row.status = status
        row.result = result
        row.error = error
        row.completed_at = timezone.now()
        row.save(update_fields=["status", "result", "error", "completed_at"])
        if status == BackgroundTask.Status.COMPLETED:
            content, tool_status = output_text(result), "ok"
        elif status == BackgroundTask.Status.CANCELLED:
            content, tool_status = "Background task cancelled", "error"
        else:
            content, tool_status = f"Background task failed: {error}", "error"
        Message.objects.filter(thread_id=row.thread_id, role=Message.Role.TOOL, tool_call_id=row.tool_call_id).update(
            content=content, tool_status=tool_status
        )
    return row


def next_pending(limit: int) -> list[str]:
    return list(
        BackgroundTask.objects.filter(status=BackgroundTask.Status.PENDING, cancel_requested=False)
        .order_by("created_at", "id")
        .values_list("id", flat=True)[:limit]
    )


async def dispatch_pending() -> int:
    """Enqueue queued tasks that may fit now (a claim that does not fit leaves them queued)."""
    ids = await db(next_pending)(settings.AGENTRUN_BACKGROUND_CONCURRENCY)
    for task_id in ids:
        await run_background_task.aenqueue(task_id)
    return len(ids)


def _request_cancel(task_id: str) -> tuple[BackgroundTask, bool]:
    with transaction.atomic():
        row = BackgroundTask.objects.select_for_update().filter(pk=task_id).first()
        if row is None:
            raise AgentRunError("NOT_FOUND", f"No background task {task_id}.")
        if row.is_final:
            raise AgentRunError("INVALID_REQUEST", f"Background task {task_id} has already ended ({row.status}).")
        row.cancel_requested = True
        row.save(update_fields=["cancel_requested"])
    if row.status == BackgroundTask.Status.PENDING:
        ended = finish(task_id, status=BackgroundTask.Status.CANCELLED, error="cancelled")
        if ended is not None:
            return ended, True
    return row, False


async def cancel(task_id: str) -> BackgroundTask:
    """Cancel a queued task at once; ask a running one to stop (its worker sees it within a beat)."""
    row, ended = await db(_request_cancel)(task_id)
    if ended:
        await _announce_end(row)
    return row


def recover_abandoned(stale_after: timedelta | None = None) -> int:
    """Tasks left ``running`` by a process that died (no heartbeat) go back to the queue."""
    stale_after = stale_after or timedelta(seconds=settings.AGENTRUN_LEASE_SECONDS)
    cutoff = timezone.now() - stale_after
    stale = list(
        BackgroundTask.objects.filter(status=BackgroundTask.Status.RUNNING, heartbeat_at__lt=cutoff).values_list(
            "id", flat=True
        )
    )
    for task_id in stale:
        BackgroundTask.objects.filter(pk=task_id, status=BackgroundTask.Status.RUNNING, heartbeat_at__lt=cutoff).update(
            status=BackgroundTask.Status.PENDING
        )
    return len(stale)


# --- execution ---------------------------------------------------------------------------------
@task
async def run_background_task(task_id: str) -> str | None:
    """Run one background tool call to its end (a worker of the Tasks framework calls this)."""
    row = await db(claim)(task_id)
    if row is None:
        return None
    tool = get_agent(row.agent_id).tools[row.tool_name]
    base = _chunk_base(row)
    await announce(row.run_id, [("background-task-running", {**base, "attempt": row.attempts})])
    run = await Run.objects.aget(pk=row.run_id)
    ctx = ToolContext(
        run_id=row.run_id,
        tool_call_id=row.tool_call_id,
        agent_id=row.agent_id,
        thread_id=row.thread_id,
        resource_id=run.resource_id,
        metadata=dict(run.metadata or {}),
    )
    status, result, error = await _execute_with_retries(row, tool, ctx)
    ended = await db(finish)(row.id, status=status, result=result, error=error)
    if ended is not None:
        await _announce_end(ended)
    await dispatch_pending()
    return status


async def _execute_with_retries(row: BackgroundTask, tool: Tool, ctx: ToolContext) -> tuple[str, Any, str | None]:
    timeout = row.timeout_ms / 1000 if row.timeout_ms else None
    attempt = 0
    while True:
        work = asyncio.ensure_future(asyncio.wait_for(tool.execute(row.args, ctx), timeout))
        cancelled = False
        while not work.done():
            done, _ = await asyncio.wait({work}, timeout=HEARTBEAT_SECONDS)
            if not done and await db(beat)(row.id):
                work.cancel()
                cancelled = True
        try:
            return BackgroundTask.Status.COMPLETED, work.result(), None
        except asyncio.CancelledError:
            if cancelled:
                return BackgroundTask.Status.CANCELLED, None, "cancelled"
            raise
        except TimeoutError:
            status, error = BackgroundTask.Status.TIMED_OUT, f"timed out after {row.timeout_ms} ms"
        except Exception as exc:
            status, error = BackgroundTask.Status.FAILED, str(exc) or type(exc).__name__
        if attempt >= row.max_retries:
            return status, None, error
        attempt += 1
        logger.info("background task %s: %s; retry %d of %d", row.id, error, attempt, row.max_retries)


def _chunk_base(row: BackgroundTask) -> dict:
    return {
        "taskId": row.id,
        "toolName": row.tool_name,
        "toolCallId": row.tool_call_id,
        "agentId": row.agent_id,
        "runId": row.run_id,
    }


async def _announce_end(row: BackgroundTask) -> None:
    base = _chunk_base(row)
    chunk: tuple[ChunkType, dict]
    if row.status == BackgroundTask.Status.COMPLETED:
        chunk = ("background-task-completed", {**base, "result": row.result, "completedAt": iso(row.completed_at)})
    elif row.status == BackgroundTask.Status.CANCELLED:
        chunk = ("background-task-cancelled", {**base, "completedAt": iso(row.completed_at)})
    else:
        chunk = (
            "background-task-failed",
            {**base, "error": {"message": row.error}, "status": row.status, "completedAt": iso(row.completed_at)},
        )
    await announce(row.run_id, [chunk])


# --- until_idle -----------------------------------------------------------------------------------
def idle_state(run_id: str) -> tuple[list[str], bool]:
    """(finished calls awaiting a continuation turn, anything still pending or running)."""
    rows = list(BackgroundTask.objects.filter(run_id=run_id).values("tool_call_id", "status", "continued_at"))
    finished = [
        r["tool_call_id"] for r in rows if r["status"] in BackgroundTask.FINAL_STATUSES and not r["continued_at"]
    ]
    busy = any(r["status"] in (BackgroundTask.Status.PENDING, BackgroundTask.Status.RUNNING) for r in rows)
    return finished, busy


def mark_continued(tool_call_ids: list[str]) -> None:
    BackgroundTask.objects.filter(tool_call_id__in=tool_call_ids).update(continued_at=timezone.now())

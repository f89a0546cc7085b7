"""Every database write the agent loop makes, each one a short transaction.

The loop (``engine/loop.py``) is async; these functions are sync and run through ``sync_to_async``.
Only the holder of a run's lease calls the writers below (except the lease functions themselves),
so chunk sequence numbers and step details have a single writer at a time. A write that changes a
run's state records its outbox event (``agentrun.core.outbox``) in the same transaction.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agentrun.core import outbox, prepared
from agentrun.core.fanout import notify_approvals
from agentrun.core.ids import new_id
from agentrun.core.models import (
    BackgroundTask,
    Decision,
    Message,
    Run,
    RunStep,
    Snapshot,
    SuspendedToolCall,
    Thread,
)
from agentrun.core.selectors import SuspendedRun, describe_open_calls
from agentrun.engine.chunklog import Added, ChunkLog
from agentrun.engine.providers import usage_dict
from agentrun.engine.types import OpenCall

# What a segment's last write sets, with the state it ends in, to release the run's lease in the same
# UPDATE (``RunLease.released``; docs/performance.md, "Decision cycle and topology (third pass)").
RELEASED = {"lease_owner": None, "lease_expires_at": None}


def one_write(*, event: str | None = None, agent_id: str = "") -> Any:
    """The transaction of a write that ``ChunkLog.flush_sync`` sends with its ``also`` statements: none
    where that is one statement (``prepared.one_statement``: atomic on its own, one round trip instead
    of BEGIN, N statements and COMMIT), unless the write records an outbox ``event`` that a listener
    wants (the event is written in the change's transaction)."""
    if prepared.one_statement() and (event is None or not outbox.wanted(event, agent_id)):
        return contextlib.nullcontext()
    return transaction.atomic()


def add_usage(a: dict | None, b: dict | None) -> dict:
    a = a or usage_dict(0, 0)
    b = b or usage_dict(0, 0)
    return usage_dict(a["promptTokens"] + b["promptTokens"], a["completionTokens"] + b["completionTokens"])


def output_text(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result, default=str)


def needs_driving(run: Run, calls: list[SuspendedToolCall]) -> bool:
    """A continuation has something to do: the run is not final, and not merely waiting for people.
    ``calls``: the run's call records (``waiting_calls``)."""
    if run.is_final:
        return False
    if run.status == Run.Status.SUSPENDED:
        return any(c.status != SuspendedToolCall.Status.OPEN for c in calls)
    return True


def calls_to_carry_out(run: Run) -> tuple[list[SuspendedToolCall], int | None]:
    """What a continuation reads once it holds the lease (in the same trip to the database thread): the
    run's call records (``waiting_calls``), and the first decided one marked executing (its id), as
    ``Segment._apply_decisions`` would do next. Nothing for a run that is final or just started."""
    if run.is_final or getattr(run, "started_now", False):
        return [], None
    if prepared.one_statement():
        # The call marked by the statement that reads them all (its UPDATE in a WITH): one round trip.
        calls, marked = _calls_with_decisions_and_steps(run.pk, mark_first=True)
        return _in_decision_order(calls), marked
    calls = waiting_calls(run.pk)
    first = next((c for c in calls if c.status != SuspendedToolCall.Status.OPEN), None)
    if first is None or not mark_executing(first):
        return calls, None
    return calls, first.pk


def run_exists(run_id: str) -> bool:
    return Run.objects.filter(pk=run_id).exists()


def load_run(run_id: str) -> Run:
    return Run.objects.get(pk=run_id)


# --- run life cycle -------------------------------------------------------------------------------
_HISTORY: dict[str, tuple[str, str, Any]] = {}


def _history_sql() -> tuple[str, str, Any]:
    """``load_history``'s statements (a sub-agent's run, a top-level run), written once per database,
    and the reader of the messages' ``tool_calls``: the run's own messages last, each part in
    (created_at, id) order."""
    vendor = prepared.connection().vendor
    if vendor not in _HISTORY:
        m, r = prepared.table(Message), prepared.table(Run)
        names = ("role", "content", "tool_calls", "tool_call_id", "tool_name", "tool_status")
        run_id, created_at = f"m.{m.column('run_id')}", f"m.{m.column('created_at')}"
        select = f"SELECT {', '.join(f'm.{m.column(n)}' for n in names)} FROM {m.name} m"
        order = f" ORDER BY CASE WHEN {run_id} = %s THEN 1 ELSE 0 END, {created_at}, m.{m.column('id')}"
        own = f"{select} WHERE m.{m.column('thread_id')} = %s AND {run_id} = %s"
        top = (
            f"{select} LEFT OUTER JOIN {r.name} r ON r.{r.column('id')} = {run_id} "
            f"WHERE m.{m.column('thread_id')} = %s AND ({run_id} = %s OR ({created_at} < %s "
            f"AND ({run_id} IS NULL OR r.{r.column('parent_run_id')} IS NULL)))"
        )
        _HISTORY[vendor] = (own + order, top + order, m.reader("tool_calls"))
    return _HISTORY[vendor]


def load_history(run: Run, instructions: str) -> list[dict]:
    """Thread memory: earlier messages of the thread go back to the model.

    A top-level run sees the thread's top-level conversation from before it started, then its own
    messages; a sub-agent's inner run sees only its own. Runs on one thread may wait and resume in any
    order: another run's messages written after this one started would split this run's tool calls
    from their results (and hide its last user message), so they are not part of its history.
    """
    history: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    own, top, tool_calls = _history_sql()
    if run.parent_run_id is None:
        created_at = prepared.table(Message).prep("created_at", run.created_at)
        rows = prepared.fetch(top, [run.thread_id, run.pk, created_at, run.pk])
    else:
        rows = prepared.fetch(own, [run.thread_id, run.pk, run.pk])
    for role, content, calls, tool_call_id, tool_name, tool_status in rows:
        history.append(
            {
                "role": role,
                "content": content,
                "tool_calls": tool_calls(calls),
                "tool_call_id": tool_call_id,
                "tool_name": tool_name,
                "tool_status": tool_status,
            }
        )
    return history


def flush_and_load_history(log: ChunkLog, run: Run, instructions: str) -> list[dict]:
    """Before a model call: the log flushed, and the history read (one trip to the database thread)."""
    log.flush_sync()
    return load_history(run, instructions)


def is_cancelled(run_id: str) -> bool:
    runs = prepared.table(Run)
    sql = f"SELECT 1 FROM {runs.name} WHERE {runs.column('id')} = %s AND {runs.column('status')} = %s"
    return bool(prepared.fetch(sql, [run_id, Run.Status.CANCELLED]))


def model_step_rows(
    run: Run, *, message_id: str, text: str, calls: list[dict], usage: dict, started_at: Any
) -> tuple[list[prepared.Statement], RunStep | None]:
    """The rows of one model call: its message, a ``message_creation`` step and/or a ``tool_calls``
    step (the INSERTs, and the tool_calls step, in progress, when the model asked for tools). The
    run's usage is added to (its UPDATE carries it)."""
    now = timezone.now()
    message = Message(
        id=message_id,
        thread_id=run.thread_id,
        run=run,
        role=Message.Role.ASSISTANT,
        content=text,
        tool_calls=calls or None,
    )
    steps = []
    if text or not calls:
        steps.append(
            RunStep(
                run=run,
                agent_id=run.agent_id,
                thread_id=run.thread_id,
                type=RunStep.Type.MESSAGE_CREATION,
                status=RunStep.Status.COMPLETED,
                step_details={"type": "message_creation", "messageCreation": {"messageId": message_id}},
                created_at=started_at,
                completed_at=now,
                usage=None if calls else usage,
            )
        )
    tool_step = None
    if calls:
        tool_step = RunStep(
            run=run,
            agent_id=run.agent_id,
            thread_id=run.thread_id,
            type=RunStep.Type.TOOL_CALLS,
            status=RunStep.Status.IN_PROGRESS,
            step_details={
                "type": "tool_calls",
                "toolCalls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {
                            "name": c["name"],
                            "arguments": c["args"] if isinstance(c["args"], str) else json.dumps(c["args"]),
                            "output": None,
                        },
                    }
                    for c in calls
                ],
            },
            created_at=started_at,
            usage=usage,  # hidden while the step is in progress (docs/runs.md#steps-and-statuses)
        )
        steps.append(tool_step)
    run.usage = add_usage(run.usage, usage)
    rows = [prepared.table(Message).insert_statement([message]), prepared.table(RunStep).insert_statement(steps)]
    return rows, tool_step


def record_model_step(
    run: Run, log: ChunkLog, *, message_id: str, text: str, calls: list[dict], usage: dict, started_at: Any
) -> RunStep | None:
    """Persist one model call that asked for tools (``model_step_rows``) with the chunks so far, the
    run's step count and usage: one write. Returns the tool_calls step (in progress)."""
    rows, tool_step = model_step_rows(
        run, message_id=message_id, text=text, calls=calls, usage=usage, started_at=started_at
    )
    with one_write():
        log.flush_sync(also=rows, step_count=Added(1), usage=run.usage)
    run.step_count += 1
    return tool_step


def record_model_failure(run: Run, log: ChunkLog, *, code: str, message: str, started_at: Any) -> None:
    now = timezone.now()
    error = {"code": code, "message": message}
    with transaction.atomic():
        log.flush_sync()
        RunStep.objects.create(
            run=run,
            agent_id=run.agent_id,
            thread_id=run.thread_id,
            type=RunStep.Type.MESSAGE_CREATION,
            status=RunStep.Status.FAILED,
            step_details={"type": "message_creation", "messageCreation": {"messageId": None}},
            last_error=error,
            created_at=started_at,
            failed_at=now,
        )
        fail_run_sync(run, error)


def fail_run_sync(run: Run, error: dict, log: ChunkLog | None = None) -> None:
    """The run failed; ``log``: its chunks so far (the error and the finish announcing it) go with it."""
    now = timezone.now()
    with transaction.atomic():
        if log is not None:
            log.flush_sync()
        failed = (
            Run.objects.filter(pk=run.pk)
            .exclude(status__in=Run.FINAL_STATUSES)
            .update(status=Run.Status.FAILED, failed_at=now, last_error=error)
        )
        if failed:
            _record_final_event(outbox.RUN_FAILED, run.pk, run.agent_id)
        RunStep.objects.filter(run=run, status=RunStep.Status.IN_PROGRESS).update(
            status=RunStep.Status.FAILED, failed_at=now, last_error=error
        )
        SuspendedToolCall.objects.filter(run=run).delete()
        Snapshot.objects.filter(run=run).delete()
    run.status = Run.Status.FAILED


def complete_run(
    run: Run,
    log: ChunkLog,
    *,
    release: bool = False,
    snapshot: bool = True,
    also: list[prepared.Statement] | None = None,
    **run_fields: Any,
) -> None:
    """The turn answered. The run completes, unless an until_idle stream still waits for its background
    tasks: then it stays ``in_progress`` until the stream's last continuation turn. ``run_fields`` go in
    the same UPDATE of the run; ``release``: so does releasing the lease (the segment ends here);
    ``also``: the rest of the write (the answer's rows). ``snapshot``: the run may still have a
    snapshot to remove. False when the run has not waited since its segment began (it was not
    suspended then, and did not suspend since): every change out of ``suspended`` removes the snapshot
    in its own transaction, so there is none (one statement less)."""
    if release:
        run_fields |= RELEASED
    answer = list(also or [])
    rows = [*answer, prepared.table(Snapshot).delete_statement('"run_id" = %s', [run.pk])] if snapshot else answer
    idle = bool(run.options.get("until_idle"))
    with transaction.atomic() if idle else one_write(event=outbox.RUN_COMPLETED, agent_id=run.agent_id):
        if idle and background_work_left(run.pk):
            log.flush_sync(also=answer, **run_fields)
            return
        chunks, next_seq = log.take_buffer()
        # The run's next_seq goes with its completion; only a run that ended meanwhile needs its own UPDATE.
        completed = log.write(
            {"status": Run.Status.COMPLETED, "completed_at": timezone.now(), "next_seq": next_seq, **run_fields},
            chunks,
            rows,
            unless_final=True,
        )
        if not completed:
            log.fenced_write({"next_seq": next_seq, **run_fields}, chunks, rows)
        if completed:
            _record_final_event(outbox.RUN_COMPLETED, run.pk, run.agent_id)
    run.status = Run.Status.COMPLETED


def record_answer(
    run: Run,
    log: ChunkLog,
    *,
    message_id: str,
    text: str,
    usage: dict,
    started_at: Any,
    release: bool = False,
    snapshot: bool = True,
) -> None:
    """The model answered without tools: its step and the run's completion are one write, the run's
    step count, usage, status and ``next_seq`` (and the lease, ``release``) in one UPDATE. ``snapshot``:
    as ``complete_run``'s."""
    rows, _ = model_step_rows(run, message_id=message_id, text=text, calls=[], usage=usage, started_at=started_at)
    complete_run(run, log, release=release, snapshot=snapshot, also=rows, step_count=Added(1), usage=run.usage)
    run.step_count += 1


def finish_idle_run(run_id: str, agent_id: str) -> None:
    """An until_idle stream closed: the run it kept open completes."""
    with transaction.atomic():
        completed = Run.objects.filter(pk=run_id, status=Run.Status.IN_PROGRESS).update(
            status=Run.Status.COMPLETED, completed_at=timezone.now()
        )
        if completed:
            _record_final_event(outbox.RUN_COMPLETED, run_id, agent_id)


def _record_final_event(type_: str, run_id: str, agent_id: str) -> None:
    """run.completed / run.failed, with the run object as it is now (in the caller's transaction)."""
    outbox.record(type_, agent_id=agent_id, run_id=run_id, data=lambda: Run.objects.get(pk=run_id).to_dict())


def record_tool_result(
    run: Run, step: RunStep, log: ChunkLog, *, call: dict, output: str, status: str, decided: bool = False
) -> bool:
    """Write one call's result: the step's ``output`` (the step completes with its last output), the
    tool message the model reads, and (``decided``: it waited for people) retire the call's record.

    ``step`` is the segment's copy: only the lease holder writes a run's steps, so it is current.
    Returns whether the step is complete.
    """
    for entry in step.step_details["toolCalls"]:
        if entry["id"] == call["id"]:
            entry["function"]["output"] = output
    fields = ["step_details"]
    if step.status == RunStep.Status.IN_PROGRESS and step_outputs_complete(step):
        step.status, step.completed_at = RunStep.Status.COMPLETED, timezone.now()
        fields += ["status", "completed_at"]
    message = Message(
        thread_id=run.thread_id,
        run=run,
        role=Message.Role.TOOL,
        content=output,
        tool_call_id=call["id"],
        tool_name=call["name"],
        tool_status=status,
    )
    rows = [prepared.table(RunStep).update_statement(step, fields), prepared.table(Message).insert_statement([message])]
    if decided:
        calls = prepared.table(SuspendedToolCall)
        rows.append(calls.delete_statement('"run_id" = %s AND "tool_call_id" = %s', [run.pk, call["id"]]))
    with one_write():
        log.flush_sync(also=rows)
    return step.status == RunStep.Status.COMPLETED


def step_outputs_complete(step: RunStep) -> bool:
    return all(e["function"]["output"] is not None for e in step.step_details["toolCalls"])


def calls_without_output(step: RunStep) -> list[dict]:
    """The step's calls that have no output yet: ``{id, name, args}`` (args as the model gave them)."""
    return [
        {"id": e["id"], "name": e["function"]["name"], "args": e["function"]["arguments"]}
        for e in step.step_details["toolCalls"]
        if e["function"]["output"] is None
    ]


def approved_call_ids(run_id: str, tool_call_ids: list[str]) -> set[str]:
    """Of these calls, those approved already (by a standing grant, as the loop ran them)."""
    approved = Decision.objects.filter(run_id=run_id, tool_call_id__in=tool_call_ids, kind=Decision.Kind.APPROVE)
    return set(approved.values_list("tool_call_id", flat=True))


def positions(step: RunStep) -> dict[str, int]:
    """Each call's place in its step (the order the model gave them)."""
    return {e["id"]: i for i, e in enumerate(step.step_details["toolCalls"])}


def complete_tool_step(step_id: str) -> None:
    RunStep.objects.filter(pk=step_id, status=RunStep.Status.IN_PROGRESS).update(
        status=RunStep.Status.COMPLETED, completed_at=timezone.now()
    )


def suspended_run_ttl(agent_ttl: float | None) -> timedelta | None:
    ttl = agent_ttl if agent_ttl is not None else settings.AGENTRUN_SUSPENDED_RUN_TTL
    return timedelta(seconds=ttl) if ttl else None


def record_suspension(
    run: Run,
    step_id: str,
    log: ChunkLog,
    *,
    opens: list[OpenCall],
    ttl: timedelta | None,
    new_calls: bool = False,
    release: bool = False,
) -> None:
    """The run waits for people: open calls recorded together, snapshot written, status ``suspended``.

    ``new_calls``: the calls come from the model's latest step, so none has a record yet. ``release``:
    the segment ends here, and the run's UPDATE releases its lease too.
    """
    now = timezone.now()
    expires_at = now + ttl if ttl else None
    with transaction.atomic():
        existing = (
            {}
            if new_calls
            else {
                c.tool_call_id: c
                for c in SuspendedToolCall.objects.filter(run=run, tool_call_id__in=[o.tool_call_id for o in opens])
            }
        )
        created = []
        for call in opens:
            waiting, inner = call.waiting, call.waiting.inner
            fields = {
                "step_id": step_id,
                "tool_name": call.tool_name,
                "args": call.args,
                "requires_approval": waiting.requires_approval,
                "risk": call.risk,
                "approvals_required": call.approvals_required,
                "pending_args": None,
                "suspend_payload": waiting.suspend_payload,
                "resume_schema": waiting.resume_schema,
                "position": call.position,
                "status": SuspendedToolCall.Status.OPEN,
                "decision": None,
                "inner_agent_id": inner.agent_id if inner else None,
                "inner_run_id": inner.run_id if inner else None,
                "inner_tool_call_id": inner.tool_call_id if inner else None,
                # A timeout policy's deadlines (approval calls of a tool with approval_timeout).
                "timeout_at": call.timeout_at,
                "warn_at": call.warn_at,
                "on_timeout": call.on_timeout,
                # When this suspension began: a decision's time to decision runs from here (a resumed
                # call that suspends again starts waiting anew).
                "created_at": now,
            }
            row = existing.get(call.tool_call_id)
            if row is None:
                created.append(
                    SuspendedToolCall(
                        run=run, tool_call_id=call.tool_call_id, suspension=call.first_suspension, **fields
                    )
                )
            else:  # a resumed tool suspended again: a new suspension of the same call
                for key, value in fields.items():
                    setattr(row, key, value)
                row.suspension += 1
                row.save()
        rows = [prepared.table(SuspendedToolCall).insert_statement(created)] if created else []
        # Written, or rewritten when the run already waits on other calls (one statement either way).
        snapshot_fields = {
            "agent_id": run.agent_id,
            "thread_id": run.thread_id,
            "resource_id": run.resource_id,
            "created_at": run.created_at,
            "suspended_at": now,
            "expires_at": expires_at,
            "step_id": step_id,
        }
        snapshots = prepared.table(Snapshot)
        snapshot = snapshots.insert_statement(
            [Snapshot(run=run, **snapshot_fields)], suffix=_snapshot_upsert(snapshots)
        )
        log.flush_sync(
            also=rows,
            status=Run.Status.SUSPENDED,
            suspended_at=now,
            expires_at=expires_at,
            **(RELEASED if release else {}),
        )
        # A statement of its own, after the calls': the counters' triggers lock their rows, the waiting
        # calls' before the listing's, in the order every writer takes them (a decision, a cancellation,
        # an expiry), so that writers of one agent's runs never deadlock. (In one WITH statement the
        # order of its parts' triggers is PostgreSQL's, not the text's.)
        prepared.execute(snapshot.sql, snapshot.params)
        outbox.record(
            outbox.RUN_SUSPENDED, agent_id=run.agent_id, run_id=run.id, data=lambda: suspended_run(run, now).to_dict()
        )
        transaction.on_commit(
            lambda: notify_approvals(
                "suspended",
                runId=run.id,
                agentId=run.agent_id,
                threadId=run.thread_id,
                toolCallIds=[c.tool_call_id for c in opens],
            )
        )
    run.status = Run.Status.SUSPENDED


def _snapshot_upsert(snapshots: prepared.Table) -> str:
    columns = [
        snapshots.column(n)
        for n in ("agent_id", "thread_id", "resource_id", "created_at", "suspended_at", "expires_at", "step")
    ]
    sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns)
    return f" ON CONFLICT ({snapshots.column('run')}) DO UPDATE SET {sets}"


def suspended_run(run: Run, suspended_at: Any) -> SuspendedRun:
    """The run as the listing shows it (docs/api.md#the-listing), with the calls open now."""
    calls = describe_open_calls(SuspendedToolCall.objects.filter(run_id=run.pk).order_by("position", "id"))
    return SuspendedRun(
        run_id=run.pk,
        agent_id=run.agent_id,
        thread_id=run.thread_id,
        resource_id=run.resource_id,
        created_at=run.created_at,
        suspended_at=suspended_at,
        started_by=run.started_by_username,
        tool_calls=calls.get(run.pk, []),
    )


def first_open_call(run_id: str) -> SuspendedToolCall | None:
    return SuspendedToolCall.objects.filter(run_id=run_id, status=SuspendedToolCall.Status.OPEN).first()


def waiting_calls(run_id: str) -> list[SuspendedToolCall]:
    """Every call of the run that has a record: the open ones, and the decided ones to carry out, in the
    order they were decided (their decisions and steps loaded along)."""
    # Sorted here, not by the query: a run has a few calls, and Django compiles the NULLS LAST ordering
    # over a join (and the deciding account's join, which nothing here reads) at a cost the worker
    # paid on every continuation (docs/performance.md, "Decision cycle and topology (third pass)").
    return _in_decision_order(_calls_with_decisions_and_steps(run_id)[0])


def _in_decision_order(calls: list[SuspendedToolCall]) -> list[SuspendedToolCall]:
    """The decided calls in the order they were decided, then the others by their place in the step."""
    decided = sorted(
        ((c.decision.decided_at, c.position, c.id, c) for c in calls if c.decision is not None),
        key=lambda entry: entry[:3],
    )
    return [entry[3] for entry in decided] + sorted(
        (c for c in calls if c.decision is None), key=lambda c: (c.position, c.id)
    )


_WAITING: dict[tuple[str, bool], str] = {}


def _waiting_sql(mark_first: bool) -> str:
    calls, decisions, steps = (prepared.table(m) for m in (SuspendedToolCall, Decision, RunStep))
    decision_id, step_id, call_run = (f"{calls.name}.{calls.column(n)}" for n in ("decision", "step", "run"))
    joins = (
        f"FROM {calls.name} "
        f"LEFT OUTER JOIN {decisions.name} ON {decisions.name}.{decisions.column('id')} = {decision_id} "
    )
    is_marked = f", {calls.name}.{calls.column('id')} IN (SELECT id FROM marked)" if mark_first else ""
    sql = (
        f"SELECT {calls.select}, {decisions.select}, {steps.select}{is_marked} {joins}"
        f"INNER JOIN {steps.name} ON {steps.name}.{steps.column('id')} = {step_id} WHERE {call_run} = %s"
    )
    if not mark_first:
        return sql
    # The first call not open, in _in_decision_order's order, marked executing unless it changed
    # meanwhile (mark_executing's condition). The SELECT reads the rows as they were before the
    # UPDATE: the marked one still shows its earlier status.
    status, decided_at = calls.column("status"), f"{decisions.name}.{decisions.column('decided_at')}"
    first = (
        f"SELECT {calls.name}.{calls.column('id')} {joins}WHERE {call_run} = %s AND {calls.name}.{status} <> %s "
        f"ORDER BY {decided_at} IS NULL, {decided_at}, {calls.name}.{calls.column('position')}, "
        f"{calls.name}.{calls.column('id')} LIMIT 1"
    )
    marked = (
        f"UPDATE {calls.name} SET {status} = %s WHERE {calls.column('id')} = ({first}) "
        f"AND {status} IN (%s, %s) RETURNING {calls.column('id')}"
    )
    return f"WITH marked AS ({marked}) {sql}"


def _calls_with_decisions_and_steps(
    run_id: str, *, mark_first: bool = False
) -> tuple[list[SuspendedToolCall], int | None]:
    """The run's call records with their decisions and steps (``select_related``'s rows, by SQL written
    once: every continuation reads them). ``mark_first`` (PostgreSQL): the same statement marks the
    first call to carry out executing, as ``mark_executing`` would: its id is returned (None if none)."""
    calls, decisions, steps = (prepared.table(m) for m in (SuspendedToolCall, Decision, RunStep))
    key = (prepared.connection().vendor, mark_first)
    sql = _WAITING.get(key) or _WAITING.setdefault(key, _waiting_sql(mark_first))
    params: list[Any] = [run_id]
    if mark_first:
        carried_out = [SuspendedToolCall.Status.DECIDED, SuspendedToolCall.Status.EXECUTING]
        params = [SuspendedToolCall.Status.EXECUTING, run_id, SuspendedToolCall.Status.OPEN, *carried_out, run_id]
    found, marked = [], None
    after_call, after_decision = len(calls.fields), len(calls.fields) + len(decisions.fields)
    for row in prepared.fetch(sql, params):
        call = calls.instance(row)
        call.decision = decisions.instance(row, after_call) if row[after_call] is not None else None
        call.step = steps.instance(row, after_decision)
        if mark_first and row[-1]:
            marked = call.pk
        found.append(call)
    return found, marked


def mark_executing(call: SuspendedToolCall) -> bool:
    """False if the call no longer waits to be carried out (its run was cancelled or expired meanwhile)."""
    # A retried continuation finds the call still ``executing`` and runs it again with the same
    # tool_call_id: the idempotency key that lets the tool apply its side effect once.
    calls = prepared.table(SuspendedToolCall)
    status = calls.column("status")
    sql = f"UPDATE {calls.name} SET {status} = %s WHERE {calls.column('id')} = %s AND {status} IN (%s, %s)"
    carried_out = [SuspendedToolCall.Status.DECIDED, SuspendedToolCall.Status.EXECUTING]
    return prepared.execute(sql, [SuspendedToolCall.Status.EXECUTING, call.pk, *carried_out]) == 1


def pending_tool_step(run_id: str) -> RunStep | None:
    return (
        RunStep.objects.filter(run_id=run_id, type=RunStep.Type.TOOL_CALLS, status=RunStep.Status.IN_PROGRESS)
        .order_by("-created_at", "-id")
        .first()
    )


def create_run(
    *,
    agent_id: str,
    messages: list[dict],
    thread_id: str | None,
    resource_id: str | None,
    metadata: dict,
    options: dict,
    parent_run_id: str | None = None,
    parent_tool_call_id: str | None = None,
    started_by: Any = None,
    lease: tuple[str, datetime] | None = None,
) -> Run:
    """A queued run on its thread (a thread of its own when no memory is given), with its input.

    ``lease``: (owner, expiry) of a creator that drives the run at once (``lease.create_run_to_drive``):
    the INSERT starts it and takes its lease, so driving it needs no statement of its own for that."""
    thread_id = thread_id or new_id("thread")
    run = Run(
        agent_id=agent_id,
        thread_id=thread_id,
        resource_id=resource_id,
        parent_run_id=parent_run_id,
        parent_tool_call_id=parent_tool_call_id,
        metadata=metadata,
        options=options,
        started_by=started_by,
        started_by_username=started_by.get_username() if started_by is not None else None,
    )
    if lease is not None:
        run.status, run.started_at = Run.Status.IN_PROGRESS, run.created_at
        run.lease_owner, run.lease_expires_at = lease
    # The thread created unless it exists.
    thread = prepared.table(Thread).insert_statement(
        [Thread(id=thread_id, resource_id=resource_id)], suffix=" ON CONFLICT DO NOTHING"
    )
    inputs = [Message(thread_id=thread_id, run=run, role=m["role"], content=m["content"]) for m in messages]
    created = prepared.table(Run).insert_statement([run])
    rows = [thread, prepared.table(Message).insert_statement(inputs)] if inputs else [thread]
    if prepared.one_statement():
        # One statement (the run's INSERT first, the others gated on it): atomic on its own; the
        # foreign keys are checked at its end.
        prepared.run_gated(prepared.Statement(f"{created.sql} RETURNING {prepared.quote('id')}", created.params), rows)
        return run
    with transaction.atomic():
        for statement in (thread, created, *rows[1:]):
            prepared.execute(statement.sql, statement.params)
    return run


def final_answer(run_id: str) -> str:
    """The content of the run's last assistant message."""
    message = Message.objects.filter(run_id=run_id, role=Message.Role.ASSISTANT).order_by("-created_at", "-id").first()
    return message.content if message else ""


def add_message(run: Run, *, role: str, content: str) -> None:
    Message.objects.create(thread_id=run.thread_id, run=run, role=role, content=content)


def background_work_left(run_id: str) -> bool:
    """A background task of the run still runs, or finished without a continuation turn yet."""
    return (
        BackgroundTask.objects.filter(run_id=run_id)
        .filter(
            Q(status__in=[BackgroundTask.Status.PENDING, BackgroundTask.Status.RUNNING]) | Q(continued_at__isnull=True)
        )
        .exists()
    )

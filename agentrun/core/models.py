from __future__ import annotations

import hashlib
import json
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from agentrun.core.ids import new_id
from agentrun.core.timeutil import iso


def args_fingerprint(args: Any) -> str:
    """docs/api.md#argsfingerprint: sha256 (hex) of the canonical JSON of a call's arguments.

    A person approves what they saw: every decision surface may send the fingerprint of the arguments it
    displayed, and the decision is refused (``ARGS_CHANGED``) when the call's arguments are not those.
    """
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _run_id() -> str:
    return new_id("run")


def _step_id() -> str:
    return new_id("step")


def _message_id() -> str:
    return new_id("msg")


def _decision_id() -> str:
    return new_id("dec")


class Thread(models.Model):
    """A conversation: its messages are the memory the model sees on every run of the thread."""

    id = models.CharField(primary_key=True, max_length=255)
    resource_id = models.CharField(max_length=255, null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(default=timezone.now)
    metadata = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return self.id


# When a final run ended (exactly one of these is set once it is final), and the final statuses.
RUN_ENDED_AT = Coalesce("completed_at", "failed_at", "cancelled_at", "expired_at")
RUN_FINAL_STATUSES = ["cancelled", "completed", "expired", "failed"]


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        IN_PROGRESS = "in_progress"
        SUSPENDED = "suspended"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        EXPIRED = "expired"

    FINAL_STATUSES = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.EXPIRED})
    ENDED_AT = RUN_ENDED_AT

    id = models.CharField(primary_key=True, max_length=40, default=_run_id, editable=False)
    agent_id = models.CharField(max_length=128, db_index=True)
    thread = models.ForeignKey(Thread, on_delete=models.PROTECT, related_name="runs")
    resource_id = models.CharField(max_length=255, null=True, blank=True)
    parent_run = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True, related_name="child_runs")
    parent_tool_call_id = models.CharField(max_length=128, null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    suspended_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_error = models.JSONField(null=True, blank=True)
    usage = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # Per-run engine options (max_steps, require_tool_approval), kept so continuations honour them.
    options = models.JSONField(default=dict, blank=True)
    step_count = models.PositiveIntegerField(default=0)
    # Next chunk sequence number; only the lease holder writes chunks, so it is the only writer.
    next_seq = models.PositiveIntegerField(default=1)
    # Whoever drives the run (one segment at a time) holds the lease; an expired lease can be taken over.
    # Who started the run: the request's user at a door (REST, websocket, dashboard), none from Python
    # code. With AGENTRUN_SELF_APPROVAL=0 that person's approval does not count (docs/api.md#approvals).
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    started_by_username = models.CharField(max_length=150, null=True, blank=True)
    lease_owner = models.CharField(max_length=64, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("start_run", "Can start runs"), ("cancel_run", "Can cancel runs")]
        indexes = [
            models.Index(fields=["thread", "created_at"], name="run_thread_created"),
            # Serves the sweep's expired-lease query (lease.claim_stalled_runs): only runs being driven
            # (or dispatched) hold a lease, so its cost follows the runs in flight, not the history.
            models.Index(fields=["lease_expires_at"], name="run_lease_expiry", condition=Q(lease_owner__isnull=False)),
            # Serves the retention's chunk-log compaction (agentrun.core.retention): final runs in the order
            # they ended (``ended_at``), read from a cursor a batch at a time.
            models.Index(RUN_ENDED_AT, F("id"), name="run_ended", condition=Q(status__in=RUN_FINAL_STATUSES)),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def is_final(self) -> bool:
        return self.status in self.FINAL_STATUSES

    def to_dict(self) -> dict:
        """The run object (docs/api.md#runs-steps-and-messages)."""
        return {
            "id": self.id,
            "object": "thread.run",
            "agentId": self.agent_id,
            "threadId": self.thread_id,
            "resourceId": self.resource_id,
            "parentRunId": self.parent_run_id,
            "status": self.status,
            "createdAt": iso(self.created_at),
            "startedAt": iso(self.started_at),
            "suspendedAt": iso(self.suspended_at),
            "completedAt": iso(self.completed_at),
            "failedAt": iso(self.failed_at),
            "cancelledAt": iso(self.cancelled_at),
            "expiredAt": iso(self.expired_at),
            "expiresAt": iso(self.expires_at),
            "lastError": self.last_error,
            "usage": self.usage,
            "metadata": self.metadata or {},
            "startedBy": self.started_by_username,
        }


class RunStep(models.Model):
    """One model call or one batch of tool calls (Azure ``RunStep``)."""

    class Type(models.TextChoices):
        MESSAGE_CREATION = "message_creation"
        TOOL_CALLS = "tool_calls"

    class Status(models.TextChoices):
        IN_PROGRESS = "in_progress"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        EXPIRED = "expired"

    id = models.CharField(primary_key=True, max_length=40, default=_step_id, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps")
    agent_id = models.CharField(max_length=128)
    thread_id = models.CharField(max_length=255)
    type = models.CharField(max_length=20, choices=Type.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.IN_PROGRESS)
    step_details = models.JSONField(default=dict)
    last_error = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    usage = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        # Serves GET /api/runs/{id}/steps (cursor over created_at, id in either order).
        indexes = [models.Index(fields=["run", "created_at", "id"], name="step_run_timeline")]

    def __str__(self) -> str:
        return self.id

    def to_dict(self) -> dict:
        """The step object (docs/api.md#runs-steps-and-messages; Azure ``RunStep``): usage is null while in progress."""
        return {
            "id": self.id,
            "object": "thread.run.step",
            "type": self.type,
            "assistantId": self.agent_id,
            "threadId": self.thread_id,
            "runId": self.run_id,
            "status": self.status,
            "stepDetails": self.step_details,
            "lastError": self.last_error,
            "createdAt": iso(self.created_at),
            "completedAt": iso(self.completed_at),
            "cancelledAt": iso(self.cancelled_at),
            "failedAt": iso(self.failed_at),
            "expiredAt": iso(self.expired_at),
            "usage": None if self.status == self.Status.IN_PROGRESS else self.usage,
            "metadata": self.metadata or {},
        }


class Message(models.Model):
    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"
        TOOL = "tool"

    id = models.CharField(primary_key=True, max_length=40, default=_message_id, editable=False)
    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="messages")
    run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="messages")
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True, default="")
    # assistant: [{id, name, args}]; tool: the call it answers and how it ended (ok / error / denied).
    tool_calls = models.JSONField(null=True, blank=True)
    tool_call_id = models.CharField(max_length=128, null=True, blank=True)
    tool_name = models.CharField(max_length=128, null=True, blank=True)
    tool_status = models.CharField(max_length=16, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        # Serves thread memory (all messages of a thread in order) and the messages endpoint.
        indexes = [models.Index(fields=["thread", "created_at", "id"], name="message_thread_timeline")]

    def __str__(self) -> str:
        return self.id

    def to_dict(self) -> dict:
        data = {
            "id": self.id,
            "object": "thread.message",
            "threadId": self.thread_id,
            "runId": self.run_id,
            "role": self.role,
            "content": self.content,
            "createdAt": iso(self.created_at),
        }
        if self.tool_calls:
            data["toolCalls"] = self.tool_calls
        if self.role == self.Role.TOOL:
            data |= {"toolCallId": self.tool_call_id, "toolName": self.tool_name, "toolStatus": self.tool_status}
        return data


class Snapshot(models.Model):
    """The persisted state of a waiting run. Exists only while the run is suspended.

    The listing contract reads this table (never memory), so it carries the filter columns itself.
    """

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="snapshot")
    agent_id = models.CharField(max_length=128)
    thread_id = models.CharField(max_length=255)
    resource_id = models.CharField(max_length=255, null=True, blank=True)
    created_at = models.DateTimeField()  # the run's createdAt: the listing's date bounds apply to it
    suspended_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    step = models.ForeignKey(RunStep, on_delete=models.CASCADE, related_name="+")

    class Meta:
        # Each index serves list_suspended_runs: WHERE agent_id = ? [AND thread_id | resource_id = ?]
        # [AND created_at BETWEEN ? AND ?] ORDER BY created_at DESC, run_id DESC.
        indexes = [
            models.Index(fields=["agent_id", "-created_at", "-run"], name="snapshot_agent_created"),
            models.Index(fields=["agent_id", "thread_id", "-created_at", "-run"], name="snapshot_agent_thread"),
            models.Index(fields=["agent_id", "resource_id", "-created_at", "-run"], name="snapshot_agent_resource"),
            # Serves the listing across agents (GET /api/suspended-runs): WHERE agent_id IN (…) ORDER BY
            # created_at DESC, run_id DESC LIMIT n reads it in order, filtering on the agent, and stops.
            models.Index(fields=["-created_at", "-run"], name="snapshot_created"),
            # Serves the sweep's expiry query (decisions.expire_due_runs): waiting runs with a TTL only.
            models.Index(fields=["expires_at"], name="snapshot_expiry", condition=Q(expires_at__isnull=False)),
            # Serves the listing total's correction: the agent's snapshots past their time to live that the
            # sweeper has not removed yet (WHERE agent_id = ? AND expires_at <= now), few by construction.
            models.Index(
                fields=["agent_id", "expires_at"], name="snapshot_agent_expiry", condition=Q(expires_at__isnull=False)
            ),
            # Serves the longest waits of an agent (the metrics page's "slowest waits now", the oldest wait
            # per agent on /metrics): WHERE agent_id = ? ORDER BY suspended_at LIMIT n.
            models.Index(fields=["agent_id", "suspended_at"], name="snapshot_agent_waiting"),
        ]

    def __str__(self) -> str:
        return f"snapshot of {self.run_id}"


class ListingItem(models.Model):
    """PostgreSQL: a waiting run's listing item (docs/api.md#the-listing) as the JSON text the listings
    send, kept whole at write time so that a listing reads it instead of building it
    (docs/performance.md, "Fifth pass").

    Written only by database triggers (migration ``0020_listing_items``) on the rows the item is made
    of: the run's snapshot, its calls, its starter's name. Each refresh runs in the statement that
    changed one of them, hence in its transaction: a reader never sees an item older than the rows.
    No row where SQL leaves the run to Python (``selectors._ITEM_SQL``). At most a row per snapshot,
    keyed by its run, without a relation Django knows of (deleting a snapshot deletes its item in the
    database, with no query of Django's). SQLite: empty, its listings build every item in Python.
    """

    run_id = models.CharField(primary_key=True, max_length=40)
    item = models.TextField(editable=False)

    def __str__(self) -> str:
        return f"listing item of {self.run_id}"


class SnapshotCount(models.Model):
    """How many snapshots (waiting runs) an agent has, in all and on each of its threads and resources:
    the listing's ``total`` is a sum of a few of these rows instead of a count over the snapshots.

    Written only by database triggers on ``Snapshot`` (migration ``0009_listing_counters``), in the
    statement that inserts, updates or deletes the snapshot, so the count is exact whoever writes
    snapshots (the engine, the admin, a cascade, a bulk load) and commits or rolls back with them.
    Each key is spread over ``SLOTS`` rows (the slot follows from the run id), so concurrent
    suspensions of one agent seldom wait on one row lock; a key's count is the sum of its rows. A row
    whose count falls to zero is deleted by the same trigger.
    """

    SLOTS = 8

    class Scope(models.TextChoices):
        AGENT = "agent"
        THREAD = "thread"
        RESOURCE = "resource"

    agent_id = models.CharField(max_length=128)
    scope = models.CharField(max_length=8, choices=Scope.choices)
    scope_id = models.CharField(max_length=255, blank=True, default="")  # the thread or resource; "" for agent
    slot = models.PositiveSmallIntegerField()
    snapshots = models.BigIntegerField()

    class Meta:
        constraints = [
            # The triggers' upsert target; the listing reads a key's rows through it too.
            models.UniqueConstraint(
                fields=["agent_id", "scope", "scope_id", "slot"], name="one_snapshot_count_per_slot"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id} {self.scope} {self.scope_id}#{self.slot}: {self.snapshots}"


class SnapshotPeriodCount(models.Model):
    """How many of an agent's snapshots were created in each minute, hour and day (UTC, by the run's
    ``createdAt``): a listing total with ``fromDate``/``toDate`` sums the whole periods inside its bounds
    and counts only the snapshots of its two partial edge minutes (``selectors._dated_total``).

    Written only by database triggers on ``Snapshot`` (migration ``0018_listing_period_counts``), as
    ``SnapshotCount`` is: exact whoever writes snapshots, committed or rolled back with them, each key
    spread over ``SLOTS`` rows, a row deleted when its count falls to zero.
    """

    SLOTS = 8
    WIDTHS = (60, 3600, 86400)  # seconds: a minute, an hour, a day

    agent_id = models.CharField(max_length=128)
    width = models.PositiveIntegerField()
    bucket = models.BigIntegerField()  # the period's start, in seconds since the epoch (a multiple of width)
    slot = models.PositiveSmallIntegerField()
    snapshots = models.BigIntegerField()

    class Meta:
        constraints = [
            # The triggers' upsert target; a total reads each agent's ranges of periods through it too.
            models.UniqueConstraint(
                fields=["agent_id", "width", "bucket", "slot"], name="one_snapshot_period_count_per_slot"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id} {self.width}s@{self.bucket}#{self.slot}: {self.snapshots}"


class SuspendedToolCall(models.Model):
    """A tool call that waits for a person (open), or was decided and waits to be applied."""

    class Status(models.TextChoices):
        OPEN = "open"
        DECIDED = "decided"
        EXECUTING = "executing"

    class Risk(models.TextChoices):
        LOW = "low"
        MEDIUM = "medium"
        HIGH = "high"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="suspended_calls")
    step = models.ForeignKey(RunStep, on_delete=models.CASCADE, related_name="suspended_calls")
    tool_call_id = models.CharField(max_length=128)
    tool_name = models.CharField(max_length=128)
    args = models.JSONField(null=True, blank=True)
    requires_approval = models.BooleanField()
    suspend_payload = models.JSONField(null=True, blank=True)
    resume_schema = models.JSONField(null=True, blank=True)
    position = models.PositiveIntegerField(default=0)
    # How many times this call suspended before (a resumed tool may suspend again).
    suspension = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    # How dangerous the call is, for the person deciding it (the tool's ``risk``; docs/runs.md#approval).
    risk = models.CharField(max_length=8, choices=Risk.choices, default=Risk.MEDIUM)
    # The decision this call carries out. A sub-agent's inner call shares the decision made on the
    # supervisor's call that surfaced it: one click, one decision record.
    decision = models.ForeignKey(
        "Decision", on_delete=models.PROTECT, null=True, blank=True, related_name="suspended_calls"
    )
    # How many distinct people must approve the same arguments before the call runs (the tool's
    # ``approvals_required``; a surfaced sub-agent call: its inner tool's).
    approvals_required = models.PositiveSmallIntegerField(default=1)
    # The arguments an approval that edited them proposed, while more approvals are needed: what the
    # next approver sees and approves (null: the call's own, or its inner call's).
    pending_args = models.JSONField(null=True, blank=True)
    # PostgreSQL: the argsFingerprint of what the call shows, computed by a trigger as args_fingerprint does
    # (migration 0019_call_fingerprints); NULL where it leaves it to Python (floats, sub-agent calls, SQLite).
    shown_fingerprint = models.CharField(max_length=64, null=True, blank=True, editable=False)
    # A sub-agent call surfaces its inner run's open call here.
    inner_agent_id = models.CharField(max_length=128, null=True, blank=True)
    inner_run_id = models.CharField(max_length=40, null=True, blank=True)
    inner_tool_call_id = models.CharField(max_length=128, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # A timeout policy (``@tool(approval_timeout=…)``, ``agentrun.engine.timeouts``): when the sweep sends
    # ``approval.timeout_warning`` and when it applies ``on_timeout``; each is cleared once done.
    warn_at = models.DateTimeField(null=True, blank=True)
    timeout_at = models.DateTimeField(null=True, blank=True)
    on_timeout = models.CharField(max_length=16, null=True, blank=True)
    # Shared work (docs/dashboard.md#shared-work, ``agentrun.core.claims``): who said "I'm on it" (live
    # until ``AGENTRUN_CLAIM_IDLE_SECONDS`` pass after ``claim_touched_at``) and to whom the call is
    # assigned. On the call's own row: the decision, which locks and rewrites this row anyway, reads and
    # clears them without one more statement. Neither ever blocks a decision.
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    claimed_by_username = models.CharField(max_length=150, null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    claim_touched_at = models.DateTimeField(null=True, blank=True)
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    assignee_group = models.ForeignKey("auth.Group", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    assigned_by_username = models.CharField(max_length=150, null=True, blank=True)
    assigned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "tool_call_id"], name="one_live_record_per_tool_call"),
        ]
        indexes = [
            # Serves the listing's prefetch of open calls and the decision transaction's lookup.
            models.Index(fields=["run", "position"], name="suspended_call_open", condition=Q(status="open")),
            # Serve the sweep's deadline queries (open calls whose warning / timeout is due): only calls
            # under a timeout policy are in them, so the sweep's cost follows the work due.
            models.Index(
                fields=["warn_at"], name="suspended_call_warning", condition=Q(status="open", warn_at__isnull=False)
            ),
            models.Index(
                fields=["timeout_at"],
                name="suspended_call_timeout",
                condition=Q(status="open", timeout_at__isnull=False),
            ),
            # Serves the sweep's undriven-decision query (lease.claim_stalled_runs): decided calls whose
            # continuation never started; the open calls people are still looking at are not in it.
            models.Index(
                fields=["run"], name="suspended_call_decided", condition=Q(status__in=["decided", "executing"])
            ),
            # Serves "surfaced by a supervisor" (approvals.selectors): every inbox and thread read leaves out
            # the sub-agent calls a supervisor's open call surfaces; only those supervisors' calls are here,
            # so the check costs the sub-agent calls waiting, not every call (it scanned them all).
            models.Index(
                fields=["inner_run_id", "inner_tool_call_id"],
                name="suspended_call_surfacing",
                condition=Q(status="open", inner_run_id__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.tool_call_id


class Decision(models.Model):
    """Who decided what on a suspended tool call. Permanent: decisions are the audit trail."""

    class Kind(models.TextChoices):
        APPROVE = "approve"
        DECLINE = "decline"
        RESUME = "resume"
        EXPIRE = "expire"

    class Via(models.TextChoices):
        API = "api"
        DASHBOARD = "dashboard"
        PYTHON = "python"
        WEBSOCKET = "websocket"
        SYSTEM = "system"
        LINK = "link"  # a signed decision link
        POLICY = "policy"  # a standing grant or a timeout policy
        SLACK = "slack"  # a button (or a modal) of an interactive Slack message (docs/slack.md)

    id = models.CharField(primary_key=True, max_length=40, default=_decision_id, editable=False)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="decisions")
    agent_id = models.CharField(max_length=128)
    thread_id = models.CharField(max_length=255)
    tool_call_id = models.CharField(max_length=128)
    tool_name = models.CharField(max_length=128)
    suspension = models.PositiveIntegerField(default=0)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    args = models.JSONField(null=True, blank=True)
    edited_args = models.JSONField(null=True, blank=True)
    resume_data = models.JSONField(null=True, blank=True)
    reason = models.TextField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # Kept as text too, so the trail still names the person after their account is deleted.
    decided_by_username = models.CharField(max_length=150, null=True, blank=True)
    via = models.CharField(max_length=16, choices=Via.choices)
    decided_at = models.DateTimeField(default=timezone.now)
    # What made an automatic decision (``via`` policy): ``{"policy": "grant", "grantId", …}`` or
    # ``{"policy": "timeout", "onTimeout", …}``; a person's decision from Slack: ``{"slack": {"userId",
    # "teamId"}}`` (docs/slack.md). A person's decision made while someone else held a live claim on the
    # call: ``{"claim": {"claimedBy", "claimedAt"}}`` (docs/dashboard.md#shared-work). Null otherwise, and
    # for expiry.
    details = models.JSONField(null=True, blank=True)
    # The risk the decided call carried when it was decided (its ``SuspendedToolCall.risk``: for a
    # sub-agent's call surfaced on its supervisor, the inner call's). Kept, not derived from the tool's
    # declaration: a declaration that changes later does not rewrite the audit trail.
    risk = models.CharField(max_length=8, choices=SuspendedToolCall.Risk.choices, default=SuspendedToolCall.Risk.MEDIUM)
    # The fingerprint of the arguments the decision was made on (what the decider was shown: the inner
    # call's for a surfaced sub-agent call, or an earlier approver's edit). Null only before 0012.
    args_fingerprint = models.CharField(max_length=64, null=True, blank=True)
    # False: an approval towards a quorum (``approvals_required`` > 1) that did not complete it; the
    # call still waited after it. The decision that decided the call has ``completes`` true.
    completes = models.BooleanField(default=True, db_default=True)
    # A call surfaced from a sub-agent: the inner call the reviewer saw (``edited_args`` is its edit).
    inner_agent_id = models.CharField(max_length=128, null=True, blank=True)
    inner_run_id = models.CharField(max_length=40, null=True, blank=True)
    inner_tool_call_id = models.CharField(max_length=128, null=True, blank=True)
    inner_tool_name = models.CharField(max_length=128, null=True, blank=True)
    inner_args = models.JSONField(null=True, blank=True)
    # Since when the decided call waited (its suspension began): ``decided_at - waiting_since`` is the time
    # to decision the metrics count (docs/operations.md). Null when nothing waited (a standing grant's
    # approval) and on decisions recorded before it was kept.
    waiting_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-decided_at", "-id"]
        permissions = [("decide_toolcall", "Can approve, decline and resume suspended tool calls")]
        constraints = [
            # Exactly once: the database itself refuses a second decision on the same suspension (the
            # approvals towards a quorum that did not complete it aside)…
            models.UniqueConstraint(
                fields=["run", "tool_call_id", "suspension"],
                condition=Q(completes=True),
                name="one_decision_per_suspension",
            ),
            # … and a person's second approval of the same arguments.
            models.UniqueConstraint(
                fields=["run", "tool_call_id", "suspension", "args_fingerprint", "decided_by_username"],
                condition=Q(kind="approve"),
                name="one_approval_per_person",
            ),
        ]
        indexes = [
            models.Index(fields=["agent_id", "decided_at"], name="decision_agent_time"),
            models.Index(fields=["thread_id", "decided_at"], name="decision_thread_time"),
            models.Index(fields=["decided_at", "id"], name="decision_timeline"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.tool_call_id}"

    def to_dict(self) -> dict:
        """The decision object (docs/api.md#the-audit-trail); an automatic decision adds ``details`` (what
        decided); a decision on a call surfaced from a sub-agent adds ``subAgent``, the inner call the
        reviewer saw and its edit."""
        data: dict[str, Any] = {
            "id": self.id,
            "runId": self.run_id,
            "agentId": self.agent_id,
            "threadId": self.thread_id,
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "kind": self.kind,
            "args": self.args,
            "editedArgs": None if self.inner_run_id else self.edited_args,
            "resumeData": self.resume_data,
            "reason": self.reason,
            "decidedBy": self.decided_by_username,
            "via": self.via,
            "decidedAt": iso(self.decided_at),
            "argsFingerprint": self.args_fingerprint,
        }
        if self.details is not None:
            data["details"] = self.details
        if self.inner_run_id:
            data["subAgent"] = self.sub_agent()
        return data

    def sub_agent(self) -> dict[str, Any] | None:
        """The inner call a surfaced sub-agent decision was made on, and its edit (None: a direct call)."""
        if not self.inner_run_id:
            return None
        return {
            "agentId": self.inner_agent_id,
            "runId": self.inner_run_id,
            "toolCallId": self.inner_tool_call_id,
            "toolName": self.inner_tool_name,
            "args": self.inner_args,
            "editedArgs": self.edited_args,
        }

    @property
    def approved_fingerprint(self) -> str | None:
        """The fingerprint of the arguments an approval approved: its edit's, else those it was shown."""
        if self.edited_args is not None:
            return args_fingerprint(self.edited_args)
        return self.args_fingerprint

    @property
    def seen_title(self) -> str:
        """The call the reviewer saw: ``refund``, or ``billing-agent → refund`` for a sub-agent's call."""
        return f"{self.inner_agent_id} → {self.inner_tool_name}" if self.inner_run_id else self.tool_name

    @property
    def seen_args(self) -> Any:
        """The arguments the reviewer saw (before their edit)."""
        return self.inner_args if self.inner_run_id else self.args

    @property
    def automatic(self) -> bool:
        """Made by the system (expiry) or a policy (a standing grant, a timeout), not by a person."""
        return self.via in (self.Via.SYSTEM, self.Via.POLICY)


class RunChunk(models.Model):
    """The durable chunk log of a run: replay for late subscribers, in ``seq`` order."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="chunks")
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=40)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="one_chunk_per_seq")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq}"

    def to_chunk(self) -> dict:
        return {"type": self.type, "runId": self.run_id, "from": "AGENT", "seq": self.seq, "payload": self.payload}


class ToolEffect(models.Model):
    """A ledger tools use to apply a side effect once per tool call id (their idempotency key).

    A continuation retried after a crash re-runs an approved tool with the same ``ctx.tool_call_id``;
    a tool that records its effect here first finds it already applied.
    """

    tool_call_id = models.CharField(max_length=128, unique=True)
    run_id = models.CharField(max_length=40, db_index=True)
    tool_name = models.CharField(max_length=128)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.tool_call_id}"


def _background_task_id() -> str:
    return new_id("bgt")


class BackgroundTask(models.Model):
    """A tool call that runs outside the turn that made it (docs/runs.md#background-tasks)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        TIMED_OUT = "timed_out"

    FINAL_STATUSES = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.TIMED_OUT})

    id = models.CharField(primary_key=True, max_length=40, default=_background_task_id, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="background_tasks")
    agent_id = models.CharField(max_length=128)
    thread_id = models.CharField(max_length=255)
    tool_call_id = models.CharField(max_length=128, unique=True)
    tool_name = models.CharField(max_length=128)
    args = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    max_retries = models.PositiveIntegerField(default=0)
    timeout_ms = models.PositiveIntegerField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # A running task's worker beats; a task whose heartbeat stopped was left by a dead process.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # When an until_idle stream ran the continuation turn that told the model about this result.
    continued_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            # Serves the concurrency limits and the dispatcher: running / pending tasks, oldest first.
            models.Index(fields=["status", "created_at"], name="bgtask_status_created"),
            models.Index(fields=["agent_id", "status"], name="bgtask_agent_status"),
            models.Index(fields=["run", "status"], name="bgtask_run_status"),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def is_final(self) -> bool:
        return self.status in self.FINAL_STATUSES

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "object": "background_task",
            "runId": self.run_id,
            "agentId": self.agent_id,
            "threadId": self.thread_id,
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "args": self.args,
            "status": self.status,
            "result": self.result,
            "error": self.error,
            "attempts": self.attempts,
            "createdAt": iso(self.created_at),
            "startedAt": iso(self.started_at),
            "completedAt": iso(self.completed_at),
        }


class IdempotencyKey(models.Model):
    """The first answer to a REST decision sent with an ``Idempotency-Key`` header, kept per user.

    A retried request with the same key gets this answer again instead of a second decision. The row
    is written in the decision's own transaction, so a key exists exactly when its decision does.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    # sha256 of method, path and body: the same key with a different request is refused.
    request_fingerprint = models.CharField(max_length=64)
    run_id = models.CharField(max_length=40)
    response_status = models.PositiveSmallIntegerField()
    response_body = models.JSONField()
    # The chunk seq the decision's continuation follows: a retried SSE request replays from here.
    stream_after = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            # Serves the lookup of a retried request, and decides a race between two identical ones.
            models.UniqueConstraint(fields=["user", "key"], name="one_answer_per_idempotency_key"),
        ]
        # Serves the retention's pruning of old keys (agentrun.core.retention): oldest first, a batch at a time.
        indexes = [models.Index(fields=["created_at"], name="idempotency_created")]

    def __str__(self) -> str:
        return f"{self.key} ({self.user_id})"


class WorkerHeartbeat(models.Model):
    """The last sweep of each process that sweeps: ``agentrun_worker`` processes, or the server itself
    on the embedded default. ``/healthz`` reports those seen within a few sweep intervals."""

    class Role(models.TextChoices):
        WORKER = "worker"
        SERVER = "server"  # the embedded sweeper of a web process

    id = models.CharField(primary_key=True, max_length=200)  # host:pid
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.WORKER)
    started_at = models.DateTimeField(default=timezone.now)
    # Serves /healthz's "seen recently" query and the pruning of long-gone processes.
    seen_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-seen_at", "id"]

    def __str__(self) -> str:
        return self.id


def _grant_id() -> str:
    return new_id("grant")


class StandingGrant(models.Model):
    """ "Always approve this tool for this thread / resource": a call it matches that would wait for
    approval is approved at once by policy (``via`` policy, the decision naming the grant)."""

    class Scope(models.TextChoices):
        THREAD = "thread"
        RESOURCE = "resource"

    id = models.CharField(primary_key=True, max_length=40, default=_grant_id, editable=False)
    agent_id = models.CharField(max_length=128)
    tool_name = models.CharField(max_length=128)
    scope = models.CharField(max_length=16, choices=Scope.choices)
    scope_id = models.CharField(max_length=255)  # the thread id or the resource id
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_by_username = models.CharField(max_length=150, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by_username = models.CharField(max_length=150, null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # Serves the loop's lookup of a grant for a call about to wait (agentrun.engine.decisions).
            models.Index(
                fields=["agent_id", "tool_name", "scope", "scope_id"],
                name="grant_live",
                condition=Q(revoked_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id}: {self.describe()}"

    def describe(self) -> str:
        return f"always approve {self.tool_name} of {self.agent_id} for {self.scope} {self.scope_id}"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > timezone.now())


def _event_id() -> str:
    return new_id("evt")


class OutboxEvent(models.Model):
    """What happened to a run, for listeners outside the engine (webhooks, email; ``agentrun.core.outbox``).

    Written in the transaction of the state change itself, so an event exists exactly when its change
    does; ``id`` is the stable event id receivers deduplicate on."""

    id = models.CharField(primary_key=True, max_length=40, default=_event_id, editable=False)
    type = models.CharField(max_length=40)
    agent_id = models.CharField(max_length=128)
    run_id = models.CharField(max_length=40)
    data = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)
    # When the listeners took it (their deliveries and notices written); null until then.
    handled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            # Serves the sweep's "events no listener took yet" (a process died between commit and hand-over).
            models.Index(fields=["created_at"], name="event_unhandled", condition=Q(handled_at__isnull=True)),
            # Serves the retention's pruning of handled events (agentrun.core.retention), oldest first.
            models.Index(fields=["created_at"], name="event_handled", condition=Q(handled_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.id}"

    def envelope(self) -> dict:
        """The webhook body (docs/notifications.md#21-the-request): ``{id, type, createdAt, data}``."""
        return {"id": self.id, "type": self.type, "createdAt": iso(self.created_at), "data": self.data}


# --- operations: counters the metrics read, the retention's cursor (docs/operations.md) -----------
class WaitingCallCount(models.Model):
    """How many calls wait for a person (open ``SuspendedToolCall`` rows), per agent and risk: what
    ``agentrun_waiting_calls`` and the metrics page read instead of counting open calls.

    Written only by database triggers on ``SuspendedToolCall`` (migration ``0012_operations``), in the
    statement that opens, decides or removes a call, like ``SnapshotCount``; spread over ``SLOTS`` rows
    per key (the slot follows from the run id) so that concurrent suspensions seldom wait on one row.
    """

    SLOTS = 8

    agent_id = models.CharField(max_length=128)
    risk = models.CharField(max_length=8)
    slot = models.PositiveSmallIntegerField()
    calls = models.BigIntegerField()

    class Meta:
        constraints = [
            # The triggers' upsert target.
            models.UniqueConstraint(fields=["agent_id", "risk", "slot"], name="one_waiting_call_count_per_slot"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id} {self.risk}#{self.slot}: {self.calls}"


class DecisionRollup(models.Model):
    """Decisions per agent, tool and day (UTC), by kind, via, policy, edited or not, and how long the call
    had waited (``wait_bucket``: the index of the first of ``agentrun.core.metrics.WAIT_BUCKETS`` at or
    above ``decided_at - waiting_since``; -1 when unknown): the metrics page reads these few rows, never
    the decisions.

    Written by a database trigger on ``Decision`` (migration ``0012_operations``) in the statement that
    records the decision, whoever records it, so the sums equal the decisions table at every moment;
    and, for escalations (which decide nothing: ``kind`` ``escalate``), by ``agentrun.core.rollup``.
    Spread over ``SLOTS`` rows per key like ``SnapshotCount``.
    """

    SLOTS = 8
    ESCALATE = "escalate"

    agent_id = models.CharField(max_length=128)
    tool_name = models.CharField(max_length=128)
    day = models.DateField()
    kind = models.CharField(max_length=16)
    via = models.CharField(max_length=16)
    policy = models.CharField(max_length=16, blank=True, default="")  # details.policy: "grant", "timeout"
    edited = models.BooleanField(default=False)
    wait_bucket = models.SmallIntegerField()
    slot = models.PositiveSmallIntegerField()
    decisions = models.BigIntegerField()
    waited_seconds = models.FloatField(default=0.0)

    class Meta:
        constraints = [
            # The trigger's upsert target; also serves one agent's rows.
            models.UniqueConstraint(
                fields=["agent_id", "tool_name", "day", "kind", "via", "policy", "edited", "wait_bucket", "slot"],
                name="one_decision_rollup_per_key",
            ),
        ]
        # Serves the metrics page: WHERE day >= ? [AND agent_id IN (…)].
        indexes = [models.Index(fields=["day", "agent_id"], name="decision_rollup_day")]

    def __str__(self) -> str:
        return f"{self.agent_id} {self.tool_name} {self.day} {self.kind}/{self.via}: {self.decisions}"


class RetentionCursor(models.Model):
    """How far a retention task that walks a table in order has got (``agentrun.core.retention``): the
    chunk-log compaction remembers the last run it compacted, so that a round never reads again the
    runs it compacted before."""

    name = models.CharField(primary_key=True, max_length=64)
    position_at = models.DateTimeField()
    position_id = models.CharField(max_length=255)

    def __str__(self) -> str:
        return f"{self.name}: {self.position_at} {self.position_id}"


class AuditReceipt(models.Model):
    """A decision's receipt (``agentrun.core.receipts``): its Ed25519 signature over the decision's record
    and the hash of the receipt before it. Append-only, like the decisions (a trigger refuses UPDATE and
    DELETE). No foreign key: a receipt outlives whatever is done to its decision, and says so."""

    seq = models.BigIntegerField(primary_key=True)  # its place in the chain, from 1
    decision_id = models.CharField(max_length=40, unique=True)
    key_id = models.CharField(max_length=16)
    prev_hash = models.CharField(max_length=64)
    signature = models.CharField(max_length=100)
    hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"receipt {self.seq} of {self.decision_id}"


class AuditChainHead(models.Model):
    """The chain's last receipt (one row): locked by each new receipt until its decision commits, so
    receipts chain in commit order; and what ``agentrun_audit verify`` compares the chain's end with."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=64, default="0" * 64)
    decision_id = models.CharField(max_length=40, null=True, blank=True)

    def __str__(self) -> str:
        return f"audit chain at receipt {self.seq}"

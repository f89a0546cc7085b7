"""The outbox: what happens to runs, told to listeners outside the engine (webhooks, email) without the
engine importing them.

The engine calls ``record`` inside the transaction of each state change — a run suspended, a tool
call decided, a run expired / completed / failed / cancelled, a timeout warning, an escalation — so an
event row exists exactly when its change does. In the same transaction every listener hears of it
(``Listener.recorded``) and enqueues its own delivery on the task queue (a transactional enqueue: the
event and its task commit together), which never runs in the engine's transactions or its loop.
Every sweep calls ``Listener.sweep``: what a lost task left behind (the embedded backend keeps its
tasks in memory) is enqueued again then (at least once).

Nothing listens, nothing is written: each listener's ``wants`` (an in-memory check) is asked first,
so a deployment without webhook endpoints or email recipients pays no write for its runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from agentrun.core import metrics, outages
from agentrun.core.models import OutboxEvent

logger = logging.getLogger("agentrun.core.outbox")

RUN_SUSPENDED = "run.suspended"
TOOLCALL_DECIDED = "toolcall.decided"
RUN_EXPIRED = "run.expired"
RUN_COMPLETED = "run.completed"
RUN_FAILED = "run.failed"
RUN_CANCELLED = "run.cancelled"
TIMEOUT_WARNING = "approval.timeout_warning"
ESCALATED = "approval.escalated"
APPROVAL_GIVEN = "approval.given"  # one person's approval of a call that needs several (docs/api.md#approvals)

# The event types of docs/notifications.md#1-events; ``approval.escalated`` last (a timeout policy
# handed a call to another group).
EVENT_TYPES = (
    RUN_SUSPENDED,
    TOOLCALL_DECIDED,
    RUN_EXPIRED,
    RUN_COMPLETED,
    RUN_FAILED,
    RUN_CANCELLED,
    TIMEOUT_WARNING,
    ESCALATED,
    APPROVAL_GIVEN,
)

# The events of a run reaching a final status, and that status.
FINAL_STATUS_OF = {RUN_COMPLETED: "completed", RUN_FAILED: "failed", RUN_CANCELLED: "cancelled", RUN_EXPIRED: "expired"}


class Listener(Protocol):
    def wants(self, type_: str, agent_id: str) -> bool:
        """Whether an event of this type about this agent's run is of use (cheap: no query per call)."""

    def recorded(self, event_id: str) -> None:
        """In the event's transaction: enqueue its handling (never deliver here, never block)."""

    def sweep(self) -> None:
        """Periodically: take what was left behind, retry what is due."""


_listeners: list[Listener] = []


def add_listener(listener: Listener) -> None:
    """Register a listener (an app's ``AppConfig.ready``); the same object twice counts once."""
    if listener not in _listeners:
        _listeners.append(listener)


def wanted(type_: str, agent_id: str) -> bool:
    """Whether ``record`` would write this event (a listener wants it). A write that may record one
    runs in a transaction, so that the event exists exactly when the change does."""
    return any(listener.wants(type_, agent_id) for listener in _listeners)


def record(type_: str, *, agent_id: str, run_id: str, data: Callable[[], dict]) -> None:
    """Record an event in the caller's transaction, if a listener wants it. ``data`` builds the body's
    ``data`` (a REST shape) only then."""
    if type_ not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type_!r}")
    if type_ in FINAL_STATUS_OF:  # every final transition records its event here: /metrics counts it
        metrics.run_finished(agent_id=agent_id, status=FINAL_STATUS_OF[type_])
    if not wanted(type_, agent_id):
        return
    event = OutboxEvent.objects.create(type=type_, agent_id=agent_id, run_id=run_id, data=data())
    for listener in _listeners:
        listener.recorded(event.id)


def sweep() -> None:
    for listener in _listeners:
        try:
            listener.sweep()
        except outages.INFRASTRUCTURE_ERRORS as exc:  # the next sweep goes on once the service answers
            outages.failed(exc)
        except Exception:
            logger.exception("listener %r failed to sweep", listener)

"""Server-side execution of runs, through Django's Tasks framework.

The embedded default runs tasks in the server process (``agentrun.server.tasks_backend.InProcessBackend``);
production enqueues them in the database for ``manage.py agentrun_worker`` processes. Both enqueue
transactionally: inside an atomic block, the task exists exactly when the block commits.
"""

from __future__ import annotations

import asyncio
import time

from django.tasks import task

from agentrun.core import tracing
from agentrun.core.outages import INFRASTRUCTURE_ERRORS
from agentrun.engine.chunklog import LeaseLost
from agentrun.engine.lease import lease_ttl, new_lease_owner
from agentrun.engine.loop import Segment
from agentrun.engine.registry import get_agent

RETRY_FIRST_SECONDS = 0.25
RETRY_MAX_SECONDS = 2.0


@task
async def continue_run(agent_id: str, run_id: str, trace: dict | None = None) -> str:
    """Drive a run's next segment (after a decision, or to recover one whose driver died). ``trace``:
    the trace of the request that decided (``agentrun.core.tracing``), when tracing is on.

    The database or Redis failing mid-segment does not fail the run (``Segment.run``): the segment is
    tried again here under the same lease, every 0.25 s doubling to 2 s, for one lease period; then
    this task gives up and a sweep continues the run once the lease lapses (docs/operations.md
    "Outages").
    """
    owner = new_lease_owner()
    give_up = time.monotonic() + lease_ttl().total_seconds()
    delay = RETRY_FIRST_SECONDS
    with tracing.span("agentrun.continuation", context=trace, agent_id=agent_id, run_id=run_id):
        while True:
            try:
                # Only if there is something to drive: the same run may be dispatched twice (a
                # decision's own dispatch and a sweep's, or two sweeps), and the second must not append
                # an empty segment (start + finish) to a run that has already finished.
                segment = Segment(get_agent(agent_id), run_id, only_if_needed=True, lease_owner=owner)
                return (await segment.run()).finish_reason
            except LeaseLost:
                return "lease-lost"  # this worker stalled past its lease: another one drives the run
            except INFRASTRUCTURE_ERRORS:
                if time.monotonic() + delay > give_up:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_SECONDS)  # RunLease replaces the connection the outage broke


def enqueue_continuation(agent_id: str, run_id: str) -> None:
    """Queue the run's next segment; inside a transaction, it is queued when (and if) that commits."""
    if trace := tracing.carrier():
        continue_run.enqueue(agent_id, run_id, trace=trace)
    else:
        continue_run.enqueue(agent_id, run_id)

"""Server-side execution of runs, through Django's Tasks framework.

The embedded default runs tasks in the server process (``agentrun.server.tasks_backend.InProcessBackend``);
production enqueues them in the database for ``manage.py agentrun_worker`` processes. Both enqueue
transactionally: inside an atomic block, the task exists exactly when the block commits.
"""

from __future__ import annotations

from django.tasks import task

from agentrun.core import tracing
from agentrun.engine.loop import Segment
from agentrun.engine.registry import get_agent


@task
async def continue_run(agent_id: str, run_id: str, trace: dict | None = None) -> str:
    """Drive a run's next segment (after a decision, or to recover one whose driver died). ``trace``:
    the trace of the request that decided (``agentrun.core.tracing``), when tracing is on."""
    # Only if there is something to drive: the same run may be dispatched twice (a decision's own
    # dispatch and a sweep's, or two sweeps), and the second must not append an empty segment
    # (start + finish) to a run that has already finished.
    with tracing.span("agentrun.continuation", context=trace, agent_id=agent_id, run_id=run_id):
        result = await Segment(get_agent(agent_id), run_id, only_if_needed=True).run()
    return result.finish_reason


def enqueue_continuation(agent_id: str, run_id: str) -> None:
    """Queue the run's next segment; inside a transaction, it is queued when (and if) that commits."""
    if trace := tracing.carrier():
        continue_run.enqueue(agent_id, run_id, trace=trace)
    else:
        continue_run.enqueue(agent_id, run_id)

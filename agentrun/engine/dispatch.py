"""Server-side execution of runs, through Django's Tasks framework.

The embedded default runs tasks in the server process (``agentrun.tasks_backend.InProcessBackend``);
production enqueues them in the database for ``manage.py db_worker`` processes.
"""

from __future__ import annotations

from django.tasks import task


@task
async def continue_run(agent_id: str, run_id: str) -> str:
    """Drive a run's next segment (after a decision, or to recover one whose driver died)."""
    from agentrun.engine.agents import get_agent
    from agentrun.engine.loop import Segment

    # Only if there is something to drive: the same run may be dispatched twice (a decision's own
    # dispatch and a sweep's, or two sweeps), and the second must not append an empty segment
    # (start + finish) to a run that has already finished.
    result = await Segment(get_agent(agent_id), run_id, only_if_needed=True).run()
    return result.finish_reason


def continue_in_background(agent_id: str, run_id: str) -> None:
    """Dispatch the continuation; the caller returns at once (a 202, a dashboard decision)."""
    continue_run.enqueue(agent_id, run_id)

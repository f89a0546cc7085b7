"""Timeout policies (issue 14): ``@tool(approval_timeout=…, on_timeout=…)``. Each outcome is recorded as
a policy decision (or, for escalation, an event) distinct from a person's; a warning goes out before
the deadline; the agent's time to live stays the outer bound. Deadlines are found on indexes."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Group
from django.core import mail
from django.db import connection
from django.utils import timezone

from agentrun import Agent, ToolContext, tool
from agentrun.core.models import Decision, OutboxEvent, Run, Snapshot, SuspendedToolCall, ToolEffect
from agentrun.engine import sweeper, timeouts
from tests.helpers.notifications import sent_emails
from tests.helpers.runs import bulk_suspended_runs, collect, final_answer, start, tool_line, wait_rested
from tests.helpers.users import make_user
from tests.helpers.waiting import wait_for_tasks

pytestmark = pytest.mark.django_db(transaction=True)


def policy_agent(on_timeout: str | None, **policy) -> Agent:
    @tool(id="wire-money", requires_approval=True, approval_timeout=60, on_timeout=on_timeout, **policy)
    async def wire_money(amount: int, *, ctx: ToolContext) -> dict:
        await ToolEffect.objects.acreate(tool_call_id=ctx.tool_call_id, run_id=ctx.run_id, tool_name="wire-money")
        return {"wired": amount}

    return Agent(id=f"treasury-{on_timeout}", tools=[wire_money])


def waiting_run(agent: Agent, thread: str) -> tuple[str, SuspendedToolCall]:
    stream, _ = async_to_sync(start)(agent.id, tool_line("wire-money", {"amount": 5}), thread=thread)
    return stream.run_id, SuspendedToolCall.objects.select_related("run").get(run_id=stream.run_id)


def past_deadline(run_id: str, field: str = "timeout_at") -> None:
    SuspendedToolCall.objects.filter(run_id=run_id).update(**{field: timezone.now() - timedelta(seconds=1)})


def test_a_call_under_a_policy_carries_its_deadlines():
    agent = policy_agent("decline")
    run_id, call = waiting_run(agent, "t-deadlines")
    run = Run.objects.get(pk=run_id)
    assert call.on_timeout == "decline"
    assert call.timeout_at - run.suspended_at == pytest.approx(timedelta(seconds=60), abs=timedelta(seconds=1))
    assert call.timeout_at - call.warn_at == timedelta(seconds=12)  # a fifth of the timeout, by default
    assert timeouts.sweep() == {"warned": 0, "timed_out": 0}  # nothing is due yet


@pytest.mark.parametrize("outcome", ["decline", "approve"])
def test_decline_or_approve_on_timeout_is_a_policy_decision_and_the_run_goes_on(outcome):
    agent = policy_agent(outcome)
    run_id, _ = waiting_run(agent, f"t-{outcome}")
    past_deadline(run_id)
    assert timeouts.sweep()["timed_out"] == 1
    assert wait_rested(run_id).status == "completed"
    decision = Decision.objects.get(run_id=run_id)
    assert (decision.kind, decision.via, decision.decided_by_id, decision.decided_by_username) == (
        outcome,
        "policy",
        None,
        None,
    )
    assert decision.details["policy"] == "timeout" and decision.details["onTimeout"] == outcome
    assert decision.automatic and "60 s" in decision.reason
    answer = async_to_sync(final_answer)(run_id)
    if outcome == "approve":
        assert answer == 'wire-money: {"wired": 5}' and ToolEffect.objects.count() == 1
    else:
        assert answer == f"wire-money: denied: {decision.reason}" and not ToolEffect.objects.exists()
    assert timeouts.sweep()["timed_out"] == 0  # applied once


def test_cancel_run_on_timeout_cancels_the_run_with_a_policy_record():
    agent = policy_agent("cancel_run")
    run_id, call = waiting_run(agent, "t-cancel-policy")
    past_deadline(run_id)
    timeouts.sweep()
    run = Run.objects.get(pk=run_id)
    assert run.status == "cancelled" and not Snapshot.objects.filter(run_id=run_id).exists()
    decision = Decision.objects.get(run_id=run_id)
    assert (decision.kind, decision.via, decision.tool_call_id) == ("expire", "policy", call.tool_call_id)
    assert decision.details["onTimeout"] == "cancel_run" and "cancelled" in decision.reason
    assert not ToolEffect.objects.exists()


def test_escalation_tells_another_group_and_the_call_waits_on(erin):
    treasurer = make_user("tess", email="tess@example.com")
    treasurer.groups.add(Group.objects.create(name="Treasury"))
    agent = policy_agent("escalate", escalate_to="Treasury")
    run_id, call = waiting_run(agent, "t-escalate")
    sent_emails(2)  # run.suspended: erin and tess are both reviewers
    wait_for_tasks()
    mail.outbox.clear()
    past_deadline(run_id)
    assert timeouts.sweep()["timed_out"] == 1
    call.refresh_from_db()
    assert call.status == "open" and call.timeout_at is None  # still waiting, deadline spent
    assert not Decision.objects.exists()
    event = OutboxEvent.objects.get(type="approval.escalated")
    assert event.data["escalateTo"] == ["Treasury"] and event.data["toolCall"]["toolCallId"] == call.tool_call_id
    [email] = sent_emails(1)
    assert email.to == ["tess@example.com"] and email.subject.startswith("[agentrun] Escalated to you")
    assert "escalated to you (Treasury)" in email.body and "/approvals/links/" in email.body
    assert timeouts.sweep()["timed_out"] == 0
    wait_for_tasks()
    assert len(mail.outbox) == 1


def test_a_warning_goes_out_once_before_the_deadline(erin):
    agent = policy_agent("decline", timeout_warning=timedelta(seconds=30))
    run_id, call = waiting_run(agent, "t-warn")
    assert call.timeout_at - call.warn_at == timedelta(seconds=30)
    sent_emails(1)
    wait_for_tasks()
    mail.outbox.clear()
    past_deadline(run_id, "warn_at")
    assert timeouts.sweep() == {"warned": 1, "timed_out": 0}
    assert timeouts.sweep() == {"warned": 0, "timed_out": 0}
    warning = OutboxEvent.objects.get(type="approval.timeout_warning")
    assert warning.data["onTimeout"] == "decline" and warning.data["timeoutAt"].endswith("Z")
    [email] = sent_emails(1)
    assert "will be declined automatically soon" in email.subject
    assert re.search(r"will be declined automatically at \S+Z", email.body)
    assert not Decision.objects.exists()


def test_the_agents_time_to_live_stays_the_outer_bound():
    agent = policy_agent("approve")
    agent.suspended_run_ttl = 5
    run_id, _ = waiting_run(agent, "t-ttl")
    past_deadline(run_id)
    Snapshot.objects.filter(run_id=run_id).update(expires_at=timezone.now())
    Run.objects.filter(pk=run_id).update(expires_at=timezone.now())
    result = async_to_sync(sweeper.sweep_once)()
    assert result["expired"] == 1 and result["timed_out"] == 0
    decision = Decision.objects.get(run_id=run_id)
    assert (decision.kind, decision.via) == ("expire", "system")  # expiry, not the policy
    assert Run.objects.get(pk=run_id).status == "expired" and not ToolEffect.objects.exists()


def test_a_person_deciding_first_leaves_the_policy_nothing_to_do():
    agent = policy_agent("approve")
    run_id, _ = waiting_run(agent, "t-person-first")
    async_to_sync(collect)(agent.decline_tool_call(run_id=run_id, reason="no"))  # to the run's end
    past_deadline(run_id)
    assert timeouts.sweep()["timed_out"] == 0
    assert list(Decision.objects.values_list("kind", "via")) == [("decline", "python")]


@pytest.mark.parametrize(
    "policy, problem",
    [
        ({"on_timeout": "decline"}, "need an approval_timeout"),
        ({"approval_timeout": 0}, "positive"),
        ({"approval_timeout": True}, "positive"),
        ({"approval_timeout": 10, "on_timeout": "shrug"}, "on_timeout must be one of"),
        ({"approval_timeout": 10, "on_timeout": "escalate"}, "needs escalate_to"),
        ({"approval_timeout": 10, "escalate_to": "Treasury"}, "needs escalate_to"),
        ({"approval_timeout": 10, "timeout_warning": 10}, "shorter"),
    ],
)
def test_a_policy_that_cannot_work_is_refused_when_the_tool_is_declared(policy, problem):
    with pytest.raises(ValueError, match=problem):

        @tool(id="x", requires_approval=True, **policy)
        async def x() -> None: ...


@pytest.mark.postgres
def test_the_sweep_finds_due_deadlines_on_their_partial_indexes():
    bulk_suspended_runs(3000)
    due = timezone.now() - timedelta(seconds=1)
    ids = list(SuspendedToolCall.objects.values_list("pk", flat=True)[:3])
    SuspendedToolCall.objects.filter(pk__in=ids).update(timeout_at=due, warn_at=due, on_timeout="decline")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE agentrun_suspendedtoolcall")
    for field, index in (("timeout_at", "suspended_call_timeout"), ("warn_at", "suspended_call_warning")):
        plan = timeouts._open(**{f"{field}__lte": timezone.now()}).order_by(field)[: timeouts.BATCH].explain()
        assert index in plan, plan


def supervised_run(on_timeout: str, thread: str) -> tuple[str, str]:
    """A supervisor whose sub-agent waits for approval of a call under a timeout policy."""
    inner = policy_agent(on_timeout)
    supervisor = Agent(id=f"boss-{on_timeout}", agents=[inner])
    line = tool_line(f"agent-{inner.id}", {"message": tool_line("wire-money", {"amount": 5})})
    stream, _ = async_to_sync(start)(supervisor.id, line, thread=thread)
    return stream.run_id, Run.objects.get(parent_run_id=stream.run_id).id


def test_a_sub_agents_call_timing_out_is_decided_on_the_supervisors_call():
    outer, inner = supervised_run("decline", "t-sub-timeout")
    past_deadline(inner)
    assert timeouts.sweep()["timed_out"] == 1
    assert wait_rested(outer).status == "completed" and Run.objects.get(pk=inner).status == "completed"
    [decision] = Decision.objects.all()
    assert (decision.run_id, decision.via, decision.kind) == (outer, "policy", "decline")  # one record
    assert "denied: Declined automatically" in async_to_sync(final_answer)(outer)


def test_cancel_run_on_a_sub_agents_call_cancels_the_supervisor_too():
    outer, inner = supervised_run("cancel_run", "t-sub-cancel")
    past_deadline(inner)
    timeouts.sweep()
    assert set(Run.objects.filter(pk__in=[outer, inner]).values_list("status", flat=True)) == {"cancelled"}
    assert sorted(Decision.objects.values_list("run_id", "kind", "via")) == sorted(
        [(outer, "expire", "policy"), (inner, "expire", "policy")]
    )
    assert not SuspendedToolCall.objects.exists() and not Snapshot.objects.exists()

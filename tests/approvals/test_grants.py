"""Standing grants (issue 14): "always approve this tool for this thread / resource" from a call card;
a call a grant covers is approved by the engine at once (a decision via policy naming the grant);
grants are listed and revocable in the dashboard and the admin."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client
from django.utils import timezone
from pydantic import BaseModel

from agentrun import Agent, ToolContext, tool
from agentrun.core.models import Decision, StandingGrant, SuspendedToolCall, ToolEffect
from agentrun.engine.types import Decider
from tests.helpers.decisions import decide_call
from tests.helpers.runs import EMAIL, collect, final_answer, of_type, rested, start, tool_line, wait_rested
from tests.helpers.users import make_user, token_client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rita():
    user = make_user("rita")
    browser = Client()
    browser.force_login(user)
    return browser


def suspend_email(thread: str, resource: str = "cust-1") -> tuple[str, str]:
    stream, chunks = async_to_sync(start)(
        "support-agent", tool_line("send-email", EMAIL), thread=thread, resource=resource
    )
    [approval] = of_type(chunks, "tool-call-approval")
    return stream.run_id, approval["payload"]["toolCallId"]


def run_email(thread: str, resource: str = "cust-1", tool_id: str = "send-email") -> tuple[str, list[dict]]:
    args = EMAIL if tool_id == "send-email" else {"table": "t", "id": 1}
    stream, chunks = async_to_sync(start)("support-agent", tool_line(tool_id, args), thread=thread, resource=resource)
    return stream.run_id, chunks


def grant(
    browser: Client,
    run_id: str,
    call_id: str,
    scope: str = "thread",
    expires_in: str = "",
    confirm: str = "",
    **headers,
):
    """The card's "Always approve…" form (``confirm="high-risk"``: its high-risk confirmation step)."""
    return browser.post(
        "/approvals/grants/new",
        {"run_id": run_id, "tool_call_id": call_id, "scope": scope, "expires_in": expires_in, "confirm": confirm},
        **headers,
    )


def test_granting_from_a_card_approves_the_call_and_the_next_ones_on_the_thread(rita):
    run_id, call_id = suspend_email("t-grant")
    page = rita.get("/approvals/threads/t-grant/").content.decode()
    assert "Always approve…" in page and 'action="/approvals/grants/new"' in page

    answer = grant(rita, run_id, call_id, expires_in="86400", HTTP_HX_REQUEST="true")
    assert answer.status_code == 200
    assert "Approved" in answer.content.decode() and "always approve send-email" in answer.content.decode()
    assert wait_rested(run_id).status == "completed"
    first = Decision.objects.get(run_id=run_id)
    assert (first.via, first.decided_by_username) == ("dashboard", "rita")  # a person's decision
    saved = StandingGrant.objects.get()
    assert (saved.agent_id, saved.tool_name, saved.scope, saved.scope_id) == (
        "support-agent",
        "send-email",
        "thread",
        "t-grant",
    )
    assert saved.created_by_username == "rita" and saved.expires_at > timezone.now() + timedelta(hours=23)

    later, chunks = run_email("t-grant")
    assert of_type(chunks, "finish")[-1]["payload"]["finishReason"] == "stop"  # nothing waited
    assert not of_type(chunks, "tool-call-approval")
    assert async_to_sync(final_answer)(later) == 'send-email: {"sent": true, "to": "ann@example.com"}'
    automatic = Decision.objects.get(run_id=later)
    assert (automatic.kind, automatic.via, automatic.decided_by_id, automatic.decided_by_username) == (
        "approve",
        "policy",
        None,
        None,
    )
    assert automatic.details == {"policy": "grant", "grantId": saved.id, "scope": "thread", "scopeId": "t-grant"}
    assert saved.id in automatic.reason and automatic.automatic
    assert not SuspendedToolCall.objects.filter(run_id=later).exists()
    assert ToolEffect.objects.count() == 2

    # The audit trail tells the two apart.
    audit = token_client(make_user("auditor")).get("/api/decisions?threadId=t-grant").json()["data"]
    assert [(d["via"], d["decidedBy"], d.get("details", {}).get("grantId")) for d in audit] == [
        ("policy", None, saved.id),
        ("dashboard", "rita", None),
    ]
    assert "details" not in audit[1]  # a person's decision: exactly the contract's fields


def test_a_grant_covers_its_scope_and_tool_only(rita):
    run_id, call_id = suspend_email("t-scope-a", resource="cust-7")
    assert grant(rita, run_id, call_id, scope="resource").status_code == 302
    wait_rested(run_id)
    assert StandingGrant.objects.get().scope_id == "cust-7"
    _, same_resource = run_email("t-scope-b", resource="cust-7")
    _, other_resource = run_email("t-scope-c", resource="cust-8")
    _, other_tool = run_email("t-scope-b", resource="cust-7", tool_id="delete-record")
    reasons = [of_type(c, "finish")[-1]["payload"]["finishReason"] for c in (same_resource, other_resource, other_tool)]
    assert reasons == ["stop", "suspended", "suspended"]


def test_revoked_and_expired_grants_approve_nothing(rita):
    run_id, call_id = suspend_email("t-revoke")
    grant(rita, run_id, call_id)
    wait_rested(run_id)
    saved = StandingGrant.objects.get()
    listing = rita.get("/approvals/grants/").content.decode()
    assert saved.id in listing and "Revoke" in listing

    revoked = rita.post(f"/approvals/grants/{saved.id}/revoke", HTTP_HX_REQUEST="true")
    assert revoked.status_code == 200 and "revoked by rita" in revoked.content.decode()
    _, chunks = run_email("t-revoke")
    assert of_type(chunks, "finish")[-1]["payload"]["finishReason"] == "suspended"

    StandingGrant.objects.create(
        agent_id="support-agent",
        tool_name="send-email",
        scope="thread",
        scope_id="t-expired",
        expires_at=timezone.now() - timedelta(seconds=1),
    )
    _, chunks = run_email("t-expired")
    assert of_type(chunks, "finish")[-1]["payload"]["finishReason"] == "suspended"
    assert "expired" in rita.get("/approvals/grants/").content.decode()


def test_only_those_who_may_decide_the_agent_grant_and_revoke(settings, rita):
    run_id, call_id = suspend_email("t-who")
    viewer = Client()
    viewer.force_login(make_user("vic", group="Viewers"))
    assert grant(viewer, run_id, call_id).status_code == 403
    settings.AGENTRUN_AGENT_REVIEWERS = {"support-agent": ["Support reviewers"]}
    outsider = Client()
    outsider.force_login(make_user("otto"))
    assert grant(outsider, run_id, call_id).status_code == 403
    assert not StandingGrant.objects.exists() and not Decision.objects.exists()
    settings.AGENTRUN_AGENT_REVIEWERS = {}

    grant(rita, run_id, call_id)
    saved = StandingGrant.objects.get()
    assert viewer.post(f"/approvals/grants/{saved.id}/revoke").status_code == 403
    assert StandingGrant.objects.get().revoked_at is None


def test_a_high_risk_call_is_never_always_approved(rita):
    # delete-record is high risk: nobody would see the calls a grant approves, so there is none to make.
    run_id, chunks = run_email("t-grant-high", tool_id="delete-record")
    [approval] = of_type(chunks, "tool-call-approval")
    call_id = approval["payload"]["toolCallId"]
    page = rita.get("/approvals/threads/t-grant-high/").content.decode()
    assert "Always approve…" not in page  # the card does not offer it
    form = {"run_id": run_id, "tool_call_id": call_id, "scope": "thread", "expires_in": "3600"}
    for extra in ({}, {"confirm": "high-risk"}):  # a forged form, with or without the second step
        refused = rita.post("/approvals/grants/new", form | extra, HTTP_HX_REQUEST="true")
        assert refused.status_code == 409 and "a grant never approves it" in refused.content.decode()
    assert not StandingGrant.objects.exists() and not Decision.objects.exists()
    assert SuspendedToolCall.objects.filter(run_id=run_id, tool_call_id=call_id, status="open").exists()


def test_a_call_decided_already_grants_nothing(rita):
    run_id, call_id = suspend_email("t-late")
    decide_call(agent_id="support-agent", run_id=run_id, kind="decline", decider=Decider.system("olga"))
    answer = grant(rita, run_id, call_id, HTTP_HX_REQUEST="true")
    assert answer.status_code == 409 and "Nothing was granted" in answer.content.decode()
    assert not StandingGrant.objects.exists()


def test_the_admin_lists_adds_and_revokes_grants_but_never_deletes_them(client):
    client.force_login(make_user("root", group=None, is_staff=True, is_superuser=True))
    added = client.post(
        "/admin/agentrun/standinggrant/add/",
        {"agent_id": "support-agent", "tool_name": "send-email", "scope": "thread", "scope_id": "t-admin"},
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    saved = StandingGrant.objects.get()
    assert saved.created_by_username == "root"
    _, chunks = run_email("t-admin")
    assert of_type(chunks, "finish")[-1]["payload"]["finishReason"] == "stop"
    response = client.post(
        "/admin/agentrun/standinggrant/",
        {"action": "revoke_grants", "_selected_action": [saved.id]},
        follow=True,
    )
    assert "Revoked 1 grant" in response.content.decode()
    assert StandingGrant.objects.get().revoked_by_username == "root"
    assert client.post(f"/admin/agentrun/standinggrant/{saved.id}/delete/").status_code == 403


def test_a_grant_on_a_sub_agents_surfaced_call_approves_the_sub_agents_tool(rita):
    @tool(id="tag-order", requires_approval=True)
    async def tag_order(orderId: str, tag: str) -> dict:  # noqa: N803
        return {"tagged": orderId}

    Agent(id="ledger-desk", agents=[Agent(id="ledger-agent", tools=[tag_order])])
    line = tool_line("agent-ledger-agent", {"message": tool_line("tag-order", {"orderId": "o-9", "tag": "vip"})})
    stream, _ = async_to_sync(start)("ledger-desk", line, thread="t-sub-grant")
    call = SuspendedToolCall.objects.get(run_id=stream.run_id)
    assert grant(rita, stream.run_id, call.tool_call_id).status_code == 302
    wait_rested(stream.run_id)
    saved = StandingGrant.objects.get()
    assert (saved.agent_id, saved.tool_name) == ("ledger-agent", "tag-order")
    again, chunks = async_to_sync(start)("ledger-desk", line, thread="t-sub-grant")
    assert of_type(chunks, "finish")[-1]["payload"]["finishReason"] == "stop"
    assert Decision.objects.filter(via="policy", agent_id="ledger-agent").count() == 1

    # refund (billing-agent's) is high risk: its surfaced call is never granted.
    refund = tool_line("agent-billing-agent", {"message": tool_line("refund", {"orderId": "o-9", "amount": 3})})
    stream, _ = async_to_sync(start)("support-supervisor", refund, thread="t-sub-grant")
    call = SuspendedToolCall.objects.get(run_id=stream.run_id, status="open")
    assert grant(rita, stream.run_id, call.tool_call_id, confirm="high-risk").status_code == 302  # refused
    assert StandingGrant.objects.count() == 1 and not Decision.objects.filter(run_id=stream.run_id).exists()


class Confirmation(BaseModel):
    code: str


async def test_a_granted_tool_that_then_suspends_is_resumed_like_any_other():
    @tool(id="transfer", requires_approval=True, resume_schema=Confirmation)
    async def transfer(amount: int, *, ctx: ToolContext) -> dict:
        if ctx.resume_data is None:
            await ctx.suspend({"ask": "the confirmation code"})
        return {"transferred": amount, "code": ctx.resume_data["code"]}

    agent = Agent(id="granted-suspender", tools=[transfer])
    creator = await sync_to_async(make_user)("gina")
    await StandingGrant.objects.acreate(
        agent_id=agent.id, tool_name="transfer", scope="thread", scope_id="t-gs", created_by=creator
    )
    stream, chunks = await start(agent.id, tool_line("transfer", {"amount": 4}), thread="t-gs")
    assert of_type(chunks, "tool-call-suspended") and not of_type(chunks, "tool-call-approval")
    await collect(agent.resume_stream({"code": "123"}, run_id=stream.run_id))
    assert (await rested(stream.run_id)).status == "completed"
    decisions = Decision.objects.filter(run_id=stream.run_id).order_by("decided_at")
    kinds = [(d.kind, d.via, d.suspension) async for d in decisions]
    assert kinds == [("approve", "policy", 0), ("resume", "python", 1)]

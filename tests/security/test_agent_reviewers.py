"""``AGENTRUN_AGENT_REVIEWERS`` beyond the matrix: the default, sub-agents, and reading the setting."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured

from agentrun.core import access
from agentrun.core.errors import AgentRunError
from agentrun.core.models import Decision, args_fingerprint
from agentrun.engine.agents import get_agent
from agentrun.engine.types import Decider
from tests.helpers.asgi import AsgiClient
from tests.helpers.principals import MAPPING, make_principals, new_thread, run_state, token_of
from tests.helpers.runs import collect, rested, start, tool_line
from tests.helpers.users import make_user

pytestmark = pytest.mark.django_db(transaction=True)


async def _client(user) -> AsgiClient:
    return AsgiClient({"authorization": f"Token {await token_of(user)}"})


async def test_without_the_setting_every_reviewer_sees_and_decides_every_agent(settings):
    settings.AGENTRUN_AGENT_REVIEWERS = {}
    users = await make_principals()
    stream, _ = await start(
        "support-agent", tool_line("send-email", {"to": "a@b.c", "subject": "s", "body": "b"}), thread=new_thread()
    )
    client = await _client(users["other"])
    assert (await client.get(f"/api/runs/{stream.run_id}")).status_code == 200
    agents = await (await client.get("/api/agents/")).json()
    assert {"support-agent", "billing-agent"} <= {a["id"] for a in agents["data"]}
    response = await client.post(f"/api/agents/support-agent/runs/{stream.run_id}/approve", {})
    assert response.status_code == 202
    await rested(stream.run_id)


async def test_a_reviewer_of_the_restricted_agent_sees_it_and_an_outsider_does_not(settings):
    settings.AGENTRUN_AGENT_REVIEWERS = MAPPING
    users = await make_principals()
    stream, _ = await start("billing-agent", tool_line("refund", {"orderId": "o-1", "amount": 5}), thread=new_thread())
    billing = await _client(users["other"])
    support = await _client(users["reviewer"])
    listed = await (await billing.get("/api/agents/billing-agent/suspended-runs")).json()
    assert [r["runId"] for r in listed["runs"]] == [stream.run_id]
    assert (await support.get("/api/agents/billing-agent/suspended-runs")).status_code == 404
    assert (await support.get(f"/api/runs/{stream.run_id}")).status_code == 404
    # The support reviewer names an agent it may decide, with the billing run's id: still not found.
    response = await support.post(f"/api/agents/support-agent/runs/{stream.run_id}/approve", {})
    assert (response.status_code, (await response.json())["error"]["code"]) == (404, "RUN_NOT_FOUND")
    assert (await run_state(stream.run_id)) == ("suspended", 0, 1)
    seen = {"argsFingerprint": args_fingerprint({"orderId": "o-1", "amount": 5.0})}  # refund is high risk
    assert (await billing.post(f"/api/agents/billing-agent/runs/{stream.run_id}/approve", seen)).status_code == 202
    await rested(stream.run_id)


async def test_a_surfaced_sub_agent_call_needs_the_sub_agents_reviewers_too(settings):
    """support-supervisor is not in the mapping, billing-agent is: deciding the outer call runs a refund."""
    settings.AGENTRUN_AGENT_REVIEWERS = MAPPING
    users = await make_principals()
    message = tool_line("agent-billing-agent", {"message": tool_line("refund", {"orderId": "o-1", "amount": 5})})
    stream, _ = await start("support-supervisor", message, thread=new_thread())
    supervisor = get_agent("support-supervisor")
    with pytest.raises(AgentRunError) as refused:
        await supervisor.approve_tool_call(
            run_id=stream.run_id, decided_by=Decider.person(users["reviewer"], via="python")
        )
    assert refused.value.code == "PERMISSION_DENIED"
    assert await sync_to_async(Decision.objects.filter(run_id=stream.run_id).count)() == 0
    client = await _client(users["reviewer"])
    response = await client.post(f"/api/agents/support-supervisor/runs/{stream.run_id}/approve", {})
    assert (response.status_code, (await response.json())["error"]["code"]) == (403, "PERMISSION_DENIED")
    await collect(
        supervisor.approve_tool_call(run_id=stream.run_id, decided_by=Decider.person(users["other"], via="python"))
    )
    assert (await run_state(stream.run_id))[1] == 1


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", {}),
        ('{"billing-agent": ["Billing reviewers"]}', {"billing-agent": ["Billing reviewers"]}),
        ('{"billing-agent": "Billing reviewers"}', {"billing-agent": ["Billing reviewers"]}),
        ("not json", ImproperlyConfigured),
        ('["billing-agent"]', ImproperlyConfigured),
        ('{"billing-agent": [1]}', ImproperlyConfigured),
    ],
)
def test_the_setting_is_read_from_the_environment(monkeypatch, raw, expected):
    from agentrun.settings import _agent_reviewers

    monkeypatch.setenv("AGENTRUN_AGENT_REVIEWERS", raw)
    if expected is ImproperlyConfigured:
        with pytest.raises(ImproperlyConfigured):
            _agent_reviewers()
    else:
        assert _agent_reviewers() == expected


def test_superusers_and_the_unmapped_are_never_hidden(settings, django_user_model):
    settings.AGENTRUN_AGENT_REVIEWERS = MAPPING
    root = make_user("root", password="pw-root-1234", group=None, is_staff=True, is_superuser=True)
    plain = make_user("plain", password="pw-plain-1234", group=None)
    assert access.hidden_agent_ids(root) == frozenset()
    assert access.hidden_agent_ids(plain) == frozenset(MAPPING)
    assert access.in_agent_scope(plain, "support-supervisor")
    assert not access.can_view_agent(plain, "support-supervisor")  # the global permission still counts

"""Claims over REST (docs/api.md#claims): claim, release, assign; shown in the listing; never a gate."""

from __future__ import annotations

from django.contrib.auth.models import Group

from agentrun.core.models import Decision, SuspendedToolCall
from tests.helpers.runs import EMAIL, email_run
from tests.helpers.users import make_user, token_client


def url(run_id: str, agent: str = "support-agent") -> str:
    return f"/api/agents/{agent}/runs/{run_id}/claim"


def listing_claim(api, run_id: str) -> dict:
    """The call's ``claim`` as a listing that asks for it reads it; the REST listings keep the
    contract's item shape (no ``claim``)."""
    from agentrun.core.selectors import list_suspended_runs, stream_suspended_runs

    paged = list_suspended_runs(agent_id="support-agent", with_claims=True, per_page=10, page=0).runs
    streamed = stream_suspended_runs(agent_id="support-agent", with_claims=True).next_batch()
    found = [
        [r.to_dict() for r in runs if r.run_id == run_id][0]["toolCalls"][0]["claim"] for runs in (paged, streamed)
    ]
    assert found[0] == found[1]
    for url in ("/api/agents/support-agent/suspended-runs", "/api/suspended-runs"):
        assert "claim" not in api.get(url).json()["runs"][0]["toolCalls"][0]
    return found[0]


def test_claim_release_and_assign_show_in_the_listing_and_a_decision_records_the_claim(api, reviewer, viewer_api):
    run_id = email_run()
    answer = api.post(url(run_id), {"action": "claim"}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["claim"]["claimedBy"] == "rita"
    assert listing_claim(api, run_id)["claimedBy"] == "rita"
    Group.objects.create(name="Billing")
    assigned = api.post(url(run_id), {"action": "assign", "assigneeGroup": "Billing"}, format="json").json()
    assert assigned["claim"]["assigneeGroup"] == "Billing" and assigned["claim"]["routed"] is False
    # Bad input: a clear error, nothing changes.
    bad = api.post(url(run_id), {"action": "assign", "assignee": "nobody"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_REQUEST"
    unknown = api.post(url(run_id), {"action": "claim", "extra": 1}, format="json")
    assert unknown.status_code == 400 and unknown.json()["error"]["details"]["unknownFields"] == ["extra"]
    assert listing_claim(api, run_id)["assigneeGroup"] == "Billing"
    assert viewer_api.post(url(run_id), {"action": "claim"}, format="json").status_code == 403
    # Someone else decides over rita's claim: allowed, and recorded.
    olga = token_client(make_user("olga", group="Reviewers"))
    call = SuspendedToolCall.objects.get(run_id=run_id, status="open")
    from agentrun.core.models import args_fingerprint

    declined = olga.post(
        f"/api/agents/support-agent/runs/{run_id}/decline",
        {"toolCallId": call.tool_call_id, "argsFingerprint": args_fingerprint(EMAIL)},
        format="json",
    )
    assert declined.status_code == 202, declined.content
    decision = api.get("/api/decisions", {"runId": run_id}).json()["data"][0]
    assert decision["decidedBy"] == "olga" and decision["details"]["claim"]["claimedBy"] == "rita"
    assert Decision.objects.get(run_id=run_id).details["claim"]["claimedBy"] == "rita"
    late = api.post(url(run_id), {"action": "claim"}, format="json")
    assert late.json()["error"]["code"] == "TOOL_CALL_NOT_SUSPENDED"


def test_release_keeps_someone_elses_claim(api):
    run_id = email_run()
    olga = token_client(make_user("olga", group="Reviewers"))
    olga.post(url(run_id), {"action": "claim"}, format="json")
    assert api.post(url(run_id), {"action": "release"}, format="json").json()["claim"]["claimedBy"] == "olga"


def test_the_listing_across_agents_carries_claims_when_asked(api):
    """``GET /api/suspended-runs?include=claims``: an integration's inbox sees who is on each call and to
    whom it is assigned, paged or not; without ``include`` the items keep the listing's shape."""
    claimed, free = email_run(), email_run()
    assert api.post(url(claimed), {"action": "claim"}, format="json").status_code == 200

    for paging in ({}, {"perPage": 50, "page": 0}):
        listed = api.get("/api/suspended-runs", {"include": "claims", **paging})
        assert listed.status_code == 200, listed.content
        calls = {run["runId"]: run["toolCalls"][0] for run in listed.json()["runs"]}
        assert calls[claimed]["claim"]["claimedBy"] == "rita"
        assert calls[free]["claim"]["claimedBy"] is None
        plain = api.get("/api/suspended-runs", paging).json()["runs"]
        assert all("claim" not in call for run in plain for call in run["toolCalls"])

    by_agent = api.get("/api/suspended-runs", {"include": "claims", "agentId": "support-agent"}).json()
    assert {run["runId"]: run["toolCalls"][0]["claim"]["claimedBy"] for run in by_agent["runs"]}[claimed] == "rita"
    bad = api.get("/api/suspended-runs", {"include": "everything"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_REQUEST"

"""Claims over REST (docs/api.md#claims): claim, release, assign; shown in the listing; never a gate."""

from __future__ import annotations

from django.contrib.auth.models import Group

from agentrun.core.models import Decision, SuspendedToolCall
from tests.api.conftest import _user, email_run, token_client
from tests.factories import EMAIL


def url(run_id: str, agent: str = "support-agent") -> str:
    return f"/api/agents/{agent}/runs/{run_id}/claim"


def listing_claim(api, run_id: str) -> dict:
    runs = api.get("/api/agents/support-agent/suspended-runs").json()["runs"]
    [run] = [r for r in runs if r["runId"] == run_id]
    return run["toolCalls"][0]["claim"]


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
    olga = token_client(_user("olga", "Reviewers"))
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
    olga = token_client(_user("olga", "Reviewers"))
    olga.post(url(run_id), {"action": "claim"}, format="json")
    assert api.post(url(run_id), {"action": "release"}, format="json").json()["claim"]["claimedBy"] == "olga"

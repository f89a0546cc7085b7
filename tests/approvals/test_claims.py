"""Shared work (docs/dashboard.md#shared-work): claims, assignments, routing, "Mine", and decisions that
record a claim they went past without being stopped by it."""

from __future__ import annotations

import re
from datetime import timedelta

from django.contrib.auth.models import Group
from django.urls import reverse
from django.utils import timezone

from agentrun.core.models import Decision, SuspendedToolCall, args_fingerprint
from tests.approvals.conftest import suspend
from tests.factories import EMAIL


def open_call(run_id: str) -> SuspendedToolCall:
    return SuspendedToolCall.objects.get(run_id=run_id, status="open")


def claim_url(call: SuspendedToolCall) -> str:
    return reverse("approvals:claim", args=[call.run_id, call.tool_call_id])


def decide_url(call: SuspendedToolCall) -> str:
    return reverse("approvals:decide", args=[call.run_id, call.tool_call_id])


def thread_page(client, thread: str) -> str:
    return client.get(reverse("approvals:thread", args=[thread])).content.decode()


def test_a_claim_shows_on_every_page_and_never_blocks_another_reviewer(reviewer, other_reviewer):
    rita, _ = reviewer
    olga, _ = other_reviewer
    call = open_call(suspend("send-email", EMAIL, thread="t-claim /%", resource="r"))
    answer = rita.post(claim_url(call), {"action": "claim"}, headers={"HX-Request": "true"})
    assert answer.status_code == 200 and "You are on it" in answer.content.decode()
    assert "rita is looking" in thread_page(olga, "t-claim /%")
    inbox = olga.get(reverse("approvals:inbox")).content.decode()
    assert re.search(r'data-testid="row-claim">\s*rita is looking', inbox)
    # Olga decides anyway: nothing stops her, and the decision records rita's claim.
    done = olga.post(
        decide_url(call),
        {"action": "decline", "args_fingerprint": args_fingerprint(EMAIL)},
        headers={"HX-Request": "true"},
    )
    assert done.status_code == 200 and "rita was on this call" in done.content.decode()
    decision = Decision.objects.get(run_id=call.run_id)
    assert decision.decided_by_username == "olga" and decision.details["claim"]["claimedBy"] == "rita"
    assert SuspendedToolCall.objects.get(pk=call.pk).claimed_by_username is None  # cleared with the decision


def test_the_claimers_own_decision_records_no_claim_and_an_expired_claim_is_no_claim(
    reviewer, other_reviewer, settings
):
    rita, _ = reviewer
    olga, _ = other_reviewer
    call = open_call(suspend("send-email", EMAIL, thread="t-own"))
    rita.post(claim_url(call), {"action": "claim"})
    SuspendedToolCall.objects.filter(pk=call.pk).update(claim_touched_at=timezone.now() - timedelta(seconds=901))
    assert "rita is looking" not in thread_page(olga, "t-own")  # idle past AGENTRUN_CLAIM_IDLE_SECONDS
    rita.post(claim_url(call), {"action": "claim"})
    assert "rita is looking" in thread_page(olga, "t-own")
    rita.post(claim_url(call), {"action": "release"})
    assert "is looking" not in thread_page(olga, "t-own")
    rita.post(claim_url(call), {"action": "claim"})
    rita.post(decide_url(call), {"action": "decline", "args_fingerprint": args_fingerprint(EMAIL)})
    assert Decision.objects.get(run_id=call.run_id).details is None


def test_assign_to_a_person_or_a_group_and_the_mine_view(reviewer, other_reviewer, viewer):
    rita, _ = reviewer
    olga, olga_user = other_reviewer
    billing = Group.objects.create(name="Billing")
    olga_user.groups.add(billing)
    to_olga = open_call(suspend("send-email", EMAIL, thread="t-to-olga"))
    to_billing = open_call(suspend("send-email", EMAIL, thread="t-to-billing"))
    suspend("send-email", EMAIL, thread="t-nobody")
    assert rita.post(claim_url(to_olga), {"action": "assign", "assignee": "user:olga"}).status_code == 302
    rita.post(claim_url(to_billing), {"action": "assign", "assignee": "group:Billing"})
    assert "assigned to olga" in thread_page(rita, "t-to-olga")
    assert "assigned to Billing" in thread_page(rita, "t-to-billing")
    mine = olga.get(reverse("approvals:inbox"), {"mine": "1"}).content.decode()
    assert re.findall(r'class="thread-row[^"]*" data-thread-id="([^"]*)"', mine) == ["t-to-olga", "t-to-billing"]
    assert "2 of 2 threads waiting" in mine
    assert "Nothing waits" in rita.get(reverse("approvals:inbox"), {"mine": "1"}).content.decode()
    # Bad input: a clear error, nothing changes; a viewer may not assign.
    assert rita.post(claim_url(to_olga), {"action": "assign", "assignee": "user:nobody"}).status_code == 400
    assert rita.post(claim_url(to_olga), {"action": "assign", "assignee": "olga"}).status_code == 400
    assert SuspendedToolCall.objects.get(pk=to_olga.pk).assignee == olga_user
    assert viewer[0].post(claim_url(to_olga), {"action": "claim"}).status_code == 403
    # Unassigned again.
    rita.post(claim_url(to_olga), {"action": "assign", "assignee": ""})
    assert "assigned to" not in thread_page(rita, "t-to-olga")


def test_routing_rules_name_a_group_and_its_members_see_the_calls_as_theirs(reviewer, other_reviewer, settings):
    settings.AGENTRUN_REVIEW_ROUTES = {"tools": {"delete-record": "Data"}, "agents": {}}
    olga, olga_user = other_reviewer
    olga_user.groups.add(Group.objects.create(name="Data"))
    suspend("delete-record", {"table": "t", "id": 1}, thread="t-routed")
    suspend("send-email", EMAIL, thread="t-not-routed")
    assert "routed to Data" in thread_page(olga, "t-routed")
    mine = olga.get(reverse("approvals:inbox"), {"mine": "1"}).content.decode()
    assert re.findall(r'class="thread-row[^"]*" data-thread-id="([^"]*)"', mine) == ["t-routed"]


def test_claiming_a_decided_call_says_who_decided(reviewer, other_reviewer):
    rita, _ = reviewer
    olga, _ = other_reviewer
    call = open_call(suspend("send-email", EMAIL, thread="t-late-claim"))
    olga.post(decide_url(call), {"action": "decline", "args_fingerprint": args_fingerprint(EMAIL)})
    late = rita.post(claim_url(call), {"action": "claim"}, headers={"HX-Request": "true"})
    assert late.status_code == 409 and "olga" in late.content.decode()

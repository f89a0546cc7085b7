"""A standing grant from a call card, in a real browser (issue 14): "Always approve…" approves the call
and the next one on the thread runs without waiting; the grants page revokes it. On a high-risk call it
takes the same deliberate second step as the card's Approve (issue 10)."""

from __future__ import annotations

import json
import uuid

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from agentrun.core.models import Decision, Run, StandingGrant
from tests.helpers.browser import run_python_api, screenshot

pytestmark = pytest.mark.e2e

EMAIL = {"to": "ann@example.com", "subject": "Your order", "body": "It shipped."}


def start_email_run(thread: str) -> str:
    from agentrun import get_agent

    async def go() -> str:
        stream = await get_agent("support-agent").stream(
            f"/tool send-email {json.dumps(EMAIL)}", memory={"thread": thread, "resource": "cust-42"}
        )
        await stream.collect()
        return stream.run_id

    return run_python_api(go)


def test_always_approve_from_a_card_then_revoke(login, suspend):
    page = login("rita")
    thread = f"t-grant-{uuid.uuid4().hex[:8]}"
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)
    page.goto(f"/approvals/threads/{thread}/")
    card = page.locator(f'[data-tool-call-id="{call_id}"]')
    card.get_by_text("Always approve…").click()
    card.get_by_label("Approve send-email without asking").select_option("thread")
    card.get_by_label("For how long").select_option("86400")
    screenshot(page, "grant-form-desktop")
    card.get_by_role("button", name="Approve and always approve").click()
    expect(page.get_by_role("status")).to_contain_text(
        f"always approve send-email of support-agent for thread {thread}"
    )
    grant = StandingGrant.objects.get(scope_id=thread)

    later = start_email_run(thread)  # nothing waits: the grant approves it in the loop
    assert Run.objects.get(pk=later).status == "completed"
    assert Decision.objects.get(run_id=later).via == "policy"

    page.goto("/approvals/grants/")
    row = page.locator(f'[data-grant-id="{grant.id}"]')
    row.get_by_role("button", name="Revoke").click()
    expect(row).to_contain_text("revoked by rita")
    screenshot(page, "grants-desktop")
    assert Run.objects.get(pk=start_email_run(thread)).status == "suspended"


def test_a_high_risk_call_offers_no_always_approve_and_its_approve_takes_two_steps(login, suspend):
    """Nobody would see the calls a grant approves: a high-risk card has no "Always approve…" (the
    decision service refuses such grants from any door); its Approve still asks to confirm first."""
    page = login("rita")
    thread = f"t-grant high/risk ?#%-é-{uuid.uuid4().hex[:8]}"  # any id the API accepts
    run_id, call_id = suspend("delete-record", {"table": "users", "id": 7}, thread=thread)
    page.goto(reverse("approvals:thread", args=[thread]))
    card = page.locator(f'.call[data-tool-call-id="{call_id}"]')
    expect(card.get_by_role("button", name="Approve", exact=True)).to_be_visible()
    expect(card.get_by_text("Always approve…")).to_have_count(0)
    card.get_by_role("button", name="Approve", exact=True).dblclick()  # a stray (double) click
    confirm = card.get_by_role("alertdialog")
    expect(confirm).to_contain_text("High risk")
    expect(card.get_by_role("button", name="Cancel")).to_be_focused()  # Enter now cancels
    screenshot(page, "highrisk-confirm-no-grant-desktop")
    assert not Decision.objects.filter(run_id=run_id).exists() and not StandingGrant.objects.filter(scope_id=thread)
    assert Run.objects.get(pk=run_id).status == "suspended"

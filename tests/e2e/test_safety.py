"""The safety core in the browser (issue 19): a call that needs two people shows "1 of 2 approvals"
after the first, and runs after the second; a sub-agent's edited refund reads in the history as the
refund it was, with its amount diff. Screenshots at 1280 and 375 px (artifacts/screenshots/)."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from agentrun.core.models import Decision, Run, SuspendedToolCall
from tests.helpers.browser import DESKTOP, PHONE, call_card, run_python_api, screenshot, start_run, unique, wait_live

pytestmark = pytest.mark.e2e


def shoot(page, name: str) -> None:
    page.set_viewport_size(DESKTOP)
    screenshot(page, f"{name}-desktop")
    page.set_viewport_size(PHONE)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], f"{name} scrolls sideways"
    screenshot(page, f"{name}-375")
    page.set_viewport_size(DESKTOP)


def test_a_payment_needs_two_people_and_the_card_says_so(login):
    thread = unique("invoices")
    invoice = {"invoiceId": "INV-2026-0042", "amount": 1250.0}
    run_id = start_run("billing-agent", f"/tool pay-invoice {json.dumps(invoice)}", thread=thread)
    call_id = SuspendedToolCall.objects.get(run_id=run_id, status="open").tool_call_id

    rita = login("rita")
    rita.goto(f"/approvals/threads/{thread}/")
    wait_live(rita)
    card = call_card(rita, call_id)
    expect(card.get_by_test_id("approvals")).to_have_text("0 of 2 approvals")
    card.get_by_role("button", name="Approve", exact=True).click()
    card = call_card(rita, call_id)
    expect(card.get_by_test_id("approvals")).to_have_text("1 of 2 approvals")
    expect(card.get_by_test_id("approved-by")).to_contain_text("Approved so far by rita")
    assert Run.objects.get(pk=run_id).status == "suspended"
    shoot(rita, "two-person-card")

    olga = login("olga")
    olga.goto(f"/approvals/threads/{thread}/")
    wait_live(olga)
    expect(call_card(olga, call_id).get_by_test_id("approvals")).to_have_text("1 of 2 approvals")
    call_card(olga, call_id).get_by_role("button", name="Approve", exact=True).click()
    expect(olga.locator(".call.done, .done")).to_contain_text("Approved")
    assert [d.decided_by_username for d in Decision.objects.filter(run_id=run_id).order_by("decided_at")] == [
        "rita",
        "olga",
    ]


def test_the_history_shows_a_sub_agents_edited_refund_as_a_refund(login):
    thread = unique("supervised")
    message = '/tool agent-billing-agent {"message": "/tool refund {\\"orderId\\": \\"o-5150\\", \\"amount\\": 99.0}"}'
    run_id = start_run("support-supervisor", message, thread=thread)

    async def approve_with_an_edit() -> None:
        from agentrun import get_agent

        decision = await get_agent("support-supervisor").approve_tool_call(
            run_id=run_id, args={"orderId": "o-5150", "amount": 49.5}, reason="half: the other half was store credit"
        )
        await decision.collect()

    run_python_api(approve_with_an_edit)
    page = login("rita")
    page.goto("/approvals/history/")
    row = page.locator("tr", has_text=thread)
    expect(row).to_contain_text("billing-agent → refund")
    expect(row.locator("del")).to_have_text("99.0")
    expect(row.locator("ins")).to_have_text("49.5")
    shoot(page, "history-sub-agent-refund")

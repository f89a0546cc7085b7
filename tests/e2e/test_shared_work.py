"""Shared work and a card that shows consequences (docs/dashboard.md#shared-work, docs/dashboard.md#cards):
a claim seen live by another reviewer, a per-field edit recorded as that edit, the outcome streaming into
the card, a question declined with a reason; and the screenshots of the inbox and the thread page."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from agentrun.core.models import Decision, RunStep, SuspendedToolCall
from tests.helpers.browser import DESKTOP, EMAIL, PHONE, call_card, screenshot, start_run, unique, wait_live
from tests.helpers.runs import wait_until_final

pytestmark = pytest.mark.e2e


def thread_url(thread: str) -> str:
    return reverse("approvals:thread", args=[thread])


def open_call(run_id: str) -> SuspendedToolCall:
    return SuspendedToolCall.objects.get(run_id=run_id, status="open")


def test_a_claim_appears_on_a_second_reviewers_page_within_2_s_and_never_blocks_her(login, suspend):
    thread = unique("t-claim")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)
    rita = login("rita")
    olga = login("olga")
    olga.goto(thread_url(thread))
    wait_live(olga)
    rita.goto(thread_url(thread))
    wait_live(rita)

    call_card(rita, call_id).get_by_role("button", name="I'm on it").click()
    expect(call_card(rita, call_id).get_by_test_id("claim")).to_contain_text("You are on it")
    claim = call_card(olga, call_id).get_by_test_id("claim")
    expect(claim).to_contain_text("rita is looking", timeout=2_000)  # live, within 2 s
    expect(claim).to_contain_text("You can still decide")
    screenshot(olga, "thread-claimed-desktop")

    # The inbox says it too, and "Mine" holds it for rita.
    rita.goto("/approvals/?mine=1")
    expect(rita.locator(f'.row-call[data-tool-call-ref="{call_id}"]')).to_contain_text("you are on it")

    # Olga decides anyway: nothing stops her; the decision records rita's claim.
    call_card(olga, call_id).get_by_role("button", name="Decline", exact=True).click()
    done = olga.locator(f'[data-decided-call-id="{call_id}"]')
    expect(done).to_contain_text("Declined")
    expect(done.get_by_test_id("claim-recorded")).to_contain_text("rita was on this call")
    decision = Decision.objects.get(run_id=run_id)
    assert decision.decided_by_username == "olga" and decision.details["claim"]["claimedBy"] == "rita"


def test_assigning_to_a_group_shows_live(login, suspend):
    from django.contrib.auth.models import Group

    Group.objects.get_or_create(name="Billing")
    thread = unique("t-assign")
    _, call_id = suspend("send-email", EMAIL, thread=thread)
    rita, olga = login("rita"), login("olga")
    for page in (rita, olga):
        page.goto(thread_url(thread))
        wait_live(page)
    card = call_card(rita, call_id)
    card.get_by_label("Assign to").select_option("group:Billing")
    card.get_by_role("button", name="Assign", exact=True).click()
    expect(call_card(olga, call_id).get_by_test_id("claim")).to_contain_text("assigned to Billing", timeout=2_000)


def test_a_per_field_edit_of_a_refund_amount_is_recorded_as_that_edit_and_the_outcome_streams_in(login):
    thread = unique("t-refund")
    run_id = start_run("billing-agent", '/tool refund {"orderId": "o-9", "amount": 99.0}', thread=thread)
    call_id = open_call(run_id).tool_call_id
    page = login("rita")
    page.goto(thread_url(thread))
    wait_live(page)
    card = call_card(page, call_id)
    card.get_by_role("button", name="Edit", exact=True).click()
    amount = card.locator(".arg-fields").get_by_label("amount")
    expect(amount).to_have_value("99")
    expect(card.locator(".arg-fields").get_by_label("orderId")).to_have_value("o-9")
    amount.fill("49.5")
    # The JSON follows the field; the diff says what changes, before anything is approved.
    expect(card.get_by_label("Arguments (JSON)")).to_have_value(re.compile(r'"amount": 49\.5'))
    diff = card.get_by_test_id("edit-diff").first
    expect(diff).to_contain_text("amount")
    expect(diff.locator("del")).to_have_text("99")
    expect(diff.locator("ins")).to_have_text("49.5")
    expect(diff).not_to_contain_text("orderId")
    screenshot(page, "card-field-edit-desktop")

    card.get_by_role("button", name="Edit & approve").click()
    # High risk: the confirmation shows the same field-level diff.
    confirm = card.get_by_role("alertdialog")
    expect(confirm).to_contain_text("High risk")
    expect(card.get_by_test_id("edit-diff")).to_contain_text("49.5")
    card.get_by_role("button", name=re.compile("Yes, approve")).click()

    done = page.locator(f'[data-decided-call-id="{call_id}"]')
    expect(done).to_contain_text("Approved")
    outcome = done.get_by_test_id("outcome")
    # The tool's result and the agent's next words arrive in the card, without a reload.
    expect(outcome.locator(".outcome-result")).to_contain_text('"refunded": 49.5', timeout=10_000)
    expect(outcome.locator(".outcome-words")).to_contain_text("refund:", timeout=10_000)
    expect(outcome).to_contain_text("The run finished")
    expect(page.locator("#recent-messages")).to_contain_text('"refunded": 49.5')  # the side column follows
    screenshot(page, "card-outcome-desktop")
    decision = Decision.objects.get(run_id=run_id)
    assert decision.args == {"orderId": "o-9", "amount": 99.0}
    assert decision.edited_args == {"orderId": "o-9", "amount": 49.5}


def test_a_question_can_be_declined_with_a_reason_and_the_agent_is_told(login, suspend):
    thread = unique("t-ask")
    run_id, call_id = suspend("ask-user", {"question": "Which city?"}, thread=thread)
    page = login("rita")
    page.goto(thread_url(thread))
    wait_live(page)
    card = call_card(page, call_id)
    card.get_by_label("Reason").fill("we do not ask customers that")
    card.get_by_role("button", name="Decline to answer").click()
    done = page.locator(f'[data-decided-call-id="{call_id}"]')
    expect(done).to_contain_text("Declined")
    expect(done.get_by_test_id("outcome")).to_contain_text("chose not to answer", timeout=10_000)
    decision = Decision.objects.get(run_id=run_id)
    assert (decision.kind, decision.reason) == ("decline", "we do not ask customers that")
    assert wait_until_final(run_id).status == "completed"
    outputs = json.dumps(list(RunStep.objects.filter(run_id=run_id).values_list("step_details", flat=True)))
    assert "Declined: the user chose not to answer this question: we do not ask customers that" in outputs


def test_screenshots_of_the_inbox_and_the_thread_at_1280_and_375(login, suspend):
    thread = unique("t-shots")
    _, call_id = suspend("send-email", dict(EMAIL, body="A long body. " * 20), thread=thread, resource="shots")
    suspend("delete-record", {"table": "users", "id": 7}, thread=thread, resource="shots")
    suspend("ask-user", {"question": "Which city?"}, thread=unique("t-shots-q"), resource="shots")
    page = login("rita")
    for name, url in (("inbox-counts", "/approvals/?resource=shots"), ("thread-claims", thread_url(thread))):
        page.set_viewport_size(DESKTOP)
        page.goto(url)
        wait_live(page)
        if name == "thread-claims":
            call_card(page, call_id).get_by_role("button", name="I'm on it").click()
            expect(call_card(page, call_id).get_by_test_id("claim")).to_contain_text("You are on it")
            call_card(page, call_id).get_by_role("button", name="Edit", exact=True).click()
        screenshot(page, f"{name}-1280")
        page.set_viewport_size(PHONE)
        scroll = page.evaluate("document.documentElement.scrollWidth")
        assert scroll <= PHONE["width"], f"{name} scrolls sideways at 375 px ({scroll}px)"
        screenshot(page, f"{name}-375")

"""The decision card in a real browser (issue 10): a reviewer approves exactly what they saw.

Edit mode and the args fingerprint, one card per sub-agent call, high-risk confirmation, resume forms
that speak to people, the offline state, batch decisions, the keyboard, and the context beside a card.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from agentrun.core.models import Decision, Run, SuspendedToolCall, ToolEffect, args_fingerprint
from tests.helpers.browser import DESKTOP, EMAIL, PHONE, call_card, screenshot, start_run, unique, wait_live
from tests.helpers.runs import wait_until_final

pytestmark = pytest.mark.e2e

SUB_AGENT_REFUND = '/tool agent-billing-agent {"message": "/tool refund {\\"orderId\\": \\"o-1\\", \\"amount\\": 5}"}'


def odd_thread(prefix: str) -> str:
    """A thread id the API accepts that a careless URL breaks: slash, space, %, #, ?, unicode."""
    return f"{prefix}/ä b%20#?-{uuid.uuid4().hex[:6]}"


def thread_url(thread: str) -> str:
    return reverse("approvals:thread", args=[thread])


# --- 1. editing is a mode; every decision is bound to the arguments shown ------------------------------
def test_editing_is_an_explicit_mode_and_edit_and_approve_runs_the_edit(login, suspend):
    thread = odd_thread("t-edit")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)
    page = login("rita")
    page.goto(thread_url(thread))
    card = call_card(page, call_id)
    editor = card.get_by_label("Arguments (JSON)")
    approve = card.get_by_role("button", name="Approve", exact=True)
    expect(card.get_by_test_id("args")).to_contain_text('"to": "ann@example.com"')
    expect(editor).to_be_hidden()  # nothing to type into by accident
    expect(card.get_by_role("button", name="Edit & approve")).to_be_hidden()

    card.get_by_role("button", name="Edit", exact=True).click()
    expect(card.get_by_label("to", exact=True)).to_have_value("ann@example.com")  # a field per argument
    expect(editor).to_be_visible()  # and the JSON beside them
    expect(approve).to_be_enabled()  # the editor still holds the arguments shown
    editor.fill(json.dumps(dict(EMAIL, to="bob@example.com"), indent=2))
    expect(approve).to_be_disabled()  # what is shown is not what is in the editor
    expect(card.get_by_text("Approve is off while your edit differs")).to_be_visible()
    screenshot(page, "card-editing-desktop")

    card.get_by_role("button", name="Cancel edit").click()
    expect(editor).to_be_hidden()
    expect(approve).to_be_enabled()

    card.get_by_role("button", name="Edit", exact=True).click()
    expect(editor).to_have_value(re.compile(r'"to": "ann@example.com"'))  # the edit was dropped
    expect(card.get_by_label("to", exact=True)).to_have_value("ann@example.com")
    editor.fill(json.dumps(dict(EMAIL, to="bob@example.com")))
    with page.expect_request(lambda r: r.method == "POST" and "/decide" in r.url) as posted:
        card.get_by_role("button", name="Edit & approve").click()
    form = dict(pair.split("=", 1) for pair in posted.value.post_data.split("&"))
    assert form["args_fingerprint"] == args_fingerprint(EMAIL)  # bound to what was shown
    assert form["action"] == "edit"
    expect(page.locator(f'[data-decided-call-id="{call_id}"]')).to_contain_text("Approved")
    decision = Decision.objects.get(run_id=run_id)
    assert decision.args == EMAIL and decision.edited_args == dict(EMAIL, to="bob@example.com")
    assert wait_until_final(run_id).status == "completed"
    assert ToolEffect.objects.get(run_id=run_id).payload["to"] == "bob@example.com"


def test_a_stale_card_is_refused_and_shows_the_current_arguments(login, suspend):
    thread = unique("t-stale")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)
    page = login("rita")
    page.goto(thread_url(thread))
    card = call_card(page, call_id)
    expect(card.get_by_test_id("args")).to_contain_text("ann@example.com")
    # The call's arguments change behind the page (the tool suspended again with new ones).
    changed = dict(EMAIL, to="mallory@example.com")
    SuspendedToolCall.objects.filter(run_id=run_id, tool_call_id=call_id).update(args=changed)

    card.get_by_role("button", name="Approve", exact=True).click()
    expect(card.get_by_role("alert")).to_contain_text("The arguments changed since this card was shown")
    expect(card.get_by_role("alert")).to_contain_text("Nothing was decided")
    expect(card.get_by_test_id("args")).to_contain_text("mallory@example.com")  # now shown: decide on that
    assert not Decision.objects.filter(run_id=run_id).exists()
    assert not ToolEffect.objects.filter(run_id=run_id).exists()

    card.get_by_role("button", name="Decline", exact=True).click()
    expect(page.locator(f'[data-decided-call-id="{call_id}"]')).to_contain_text("Declined")
    assert Decision.objects.get(run_id=run_id).kind == "decline"


# --- 3 (defect). A sub-agent's call is one card, one decision -------------------------------------------
def test_a_sub_agent_call_is_one_card_and_one_decision(login):
    thread = odd_thread("t-sub")
    run_id = start_run("support-supervisor", SUB_AGENT_REFUND, thread=thread)
    outer = SuspendedToolCall.objects.get(run_id=run_id, status="open")
    page = login("rita")
    page.goto(thread_url(thread))
    cards = page.locator(".call[data-tool-call-id]")
    expect(cards).to_have_count(1)  # not the inner refund a second time
    card = call_card(page, outer.tool_call_id)
    expect(card.get_by_role("heading", name="billing-agent → refund")).to_be_visible()
    expect(card.get_by_test_id("args")).to_contain_text('"amount": 5')
    screenshot(page, "thread-subagent-desktop")
    page.set_viewport_size(PHONE)
    screenshot(page, "thread-subagent-375")
    page.set_viewport_size(DESKTOP)

    card.get_by_role("button", name="Approve", exact=True).click()
    card.get_by_role("button", name="Yes, approve billing-agent → refund").click()
    expect(page.locator(f'[data-decided-call-id="{outer.tool_call_id}"]')).to_contain_text("Approved")
    assert wait_until_final(run_id).status == "completed"
    assert Decision.objects.filter(thread_id=thread).count() == 1  # one click, one record
    inner_runs = list(Run.objects.filter(parent_run_id=run_id).values_list("id", flat=True))
    assert ToolEffect.objects.filter(tool_name="refund", run_id__in=inner_runs).count() == 1
    page.goto(thread_url(thread))
    expect(page.get_by_text("Nothing waits in this thread.")).to_be_visible()  # no orphan inner card


# --- risk: high risk is distinct and never approved by one stray click ----------------------------------
@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "375"])
def test_one_click_on_approve_of_a_high_risk_call_decides_nothing(login, suspend, viewport):
    thread = unique("t-risk")
    run_id, call_id = suspend("delete-record", {"table": "users", "id": 7}, thread=thread)
    email_run, email_call = suspend("send-email", EMAIL, thread=thread)
    page = login("rita", **viewport)
    page.goto(thread_url(thread))
    card = call_card(page, call_id)
    expect(card).to_have_attribute("data-risk", "high")
    expect(card.get_by_text("high risk")).to_be_visible()
    expect(call_card(page, email_call).get_by_text("medium risk")).to_be_visible()
    # Distinct at a glance: a thick red edge the medium card does not have.
    high_edge = card.evaluate("e => getComputedStyle(e).borderLeftWidth")
    medium_edge = call_card(page, email_call).evaluate("e => getComputedStyle(e).borderLeftWidth")
    assert float(high_edge.removesuffix("px")) > float(medium_edge.removesuffix("px"))

    card.get_by_role("button", name="Approve", exact=True).dblclick()  # a stray (double) click
    confirm = card.get_by_role("alertdialog")
    expect(confirm).to_contain_text("High risk")
    expect(card.get_by_role("button", name="Cancel")).to_be_focused()  # Enter now cancels
    name = "desktop" if viewport is DESKTOP else "375"
    screenshot(page, f"thread-highrisk-confirm-{name}")
    page.wait_for_timeout(300)
    assert not Decision.objects.filter(run_id=run_id).exists()
    assert Run.objects.get(pk=run_id).status == "suspended"

    card.get_by_role("button", name="Cancel").click()
    expect(card.get_by_role("alertdialog")).to_have_count(0)
    card.get_by_role("button", name="Approve", exact=True).click()
    card.get_by_role("button", name="Yes, approve delete-record").click()
    expect(page.locator(f'[data-decided-call-id="{call_id}"]')).to_contain_text("Approved")
    assert Decision.objects.get(run_id=run_id).kind == "approve"
    # The medium-risk call takes one click.
    call_card(page, email_call).get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator(f'[data-decided-call-id="{email_call}"]')).to_contain_text("Approved")
    assert wait_until_final(run_id).status == "completed" and wait_until_final(email_run).status == "completed"


# --- 4 (defect). Resume forms and editors speak to the person -----------------------------------------
def test_resume_form_rejects_spaces_and_speaks_per_field(login, suspend):
    thread = unique("t-ask")
    run_id, call_id = suspend("ask-user", {"question": "Which city should we ship to?"}, thread=thread)
    page = login("rita", **PHONE)
    page.goto(thread_url(thread))
    card = call_card(page, call_id)
    card.get_by_label("Answer").fill("   ")
    card.get_by_role("button", name="Resume").click()
    answer = card.get_by_label("Answer")
    expect(answer).to_have_attribute("aria-invalid", "true")
    field = card.locator(".field.invalid")
    expect(field).to_contain_text("Please write an answer (spaces alone do not count).")
    expect(card.get_by_role("alert")).to_contain_text("Please correct the fields marked below.")
    expect(card).not_to_contain_text("resume schema")  # no engine talk
    screenshot(page, "card-resume-error-375")
    assert not Decision.objects.filter(run_id=run_id).exists()

    card.get_by_label("Answer").fill("Lyon")
    card.get_by_role("button", name="Resume").click()
    expect(page.locator(f'[data-decided-call-id="{call_id}"]')).to_contain_text("Resumed")
    assert Decision.objects.get(run_id=run_id).resume_data == {"answer": "Lyon"}


def test_invalid_json_in_the_editor_names_line_and_column(login, suspend):
    thread = unique("t-json")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)
    page = login("rita")
    page.goto(thread_url(thread))
    card = call_card(page, call_id)
    card.get_by_role("button", name="Edit", exact=True).click()
    card.get_by_label("Arguments (JSON)").fill('{\n  "to": "bob@example.com"\n  "subject": "x"\n}')
    card.get_by_role("button", name="Edit & approve").click()
    expect(card.get_by_role("alert")).to_contain_text("expecting ',' delimiter at line 3, column 3")
    expect(card.get_by_label("Arguments (JSON)")).to_be_visible()  # still editing, the text kept
    expect(card.get_by_role("button", name="Approve", exact=True)).to_be_disabled()
    assert not Decision.objects.filter(run_id=run_id).exists()


# --- 6 (defect). A dropped live connection: offline, deciding off, re-sync on reconnect ---------------
def test_a_dropped_feed_reads_offline_disables_deciding_and_resyncs(login, suspend):
    thread = odd_thread("t-offline")
    run_a, call_a = suspend("send-email", EMAIL, thread=thread)
    page = login("rita")
    sockets: list = []
    blocked = {"on": False}

    def feed(ws) -> None:  # the real socket to the server, through a switch the test holds
        if blocked["on"]:
            ws.close(code=1013, reason="try again later")  # the server stays unreachable
            return
        ws.connect_to_server()
        sockets.append(ws)

    page.route_web_socket(re.compile(r"/ws/approvals/"), feed)
    page.goto(thread_url(thread))
    wait_live(page)
    page.evaluate("window.__notReloaded = true")
    badge = page.locator(".live-badge")
    expect(badge).to_have_text("live")

    blocked["on"] = True
    sockets[-1].close(code=1001, reason="going away")  # the connection drops
    expect(badge).to_have_text("offline — reconnecting")
    approve = call_card(page, call_a).get_by_role("button", name="Approve", exact=True)
    expect(approve).to_be_disabled()
    expect(call_card(page, call_a).get_by_role("button", name="Decline", exact=True)).to_be_disabled()
    page.keyboard.press("j")
    page.keyboard.press("a")  # not by keyboard either
    screenshot(page, "thread-offline-desktop")

    # Meanwhile, elsewhere: another reviewer declines the call, and a new one opens.
    other = login("olga")
    other.goto(thread_url(thread))
    call_card(other, call_a).get_by_role("button", name="Decline", exact=True).click()
    expect(other.locator(f'[data-decided-call-id="{call_a}"]')).to_contain_text("Declined")
    run_b, call_b = suspend("send-email", dict(EMAIL, to="new@example.com"), thread=thread)
    page.wait_for_timeout(300)
    expect(call_card(page, call_b)).to_have_count(0)  # this page heard nothing: it is offline

    blocked["on"] = False  # the server is back: the next retry connects
    expect(badge).to_have_text("live", timeout=15_000)
    expect(page.locator(f'[data-decided-call-id="{call_a}"]')).to_contain_text("olga")
    expect(call_card(page, call_a)).to_have_count(0)
    expect(call_card(page, call_b).get_by_role("button", name="Approve", exact=True)).to_be_enabled()
    assert page.evaluate("window.__notReloaded") is True  # re-synced in place
    assert Decision.objects.get(run_id=run_a).decided_by_username == "olga"
    assert not Decision.objects.filter(run_id=run_b).exists()


# --- batch: Approve all / Decline all, one confirmation listing the calls, all or nothing --------------
def test_approve_all_lists_the_calls_once_then_decides_exactly_those(login, suspend):
    thread = odd_thread("t-batch")
    email_run, email_call = suspend("send-email", EMAIL, thread=thread)
    delete_run, delete_call = suspend("delete-record", {"table": "users", "id": 7}, thread=thread)
    sub_run = start_run("support-supervisor", SUB_AGENT_REFUND, thread=thread)
    ask_run, ask_call = suspend("ask-user", {"question": "Which city?"}, thread=thread)
    page = login("rita", **PHONE)
    page.goto(thread_url(thread))
    expect(page.locator(".call[data-tool-call-id]")).to_have_count(4)

    page.get_by_role("button", name="Approve all").click()
    confirm = page.get_by_role("alertdialog")
    expect(confirm).to_contain_text("Approve these 3 calls?")
    for text in ("send-email", "delete-record", "billing-agent → refund", '"amount": 5', "high risk"):
        expect(confirm).to_contain_text(text)
    expect(confirm).not_to_contain_text("ask-user")  # an answer is not an approval
    screenshot(page, "thread-batch-confirm-375")
    assert not Decision.objects.filter(thread_id=thread).exists()  # the first click only lists them

    # A listed call changes before the confirmation: nothing at all is decided.
    changed = dict(EMAIL, to="eve@example.com")
    SuspendedToolCall.objects.filter(run_id=email_run, tool_call_id=email_call).update(args=changed)
    confirm.get_by_role("button", name="Yes, approve 3 calls").click()
    expect(page.get_by_role("alert")).to_contain_text("The arguments of a listed call changed since you saw them.")
    assert not Decision.objects.filter(thread_id=thread).exists()
    expect(call_card(page, email_call).get_by_test_id("args")).to_contain_text("eve@example.com")

    page.get_by_role("button", name="Approve all").click()
    page.get_by_role("alertdialog").get_by_role("button", name="Yes, approve 3 calls").click()
    expect(page.get_by_role("status").filter(has_text="Approved 3 calls")).to_contain_text("billing-agent → refund")
    expect(page.locator(".call[data-tool-call-id]")).to_have_count(1)  # the question still waits
    expect(call_card(page, ask_call)).to_be_visible()
    decisions = Decision.objects.filter(thread_id=thread)
    assert sorted(d.kind for d in decisions) == ["approve"] * 3 and {d.via for d in decisions} == {"dashboard"}
    for run_id in (email_run, delete_run, sub_run):
        assert wait_until_final(run_id).status == "completed"
    assert ToolEffect.objects.get(run_id=email_run).payload["to"] == "eve@example.com"


def test_decline_all_with_a_reason(login, suspend):
    thread = unique("t-decline-all")
    runs = [
        suspend("send-email", EMAIL, thread=thread)[0],
        suspend("delete-record", {"table": "t", "id": 1}, thread=thread)[0],
    ]
    page = login("rita")
    page.goto(thread_url(thread))
    page.get_by_role("button", name="Decline all").click()
    confirm = page.get_by_role("alertdialog")
    expect(confirm).to_contain_text("Decline these 2 calls?")
    confirm.get_by_label("Reason").fill("duplicate request")
    confirm.get_by_role("button", name="Yes, decline 2 calls").click()
    expect(page.get_by_role("status").filter(has_text="Declined 2 calls")).to_be_visible()
    for run_id in runs:
        decision = Decision.objects.get(run_id=run_id)
        assert (decision.kind, decision.reason) == ("decline", "duplicate request")
        assert wait_until_final(run_id).status == "completed"


# --- keyboard: j/k move, a/d decide the focused card (high risk still confirms), ? shows the keys -------
def test_keyboard_moves_between_cards_and_decides_the_focused_one(login, suspend):
    thread = unique("t-keys")
    first_run, first = suspend("send-email", EMAIL, thread=thread)
    risky_run, risky = suspend("delete-record", {"table": "users", "id": 7}, thread=thread)
    last_run, last = suspend("send-email", dict(EMAIL, to="cy@example.com"), thread=thread)
    page = login("rita")
    page.goto(thread_url(thread))
    wait_live(page)

    page.keyboard.press("?")
    help_dialog = page.get_by_role("dialog", name="Keyboard shortcuts")
    expect(help_dialog).to_be_visible()
    expect(help_dialog).to_contain_text("approve the focused call")
    screenshot(page, "thread-keys-desktop")
    page.keyboard.press("Escape")
    expect(help_dialog).to_be_hidden()

    page.keyboard.press("j")
    expect(call_card(page, first)).to_be_focused()
    page.keyboard.press("j")
    expect(call_card(page, risky)).to_be_focused()
    page.keyboard.press("k")
    expect(call_card(page, first)).to_be_focused()
    page.keyboard.press("j")

    page.keyboard.press("a")  # high risk: the key asks, it does not approve
    card = call_card(page, risky)
    expect(card.get_by_role("alertdialog")).to_contain_text("High risk")
    expect(card.get_by_role("button", name="Cancel")).to_be_focused()
    page.keyboard.press("a")  # a second stray key press does not confirm either
    page.keyboard.press("Enter")  # Enter lands on Cancel
    expect(card.get_by_role("alertdialog")).to_have_count(0)
    expect(call_card(page, risky)).to_be_focused()  # focus comes back to the card, not to <body>
    assert not Decision.objects.filter(run_id=risky_run).exists()
    # Esc leaves a confirmation too, at once: before its swap has settled.
    page.keyboard.press("a")
    expect(card.get_by_role("alertdialog")).to_contain_text("High risk")
    page.keyboard.press("Escape")
    expect(card.get_by_role("alertdialog")).to_have_count(0)
    expect(call_card(page, risky)).to_be_focused()

    page.keyboard.press("k")
    expect(call_card(page, first)).to_be_focused()
    page.keyboard.press("d")  # d asks for a reason; nothing is declined yet
    reason = call_card(page, first).get_by_label("Reason")
    expect(reason).to_be_focused()
    page.keyboard.press("Escape")  # changed my mind: back to the card
    expect(call_card(page, first)).to_be_focused()
    assert not Decision.objects.filter(run_id=first_run).exists()
    page.keyboard.press("d")
    page.keyboard.type("wrong address")
    page.keyboard.press("Enter")
    expect(page.locator(f'[data-decided-call-id="{first}"]')).to_contain_text("Declined")
    expect(call_card(page, risky)).to_be_focused()  # focus moved on to the next card
    page.keyboard.press("j")
    expect(call_card(page, last)).to_be_focused()
    page.keyboard.press("a")
    expect(page.locator(f'[data-decided-call-id="{last}"]')).to_contain_text("Approved")

    assert Decision.objects.get(run_id=first_run).kind == "decline"
    assert Decision.objects.get(run_id=first_run).reason == "wrong address"
    assert Decision.objects.get(run_id=last_run).kind == "approve"
    assert not Decision.objects.filter(run_id=risky_run).exists()
    # Typing in a box is typing, not shortcuts.
    call_card(page, risky).get_by_label("Reason").fill("")
    call_card(page, risky).get_by_label("Reason").press_sequentially("add j k")
    assert not Decision.objects.filter(run_id=risky_run).exists()


# --- context: why the agent asks, for whom, and a question as prose ------------------------------------
def test_the_card_shows_the_agents_reason_the_resource_and_a_question_as_prose(login, suspend):
    from agentrun.core.models import Message

    thread = unique("t-context")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread, resource="acme/cust 7")
    ask_run, ask_call = suspend("ask-user", {"question": "Which city should we ship to?"}, thread=thread)
    # What a chat model writes beside its tool call (the scripted model writes none).
    reason = "The customer <b>asked</b> for a confirmation of the shipment."
    Message.objects.filter(run_id=run_id, role="assistant", tool_calls__isnull=False).update(content=reason)
    page = login("rita", **PHONE)
    page.goto(thread_url(thread))

    card = call_card(page, call_id)
    expect(card.get_by_test_id("call-reason")).to_contain_text(reason)  # as text: markup stays inert
    expect(card.get_by_test_id("call-reason")).to_contain_text("support-agent said")
    assert card.locator("b").count() == 0
    expect(page.get_by_test_id("thread-resource")).to_have_text("acme/cust 7")

    ask = call_card(page, ask_call)
    expect(ask.get_by_test_id("question")).to_have_text("Which city should we ship to?")
    expect(ask.locator("pre:visible")).to_have_count(0)  # not the payload's JSON, nor the args' again
    screenshot(page, "thread-context-375")
    page.set_viewport_size(DESKTOP)
    screenshot(page, "thread-context-desktop")

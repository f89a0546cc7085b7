"""The reviewer dashboard in a real browser (docs/dashboard.md): live inbox, decisions, races, escaping, access."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from agentrun.core.models import Decision, Message, Run, ToolEffect
from tests.helpers.browser import EMAIL, call_card, unique, wait_live

pytestmark = pytest.mark.e2e


def final_text(run_id: str) -> str:
    message = Message.objects.filter(run_id=run_id, role="assistant").order_by("created_at", "id").last()
    return message.content if message else ""


def open_run_page(page, run_id: str):
    page.get_by_role("link", name="Follow the run").click()
    page.wait_for_url(re.compile(rf"/approvals/runs/{run_id}/$"))
    answer = page.get_by_test_id("final-answer")
    expect(answer).to_be_visible(timeout=10_000)
    return answer


def test_inbox_shows_a_new_suspended_run_live_then_approve(login, suspend):
    page = login("rita")
    wait_live(page)
    page.evaluate("window.__notReloaded = true")
    thread = unique("t-live")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)

    row = page.locator(".thread-row", has=page.get_by_role("link", name=thread))
    expect(row).to_be_visible(timeout=3_000)
    expect(row).to_contain_text("1 open call")
    assert page.evaluate("window.__notReloaded") is True  # appeared without a reload

    row.get_by_role("link", name=thread).click()
    card = call_card(page, call_id)
    expect(card).to_contain_text("Send an email to a customer.")
    expect(card.get_by_label("Arguments (JSON)")).to_have_value(re.compile(r'"to": "ann@example.com"'))

    card.get_by_role("button", name="Approve", exact=True).click()
    expect(card).to_have_count(0)  # the call left the page
    expect(page.get_by_role("status")).to_contain_text("Approved")
    answer = open_run_page(page, run_id)
    expect(answer).to_contain_text('send-email: {"sent": true, "to": "ann@example.com"}')
    expect(page.locator(".timeline")).to_contain_text("Tool Calls")
    expect(page.locator("table.decisions")).to_contain_text("rita")

    # The inbox no longer lists the thread.
    page.goto("/approvals/")
    expect(page.get_by_role("link", name=thread)).to_have_count(0)


def test_decline_with_a_reason_reaches_the_final_text(login, suspend):
    thread = unique("t-decline")
    run_id, call_id = suspend("delete-record", {"table": "users", "id": 7}, thread=thread)
    page = login("rita")
    page.goto(f"/approvals/threads/{thread}/")
    card = call_card(page, call_id)
    card.get_by_label("Reason").fill("customer asked us to keep it")
    card.get_by_role("button", name="Decline", exact=True).click()
    expect(card).to_have_count(0)
    answer = open_run_page(page, run_id)
    expect(answer).to_contain_text("delete-record: denied: customer asked us to keep it")
    assert Decision.objects.get(run_id=run_id).reason == "customer asked us to keep it"


def test_edit_and_approve_validates_then_runs_with_the_edited_args(login, suspend):
    thread = unique("t-edit")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)
    page = login("rita")
    page.goto(f"/approvals/threads/{thread}/")
    card = call_card(page, call_id)
    card.get_by_role("button", name="Edit", exact=True).click()
    box = card.get_by_label("Arguments (JSON)")

    box.fill('{"to": "bob@example.com", oops')
    card.get_by_role("button", name="Edit & approve").click()
    expect(card.get_by_role("alert")).to_contain_text("not valid JSON")
    expect(card.get_by_label("Arguments (JSON)")).to_have_value('{"to": "bob@example.com", oops')
    box = card.get_by_label("Arguments (JSON)")
    box.fill(json.dumps({"to": "bob@example.com"}))
    card.get_by_role("button", name="Edit & approve").click()
    expect(card.get_by_role("alert")).to_contain_text("subject")
    assert not Decision.objects.filter(run_id=run_id).exists()
    assert Run.objects.get(pk=run_id).status == "suspended"

    edited = dict(EMAIL, to="bob@example.com")
    card.get_by_label("Arguments (JSON)").fill(json.dumps(edited, indent=2))
    card.get_by_role("button", name="Edit & approve").click()
    expect(card).to_have_count(0)
    answer = open_run_page(page, run_id)
    expect(answer).to_contain_text('send-email: {"sent": true, "to": "bob@example.com"}')
    assert ToolEffect.objects.get(run_id=run_id).payload["to"] == "bob@example.com"
    decision = Decision.objects.get(run_id=run_id)
    assert decision.edited_args == edited and decision.args == EMAIL


def test_resume_ask_user_through_the_generated_form(login, suspend):
    thread = unique("t-ask")
    run_id, call_id = suspend("ask-user", {"question": "Which city should we ship to?"}, thread=thread)
    page = login("rita")
    page.goto(f"/approvals/threads/{thread}/")
    card = call_card(page, call_id)
    expect(card).to_contain_text("Which city should we ship to?")
    expect(card.get_by_role("button", name="Approve", exact=True)).to_have_count(0)
    expect(card.get_by_role("button", name="Decline", exact=True)).to_have_count(0)

    card.get_by_role("button", name="Resume").click()  # the answer is empty
    expect(card.locator(".field-error")).to_be_visible()
    assert not Decision.objects.filter(run_id=run_id).exists()

    card.get_by_label("Answer").fill("San Francisco")
    card.get_by_role("button", name="Resume").click()
    expect(card).to_have_count(0)
    answer = open_run_page(page, run_id)
    expect(answer).to_contain_text('ask-user: {"answer": "San Francisco"}')


def test_two_reviewers_approve_the_same_call(login, suspend):
    thread = unique("t-race")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)
    first = login("rita")
    second = login("olga")
    watcher = login("olga")
    # The second reviewer's page misses the live feed (a flaky network): its click must still be safe.
    second.route_web_socket(re.compile(r"/ws/approvals/"), lambda ws: None)
    for page in (first, second, watcher):
        page.goto(f"/approvals/threads/{thread}/")
    wait_live(watcher)

    call_card(first, call_id).get_by_role("button", name="Approve", exact=True).click()
    expect(call_card(first, call_id)).to_have_count(0)

    call_card(second, call_id).get_by_role("button", name="Approve", exact=True).click()
    conflict = second.locator(f'[data-decided-call-id="{call_id}"]')
    expect(conflict).to_contain_text("Already decided")
    expect(conflict).to_contain_text("rita")
    expect(conflict).to_contain_text("via dashboard")
    # A page with the live feed is told without clicking.
    expect(watcher.locator(f'[data-decided-call-id="{call_id}"]')).to_contain_text("rita", timeout=3_000)
    expect(call_card(watcher, call_id)).to_have_count(0)
    assert Decision.objects.filter(run_id=run_id).count() == 1


def test_injected_markup_in_arguments_is_inert(login, suspend):
    thread = unique("t-xss")
    args = {"to": "<script>window.__xss = 1</script>", "subject": '<img src=x onerror="window.__xss = 2">', "body": "b"}
    run_id, call_id = suspend("send-email", args, thread=thread)
    page = login("rita")
    for url in (f"/approvals/threads/{thread}/", f"/approvals/runs/{run_id}/", "/approvals/"):
        page.goto(url)
        assert page.evaluate("window.__xss") is None
        assert page.locator("main img").count() == 0
    page.goto(f"/approvals/threads/{thread}/")
    expect(call_card(page, call_id).get_by_label("Arguments (JSON)")).to_have_value(
        re.compile(re.escape('"to": "<script>window.__xss = 1</script>"'))
    )
    page.goto(f"/approvals/runs/{run_id}/")
    expect(page.locator(".timeline")).to_contain_text('<img src=x onerror=\\"window.__xss = 2\\">')
    assert page.evaluate("window.__xss") is None


def test_viewer_reads_without_buttons_and_a_forged_post_is_refused(login, suspend, live_server_url):
    thread = unique("t-viewer")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)
    page = login("vic")
    page.goto(f"/approvals/threads/{thread}/")
    card = call_card(page, call_id)
    expect(card).to_contain_text("ann@example.com")
    for name in ("Approve", "Decline", "Edit & approve", "Resume"):
        expect(page.get_by_role("button", name=name, exact=True)).to_have_count(0)

    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(
        f"/approvals/runs/{run_id}/calls/{call_id}/decide",
        form={"action": "approve", "csrfmiddlewaretoken": csrf},
        headers={"X-CSRFToken": csrf, "Referer": f"{live_server_url}/approvals/threads/{thread}/"},
    )
    assert response.status == 403
    assert "You may not decide tool calls." in response.text()
    assert not Decision.objects.filter(run_id=run_id).exists()


def test_run_page_streams_the_continuation_in_live(login, suspend):
    thread = unique("t-follow")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)
    watcher = login("rita")
    watcher.goto(f"/approvals/runs/{run_id}/")
    expect(watcher.locator("#run-body")).to_contain_text("Waiting on 1 call")
    watcher.evaluate("window.__notReloaded = true")

    reviewer = login("olga")
    reviewer.goto(f"/approvals/threads/{thread}/")
    call_card(reviewer, call_id).get_by_role("button", name="Approve", exact=True).click()

    expect(watcher.get_by_test_id("final-answer")).to_contain_text('"sent": true', timeout=5_000)
    expect(watcher.locator("#run-body")).to_have_attribute("data-run-status", "completed")
    assert watcher.evaluate("window.__notReloaded") is True

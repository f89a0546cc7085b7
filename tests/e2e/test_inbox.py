"""The inbox at scale and the keyboard everywhere (docs/dashboard.md#inbox, docs/dashboard.md#keys): pages
with honest counts, a live feed that keeps the sort, keys on the inbox, and typed text that survives
live updates."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from agentrun.core.models import Decision, Run
from tests.helpers.browser import EMAIL, call_card, run_python_api, screenshot, unique, wait_live

pytestmark = pytest.mark.e2e


def start_many(n: int, *, resource: str, prefix: str) -> list[str]:
    """``n`` runs waiting on a send-email call, each on a thread of its own (``prefix-000`` …), oldest first."""
    from agentrun import get_agent

    line = '/tool send-email {"to": "ann@example.com", "subject": "Your order", "body": "It shipped."}'

    async def go() -> list[str]:
        agent = get_agent("support-agent")
        threads = []
        for i in range(n):
            thread = f"{prefix}-{i:03d}"
            stream = await agent.stream(line, memory={"thread": thread, "resource": resource})
            await stream.collect()
            threads.append(thread)
        return threads

    return run_python_api(go)


def cancel_waiting(resource: str) -> None:
    """Leave no waiting runs behind for the session's other tests (their inbox sorts oldest first)."""
    from agentrun.engine.decisions import cancel_run

    for run_id in Run.objects.filter(status="suspended", resource_id=resource).values_list("id", flat=True):
        cancel_run(run_id=run_id)


def rows(page) -> list[str]:
    return page.locator("#threads .thread-row").evaluate_all("els => els.map(e => e.dataset.threadId)")


def test_250_waiting_threads_page_with_counts_and_the_feed_keeps_the_sort(login):
    resource = unique("pages")
    prefix = unique("t-page")
    threads = start_many(250, resource=resource, prefix=prefix)
    try:
        page = login("rita")
        page.goto(f"/approvals/?resource={resource}")
        wait_live(page)
        count = page.get_by_test_id("inbox-count")
        expect(count).to_contain_text("200 of 250 threads waiting")
        expect(count).to_contain_text("250 open calls")
        first = rows(page)
        assert first == threads[:200]
        screenshot(page, "inbox-paged-desktop")

        page.get_by_role("link", name="Next threads →").click()
        expect(count).to_contain_text("201–250 of 250 threads waiting")
        second = rows(page)
        assert second == threads[200:]
        assert "page=2" in page.url and f"resource={resource}" in page.url
        expect(page.get_by_role("link", name="Next threads →")).to_have_count(0)
        # Rows a page or a filter brings are not news: "new" is for what arrived while the page was open.
        expect(page.locator("#threads .thread-row.is-new")).to_have_count(0)

        # A new thread sorts last (oldest first): it appears live on this, the last page, marked new,
        # and every count says so.
        [late] = start_many(1, resource=resource, prefix=unique("t-late"))
        expect(count).to_contain_text("201–251 of 251 threads waiting", timeout=5_000)
        expect(page.locator(f'#threads .thread-row[data-thread-id="{late}"]')).to_have_class(re.compile("is-new"))
        assert rows(page) == [*threads[200:], late]

        # Newest first keeps its sort across pages too.
        page.goto(f"/approvals/?resource={resource}&sort=newest")
        assert rows(page)[:2] == [late, threads[-1]]
        page.get_by_role("link", name="Next threads →").click()
        expect(count).to_contain_text("201–251 of 251 threads waiting")
        assert rows(page) == list(reversed(threads[:51]))
    finally:
        cancel_waiting(resource)


def test_inbox_keys_move_open_and_decline_with_a_reason(login, suspend):
    resource = unique("keys")
    thread_a, thread_b = unique("t-inbox-key-a"), unique("t-inbox-key-b")
    run_a, call_a = suspend("send-email", EMAIL, thread=thread_a, resource=resource)
    run_b, call_b = suspend("delete-record", {"table": "users", "id": 7}, thread=thread_b, resource=resource)
    try:
        page = login("rita")
        page.goto(f"/approvals/?resource={resource}")
        wait_live(page)
        row_a = page.locator(f'.row-call[data-tool-call-ref="{call_a}"]')
        row_b = page.locator(f'.row-call[data-tool-call-ref="{call_b}"]')
        page.keyboard.press("j")
        expect(row_a).to_be_focused()
        page.keyboard.press("j")
        expect(row_b).to_be_focused()
        page.keyboard.press("k")
        expect(row_a).to_be_focused()

        page.keyboard.press("d")  # the reason box opens; nothing is declined
        reason = row_a.get_by_label("Reason")
        expect(reason).to_be_focused()
        page.keyboard.type("half a")
        # A live update re-fetches the page meanwhile: the box, its text and its focus stay.
        suspend("send-email", dict(EMAIL, to="new@example.com"), thread=unique("t-inbox-key-c"), resource=resource)
        expect(page.get_by_test_id("inbox-count")).to_contain_text("3 of 3 threads waiting", timeout=5_000)
        page.keyboard.type(" thought")
        expect(reason).to_have_value("half a thought")
        expect(reason).to_be_focused()
        page.keyboard.press("Escape")
        expect(reason).to_be_hidden()
        expect(row_a).to_be_focused()  # focus is back on the call
        assert not Decision.objects.filter(run_id=run_a).exists(), list(
            Decision.objects.filter(run_id=run_a).values("kind", "via", "reason", "decided_by_username")
        )

        page.keyboard.press("d")
        expect(reason).to_have_value("")
        page.keyboard.type("wrong customer")
        page.keyboard.press("Enter")
        expect(row_a).to_contain_text("Declined")
        decision = Decision.objects.get(run_id=run_a)
        assert (decision.kind, decision.reason, decision.decided_by_username) == ("decline", "wrong customer", "rita")

        # a on a high-risk call opens its card (two steps there); Enter opens the focused call's card.
        expect(row_b).to_have_count(1, timeout=5_000)
        row_b.focus()
        page.keyboard.press("a")
        expect(call_card(page, call_b)).to_be_focused()
        assert not Decision.objects.filter(run_id=run_b).exists()
        page.go_back()
        page.locator(f'.row-call[data-tool-call-ref="{call_b}"]').focus()
        page.keyboard.press("Enter")
        expect(call_card(page, call_b)).to_be_focused()
    finally:
        cancel_waiting(resource)


def test_a_row_approved_on_arguments_that_changed_opens_the_calls_card(login, suspend):
    """A row shows arguments that have changed since (a stale page's fingerprint): approving from the row
    decides nothing and takes the reviewer to the call's card with the arguments as they are now, not
    a card squeezed into the list row."""
    resource = unique("stale")
    thread = unique("t-stale")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread, resource=resource)
    try:
        page = login("rita")
        page.goto(f"/approvals/?resource={resource}")
        wait_live(page)
        row = page.locator(f'.row-call[data-tool-call-ref="{call_id}"]')
        row.evaluate("r => { r.dataset.fingerprint = '0'.repeat(64); }")
        row.focus()
        page.keyboard.press("a")
        expect(page).to_have_url(re.compile(r"/approvals/threads/"))
        expect(call_card(page, call_id)).to_contain_text("ann@example.com")
        assert not Decision.objects.filter(run_id=run_id).exists()
    finally:
        cancel_waiting(resource)


def test_text_typed_in_a_card_survives_a_live_update(login, suspend):
    """A reviewer is typing a reason when the call is decided elsewhere and another call arrives: the card
    and its text stay, marked "changed meanwhile"; deciding on it then says who decided first."""
    thread = unique("t-typing")
    run_a, call_a = suspend("send-email", EMAIL, thread=thread)
    page = login("rita")
    page.goto(f"/approvals/threads/{thread}/")
    wait_live(page)
    reason = call_card(page, call_a).get_by_label("Reason")
    reason.fill("the customer asked us to wait until")

    other = login("olga")
    other.goto(f"/approvals/threads/{thread}/")
    call_card(other, call_a).get_by_role("button", name="Approve", exact=True).click()
    expect(other.locator(f'[data-decided-call-id="{call_a}"]')).to_contain_text("Approved")
    run_b, call_b = suspend("send-email", dict(EMAIL, to="bo@example.com"), thread=thread)

    expect(call_card(page, call_b)).to_be_visible(timeout=5_000)  # the live update came
    kept = call_card(page, call_a)
    expect(kept.locator(".changed-meanwhile")).to_contain_text("Changed meanwhile")
    expect(kept.locator(".changed-meanwhile")).to_contain_text("olga")
    expect(reason).to_have_value("the customer asked us to wait until")
    screenshot(page, "thread-changed-meanwhile-desktop")
    kept.get_by_role("button", name="Decline", exact=True).click()
    expect(page.locator(f'[data-decided-call-id="{call_a}"]')).to_contain_text("Already decided")
    assert Decision.objects.get(run_id=run_a).decided_by_username == "olga"

    # Typing in the new card survives a re-sync after the feed reconnects.
    box = call_card(page, call_b).get_by_label("Reason")
    box.fill("still typing")
    resync = (
        "htmx.ajax('GET', document.querySelector('.thread-page').dataset.threadUrl + '?resync=1&known=[]',"
        " {target: '#calls', swap: 'outerHTML'})"
    )
    page.evaluate(resync)  # what the page does when its feed reconnects
    expect(page.locator("#calls")).to_have_count(1)
    expect(call_card(page, call_b).get_by_label("Reason")).to_have_value("still typing")
    expect(call_card(page, call_b).locator(".changed-meanwhile")).to_have_count(0)  # nothing changed

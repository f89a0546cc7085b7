"""No table is clipped (issue 20, docs/dashboard.md#history): history, standing grants and the admin's
decision list, at 1280 and 375 px, measured in the browser (every table and its scrolling box:
``scrollWidth <= clientWidth``), with long ids, arguments and reasons. Screenshots of the history and the
admin's decision list at both widths go to artifacts/screenshots/.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from playwright.sync_api import expect

from agentrun.core.models import SuspendedToolCall
from tests.e2e.conftest import DESKTOP, PASSWORD, PHONE, run_python_api, screenshot, start_run

pytestmark = pytest.mark.e2e

# Every table, the box that would scroll it sideways, and the page: what is wider than its box.
CLIPPED = """() => {
  const wide = [];
  const check = (el, what) => {
    if (el.scrollWidth > el.clientWidth + 1) wide.push(`${what}: ${el.scrollWidth} > ${el.clientWidth}`);
  };
  check(document.documentElement, "page");
  // Tables of the page's own data (the admin's navigation sidebar is Django's, and collapsible).
  [...document.querySelectorAll("table")].filter(t => !t.closest("#nav-sidebar")).forEach((t, i) => {
    check(t, `table ${i} (${t.id || t.className})`);
    const edge = t.getBoundingClientRect().right;
    const past = [...t.querySelectorAll("*")].find(e => e.getBoundingClientRect().right > edge + 1);
    if (past) wide.push(`table ${i}: ${past.tagName}.${past.className} ends past its edge`);
    for (let p = t.parentElement; p && p !== document.body; p = p.parentElement) {
      const style = getComputedStyle(p);
      const scrolls = ["auto", "scroll", "hidden", "clip"].includes(style.overflowX);
      if (scrolls) check(p, `box of table ${i} (${p.className})`);
    }
    const right = Math.max(...[...t.querySelectorAll("th, td")].map(c => c.getBoundingClientRect().right));
    if (right > document.documentElement.clientWidth + 1) wide.push(`table ${i} cell ends at ${right}px`);
  });
  return wide;
}"""


def decide(run_id: str, kind: str, **kwargs) -> None:
    from agentrun import get_agent

    async def go() -> None:
        agent = get_agent("support-agent")
        method = {"approve": agent.approve_tool_call, "decline": agent.decline_tool_call}[kind]
        call = SuspendedToolCall.objects.get(run_id=run_id, status="open").tool_call_id
        stream = await method(run_id=run_id, tool_call_id=call, **kwargs)
        async for _ in stream.full_stream:
            pass

    run_python_api(go)


@pytest.fixture(scope="module")
def long_trail(users) -> str:
    """Decisions and a grant with the longest things a table must hold: ids, arguments, reasons."""
    from django.utils import timezone

    from agentrun.core.models import StandingGrant

    tag = uuid.uuid4().hex[:6]
    thread = f"customer-support/escalations/{'very-long-thread-name-' * 4}{tag}"
    email = {
        "to": f"{'someone.with.a.long.address' * 3}@example.com",
        "subject": "Your refund " * 8,
        "body": "x " * 200,
    }
    plain = start_run("support-agent", f"/tool send-email {json.dumps(email)}", thread=thread, resource="r/" * 40)
    decide(plain, "approve")
    edited = start_run("support-agent", f"/tool send-email {json.dumps(email)}", thread=thread + "-2")
    decide(edited, "approve", args=dict(email, to="ada@example.com", subject="Your refund of 25.50 EUR"))
    declined = start_run("support-agent", '/tool delete-record {"table": "users", "id": 7}', thread=f"gdpr-{tag}")
    decide(declined, "decline", reason="Keep it: " + "the customer asked us to keep this account open " * 5)
    StandingGrant.objects.create(
        agent_id="support-agent",
        tool_name="send-email",
        scope="thread",
        scope_id=thread,
        created_by=users["rita"],
        created_by_username="rita",
        expires_at=timezone.now() + timezone.timedelta(days=7),
    )
    return tag


def assert_nothing_clipped(page, what: str) -> None:
    for size in (DESKTOP, PHONE):
        page.set_viewport_size(size)
        # Reading scrollWidth lays the page out at the new size first: nothing to wait for.
        wide = page.evaluate(CLIPPED)
        assert not wide, f"{what} at {size['width']} px: {wide}"
    page.set_viewport_size(DESKTOP)


def test_history_is_not_clipped_at_1280_or_375(login, long_trail):
    page = login("rita")
    page.goto("/approvals/history/")
    expect(page.locator("table.decisions tbody tr").first).to_be_visible()
    # Every decision shows its arguments, a plain approval included.
    for row in page.locator("table.decisions tbody tr").all()[:3]:
        expect(row.locator('td[data-label="Arguments"] .args-diff')).to_be_visible()
    assert_nothing_clipped(page, "history")
    screenshot(page, "history-audit-1280")
    page.set_viewport_size(PHONE)
    screenshot(page, "history-audit-375")


def test_grants_are_not_clipped_and_revoke_stays_on_screen_at_375(login, long_trail):
    page = login("rita")
    page.goto("/approvals/grants/")
    expect(page.locator("table.grants tbody tr").first).to_be_visible()
    assert_nothing_clipped(page, "grants")
    page.set_viewport_size(PHONE)
    revoke = page.get_by_role("button", name="Revoke").first
    revoke.scroll_into_view_if_needed()
    box = revoke.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box


def test_admin_decision_list_is_not_clipped_at_1280_or_375(chromium, live_server_url, long_trail):
    from django.contrib.auth.models import User

    root, _ = User.objects.get_or_create(username="audit-root", defaults={"is_staff": True, "is_superuser": True})
    root.set_password(PASSWORD)
    root.save()
    context = chromium.new_context(base_url=live_server_url, viewport=DESKTOP)
    try:
        page = context.new_page()
        page.goto("/admin/login/?next=/admin/agentrun/decision/")
        page.get_by_label("Username").fill("audit-root")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        expect(page.locator("#result_list")).to_be_visible()
        # Times to the second with their zone; the new columns are there.
        expect(page.locator("#result_list td.field-decided, #result_list th.field-decided").first).to_have_text(
            re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")
        )
        for column in ("thread_link", "seen_tool", "edited", "reason_text", "via"):
            expect(page.locator(f"#result_list thead th.column-{column}")).to_have_count(1)
        assert_nothing_clipped(page, "admin decision list")
        screenshot(page, "admin-decisions-1280")
        page.set_viewport_size(PHONE)
        screenshot(page, "admin-decisions-375")
    finally:
        context.close()

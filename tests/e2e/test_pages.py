"""Inbox, run page and history in a real browser: any id works, rows say what waits, phones fit."""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect

from agentrun.core.models import Decision, SuspendedToolCall
from tests.helpers.browser import EMAIL, run_python_api, start_run, unique, wait_live

pytestmark = pytest.mark.e2e


def suspend(tool_id: str, args: dict, *, thread: str, resource: str = "cust-42") -> tuple[str, str]:
    run_id = start_run("support-agent", f"/tool {tool_id} {json.dumps(args)}", thread=thread, resource=resource)
    return run_id, SuspendedToolCall.objects.get(run_id=run_id, status="open").tool_call_id


def decide(run_id: str, call_id: str, kind: str, **kwargs) -> None:
    """Decide through the Python API (as another door would) and follow the continuation to its end."""
    from agentrun import get_agent

    async def go() -> None:
        agent = get_agent("support-agent")
        method = agent.approve_tool_call if kind == "approve" else agent.decline_tool_call
        stream = await method(run_id=run_id, tool_call_id=call_id, **kwargs)
        async for _ in stream.full_stream:
            pass

    run_python_api(go)


def no_horizontal_overflow(page) -> None:
    width = page.evaluate("document.documentElement.clientWidth")
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the page scrolls sideways: {scroll}px wide in a {width}px viewport"


ODD_THREADS = ["a/../b c%?#&ü 🧵", ".."]


@pytest.mark.parametrize("shape", ODD_THREADS, ids=["slashes-and-reserved", "dot-dot"])
def test_any_thread_id_works_on_every_page_and_link(login, shape):
    thread = shape if shape == ".." else f"{shape}-{uuid.uuid4().hex[:6]}"
    page = login("rita")
    wait_live(page)
    page.evaluate("window.__notReloaded = true")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread, resource=f"{thread}/res")

    # The inbox (no 500) gains the row live, through the ws feed.
    link = page.locator(".thread-row .thread-link", has_text=re.compile(rf"^{re.escape(thread)}$"))
    expect(link).to_have_count(1, timeout=5_000)
    assert page.evaluate("window.__notReloaded") is True
    link.click()
    expect(page.locator("h1")).to_contain_text(thread)
    expect(page.locator(f'[data-tool-call-id="{call_id}"]')).to_be_visible()

    # The run page (no 500) links back to this very thread.
    page.goto(f"/approvals/runs/{run_id}/")
    page.locator(".facts").get_by_role("link", name=thread, exact=True).click()
    expect(page.locator(f'[data-tool-call-id="{call_id}"]')).to_be_visible()

    # Decided elsewhere: the history row links to the thread too.
    decide(run_id, call_id, "decline", reason="not this one")
    page.goto("/approvals/history/")
    row = page.locator(f'tr:has(a.run-link:text-is("{run_id}"))')
    row.get_by_role("link", name=thread, exact=True).click()
    expect(page.locator("h1")).to_contain_text(thread)
    expect(page.locator(".empty")).to_contain_text("Nothing waits")


def test_inbox_rows_say_what_waits_live_with_risk_filters_and_sort(login):
    tag = uuid.uuid4().hex[:6]
    email_run, _ = suspend("send-email", EMAIL, thread=f"t-mail-{tag}", resource=f"ann-{tag}")
    page = login("rita")
    wait_live(page)
    page.evaluate("window.__notReloaded = true")
    # A high-risk call arrives while the page is open: its row appears without a reload.
    suspend("delete-record", {"table": "users", "id": 7}, thread=f"t-del-{tag}", resource=f"bob-{tag}")
    high_row = page.locator(".thread-row", has=page.get_by_role("link", name=f"t-del-{tag}"))
    expect(high_row).to_be_visible(timeout=5_000)
    assert page.evaluate("window.__notReloaded") is True
    mail_row = page.locator(".thread-row", has=page.get_by_role("link", name=f"t-mail-{tag}"))

    # Each row says what waits: tool, arguments in one line, risk, who, how long.
    expect(mail_row.locator(".row-call .tool")).to_have_text("send-email")
    summary = mail_row.locator(".row-call .summary")
    expect(summary).to_contain_text("to=ann@example.com")  # key order: the database's (jsonb sorts)
    assert set(summary.inner_text().split(" · ")) == {"to=ann@example.com", "subject=Your order", "body=It shipped."}
    expect(mail_row.locator(".who")).to_contain_text(f"ann-{tag}")
    expect(mail_row.locator(".waited")).to_contain_text(re.compile(r"waiting \d+s"))
    expect(high_row.locator(".risk")).to_have_text("high risk")
    # High risk is visually distinct: its badge and row edge are not those of a medium call.
    high_bg = high_row.locator(".risk").evaluate("e => getComputedStyle(e).backgroundColor")
    medium_bg = mail_row.locator(".risk").evaluate("e => getComputedStyle(e).backgroundColor")
    assert high_bg != medium_bg
    high_edge = high_row.evaluate("e => getComputedStyle(e).borderLeftColor")
    assert high_edge != mail_row.evaluate("e => getComputedStyle(e).borderLeftColor")

    # Filters (htmx, URL kept) and sort; the menus list what waited when the page loaded.
    page.reload()
    wait_live(page)
    page.evaluate("window.__notReloaded = true")
    page.get_by_label("Risk").select_option("high")
    expect(mail_row).to_have_count(0)
    expect(high_row).to_be_visible()
    assert "risk=high" in page.url
    page.get_by_label("Risk").select_option("")
    page.get_by_label("Resource").select_option(f"ann-{tag}")
    expect(high_row).to_have_count(0)
    expect(mail_row).to_be_visible()
    page.get_by_label("Resource").select_option("")
    page.get_by_label("Tool").select_option("delete-record")
    expect(mail_row).to_have_count(0)
    page.get_by_label("Tool").select_option("")
    expect(mail_row).to_be_visible()
    expect(mail_row).not_to_have_class(re.compile("is-new"))  # a filter brought it back; it did not arrive

    def order() -> list[str]:
        ids = page.locator(".thread-row").evaluate_all("rows => rows.map(r => r.dataset.threadId)")
        return [i for i in ids if i.endswith(tag)]

    assert order() == [f"t-mail-{tag}", f"t-del-{tag}"]
    page.get_by_label("Sort").select_option("newest")
    expect(page.locator(".thread-row").filter(has_text=tag).first).to_have_attribute("data-thread-id", f"t-del-{tag}")
    assert order() == [f"t-del-{tag}", f"t-mail-{tag}"]

    # Counts per agent, and a row that leaves when its call is decided elsewhere (live).
    expect(page.locator('.agent-counts [data-agent-id="support-agent"] .n')).to_have_text(re.compile(r"^\d+$"))
    decide(email_run, SuspendedToolCall.objects.get(run_id=email_run).tool_call_id, "approve")
    expect(mail_row).to_have_count(0, timeout=5_000)
    assert page.evaluate("window.__notReloaded") is True
    page.set_viewport_size({"width": 375, "height": 800})
    no_horizontal_overflow(page)


def test_the_last_filter_chosen_wins_even_while_the_previous_answer_settles(login):
    """A filter chosen while the one before it is still on its way replaces it, also when that one was
    chosen the moment the answer before it landed: htmx re-wires a swapped-in section when it settles,
    which forgot the request in flight, so neither request replaced the other and whichever answer came
    back first stayed on the page (CI saw a row the chosen filter excludes stay on the page)."""
    tag = uuid.uuid4().hex[:6]
    suspend("send-email", EMAIL, thread=f"t-mail-{tag}", resource=f"ann-{tag}")
    suspend("delete-record", {"table": "users", "id": 7}, thread=f"t-del-{tag}", resource=f"bob-{tag}")
    page = login("rita")
    wait_live(page)
    mail_row = page.locator(".thread-row", has=page.get_by_role("link", name=f"t-mail-{tag}"))
    high_row = page.locator(".thread-row", has=page.get_by_role("link", name=f"t-del-{tag}"))
    expect(mail_row).to_be_visible()

    # The network as a slow day makes it: "any risk" answers in 0.15 s, the tool filter in 0.4 s.
    def slow(route) -> None:
        time.sleep(0.4 if "tool=delete-record" in route.request.url else 0.15)
        with contextlib.suppress(PlaywrightError):  # the browser gave it up meanwhile (a later filter replaced it)
            route.continue_()

    page.route(re.compile(r"/approvals/\?.*risk=&"), slow)
    # The risk filter's answer lands; 10 ms later the reviewer sets the risk back to "any", and 60 ms
    # after that (that answer is not back) picks a tool instead.
    page.evaluate(
        """() => new Promise(done => {
            const pick = (name, value) => {
                const select = document.querySelector(`form.filters select[name="${name}"]`);
                select.value = value;
                select.dispatchEvent(new Event("change", {bubbles: true}));
            };
            document.body.addEventListener("htmx:afterSwap", function first() {
                document.body.removeEventListener("htmx:afterSwap", first);
                setTimeout(() => pick("risk", ""), 10);
                setTimeout(() => { pick("tool", "delete-record"); done(); }, 70);
            });
            pick("risk", "high");
        })"""
    )
    expect(page).to_have_url(re.compile(r"tool=delete-record"))
    page.wait_for_timeout(1_000)  # both answers are back (or the first was replaced)
    expect(mail_row).to_have_count(0)
    expect(high_row).to_be_visible()
    expect(page.get_by_label("Tool")).to_have_value("delete-record")


def test_run_page_shows_what_an_edited_call_ran_with(login):
    thread = unique("t-ran")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)
    edited = dict(EMAIL, to="bob@example.com")
    decide(run_id, call_id, "approve", args=edited)
    page = login("rita")
    page.goto(f"/approvals/runs/{run_id}/")
    call = page.locator(f'.timeline [data-step-call-id="{call_id}"]')
    diff = call.locator(".args-diff")
    expect(diff).to_be_visible()
    expect(diff.locator("del")).to_have_text("ann@example.com")
    expect(diff.locator("ins")).to_have_text("bob@example.com")
    expect(call.locator(".tag.info")).to_have_text("edited")
    # The original is struck through, the value that ran is not.
    assert "line-through" in diff.locator("del").evaluate("e => getComputedStyle(e).textDecorationLine")
    assert "line-through" not in diff.locator("ins").evaluate("e => getComputedStyle(e).textDecorationLine")
    expect(page.get_by_test_id("final-answer")).to_contain_text('"to": "bob@example.com"')


def test_history_has_thread_resource_zone_diff_and_fits_375px(login):
    long_thread = "t-hist/" + "x" * 120 + uuid.uuid4().hex[:6]
    run_id, call_id = suspend("send-email", EMAIL, thread=long_thread, resource="res/with a long name " * 3)
    decide(run_id, call_id, "approve", args=dict(EMAIL, subject="Your refund"))
    risky_run, risky_call = suspend("delete-record", {"table": "users", "id": 9}, thread=unique("t-hist-risk"))
    decide(risky_run, risky_call, "decline", reason="keep it")
    page = login("rita")
    page.goto("/approvals/history/")
    row = page.locator(f'tr[data-decision-id="{Decision.objects.get(run_id=run_id).id}"]')
    expect(row.locator('td[data-label="Thread"] a')).to_have_text(long_thread)
    expect(row.locator('td[data-label="Resource"]')).to_contain_text("res/with a long name")
    expect(row.locator("time")).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))
    expect(row.locator(".args-diff del")).to_have_text("Your order")
    expect(row.locator(".args-diff ins")).to_have_text("Your refund")
    risky = page.locator(f'tr[data-decision-id="{Decision.objects.get(run_id=risky_run).id}"]')
    expect(risky).to_have_class(re.compile(r"\brisk-high\b"))
    expect(risky.locator(".risk")).to_have_text("high risk")

    page.set_viewport_size({"width": 375, "height": 800})
    no_horizontal_overflow(page)
    # Stacked, labelled cells: the label shows beside each value, every value inside the screen.
    label = row.locator('td[data-label="Thread"]').evaluate("e => getComputedStyle(e, '::before').content")
    assert label == '"Thread"'
    for cell in row.locator("td").all():
        box = cell.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 375, cell.get_attribute("data-label")


def test_every_page_has_a_favicon_and_a_clean_console(chromium, live_server_url, users):
    from tests.helpers.browser import PASSWORD

    context = chromium.new_context(base_url=live_server_url)
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    try:
        page.goto("/accounts/login/")
        icon = page.locator('link[rel="icon"]').get_attribute("href")
        response = page.request.get(icon)
        assert response.status == 200 and response.headers["content-type"].startswith("image/svg")
        page.get_by_label("Username").fill("rita")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(re.compile(r"/approvals/$"))
        run_id, _ = suspend("send-email", EMAIL, thread=unique("t-icon"))
        for url in ("/approvals/", "/approvals/history/", f"/approvals/runs/{run_id}/"):
            page.goto(url)
            page.wait_for_load_state("networkidle")
        # Pages without our <link rel="icon"> (the admin's, the API docs) get it at /favicon.ico.
        favicon = page.request.get("/favicon.ico")
        assert favicon.status == 200 and favicon.headers["content-type"].startswith("image/svg")
    finally:
        context.close()
    assert not problems, problems

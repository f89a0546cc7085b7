"""The dashboard's screenshots (artifacts/screenshots/): inbox, thread, run, history, desktop and 375 px.

One scene, seeded through the Python API: a thread holding a high-risk call beside an ordinary one and a
sub-agent's call, a question on another thread, and decided calls (one edited) for the run page and the
history. Every page is also checked for sideways scrolling at 375 px.
"""

from __future__ import annotations

import json
import uuid

import pytest
from playwright.sync_api import expect

from agentrun.core.models import Run, SuspendedToolCall
from tests.helpers.browser import DESKTOP, PHONE, run_python_api, screenshot, start_run

pytestmark = pytest.mark.e2e


def tool_lines(*calls: tuple[str, dict]) -> str:
    return "\n".join(f"/tool {tool} {json.dumps(args)}" for tool, args in calls)


def decide(agent_id: str, run_id: str, kind: str, **kwargs) -> None:
    from agentrun import get_agent

    async def go() -> None:
        agent = get_agent(agent_id)
        method = {"approve": agent.approve_tool_call, "decline": agent.decline_tool_call}[kind]
        for call in SuspendedToolCall.objects.filter(run_id=run_id, status="open").values_list(
            "tool_call_id", flat=True
        ):
            s = await method(run_id=run_id, tool_call_id=call, **kwargs)
            async for _ in s.full_stream:
                pass

    run_python_api(go)


def clear_the_inbox() -> None:
    """Earlier tests of the session leave runs waiting: cancel them (through the engine) for a clean scene."""
    from agentrun.engine.decisions import cancel_run

    for run_id in Run.objects.filter(status="suspended", parent_run__isnull=True).values_list("id", flat=True):
        cancel_run(run_id=run_id)


def shoot(page, name: str) -> None:
    page.set_viewport_size(DESKTOP)
    screenshot(page, f"{name}-desktop")
    page.set_viewport_size(PHONE)
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= PHONE["width"], f"{name} scrolls sideways at 375 px ({scroll}px)"
    screenshot(page, f"{name}-375")
    page.set_viewport_size(DESKTOP)


def test_screenshots_of_every_page(login):
    clear_the_inbox()
    tag = uuid.uuid4().hex[:4]
    order_thread = f"order-1017-{tag}"
    # Decided first, so that the history holds them and the run page shows an edited call.
    edited_run = start_run(
        "support-agent",
        tool_lines(("send-email", {"to": "ada@example.com", "subject": "Your refund", "body": "It is on its way."})),
        thread=f"refunds-{tag}",
        resource="customer-42",
    )
    decide(
        "support-agent",
        edited_run,
        "approve",
        args={"to": "ada.lovelace@example.com", "subject": "Your refund of 25.50 EUR", "body": "It is on its way."},
    )
    declined = start_run(
        "support-agent",
        tool_lines(("delete-record", {"table": "users", "id": 7})),
        thread=f"gdpr-{tag}",
        resource="customer-7",
    )
    decide("support-agent", declined, "decline", reason="Legal hold: keep until the audit is closed.")
    # What waits.
    start_run(
        "support-agent",
        tool_lines(
            ("delete-record", {"table": "orders", "id": 1017}),
            (
                "send-email",
                {"to": "ops@example.com", "subject": "Deleted order 1017", "body": "At the customer's request."},
            ),
        ),
        thread=order_thread,
        resource="customer-7",
    )
    start_run(
        "support-supervisor",
        '/tool agent-billing-agent {"message": "/tool refund {\\"orderId\\": \\"A-881\\", \\"amount\\": 25.5}"}',
        thread=order_thread,
        resource="customer-7",
    )
    start_run(
        "support-agent",
        tool_lines(("ask-user", {"question": "Which city should we ship the replacement to?"})),
        thread=f"travel-{tag}",
        resource="customer-42",
    )

    page = login("rita")
    expect(page.locator('body[data-live="on"]')).to_have_count(1)
    expect(page.locator(".thread-row")).to_have_count(2)
    expect(page.locator(".thread-row.risk-high .row-call")).to_have_count(3)  # the order thread
    shoot(page, "inbox")

    page.get_by_role("link", name=order_thread).first.click()
    expect(page.locator("[data-tool-call-id]").nth(2)).to_be_visible()
    expect(page.locator("main")).to_contain_text("refund")
    shoot(page, "thread")

    page.goto(f"/approvals/runs/{edited_run}/")
    expect(page.get_by_test_id("final-answer")).to_contain_text("ada.lovelace@example.com")
    expect(page.locator(".timeline .args-diff ins").last).to_contain_text("25.50 EUR")
    shoot(page, "run")
    page.set_viewport_size(PHONE)
    page.emulate_media(color_scheme="dark")
    screenshot(page, "run-375-dark")
    page.emulate_media(color_scheme="light")

    page.goto("/approvals/history/")
    expect(page.locator("tr.risk-high").first).to_be_visible()
    expect(page.locator(".args-diff").first).to_be_visible()
    shoot(page, "history")

"""``/approvals/metrics/`` in the browser: the charts draw (uPlot, served from static/) at 1280 and 375 px
without sideways scrolling, and the page's numbers are the decisions table's (artifacts/screenshots/)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from agentrun.core.models import Decision, Run, Thread
from tests.helpers.browser import DESKTOP, PHONE, screenshot

pytestmark = pytest.mark.e2e


def seed_history() -> None:
    """Two weeks of decisions on two tools, waits from seconds to hours (written as any writer would:
    the database's rollup counts them)."""
    tag = uuid.uuid4().hex[:6]
    thread = Thread.objects.create(id=f"metrics-{tag}")
    run = Run.objects.create(agent_id="support-agent", thread=thread, status=Run.Status.COMPLETED)
    now = timezone.now()
    rows = []
    for day in range(14):
        for i in range(6 + day % 4):
            decided_at = now - timedelta(days=day, minutes=i)
            tool = "send-email" if i % 3 else "delete-record"
            kind = "decline" if (i + day) % 5 == 0 else "approve"
            rows.append(
                Decision(
                    run=run,
                    agent_id=run.agent_id,
                    thread_id=thread.id,
                    tool_call_id=f"{tag}-{day}-{i}",
                    tool_name=tool,
                    kind=kind,
                    via="dashboard" if i % 2 else "api",
                    decided_at=decided_at,
                    waiting_since=decided_at - timedelta(seconds=20 * (i + 1) * (day + 1) ** 2),
                )
            )
    Decision.objects.bulk_create(rows)


def test_the_metrics_page_draws_its_charts_and_matches_the_decisions_table(login):
    seed_history()
    page = login("rita")
    page.goto("/approvals/metrics/")
    since = (timezone.now() - timedelta(days=29)).date()
    expect(page.locator("#total-decisions")).to_have_text(
        str(Decision.objects.filter(decided_at__date__gte=since).count())
    )
    for chart in ("#chart-decisions", "#chart-waits"):
        expect(page.locator(f"{chart} .uplot canvas")).to_be_visible()
    expect(page.locator("#per-tool [data-tool='send-email']")).to_be_visible()
    page.set_viewport_size(DESKTOP)
    screenshot(page, "metrics-desktop")
    page.set_viewport_size(PHONE)
    # A function, not a string: Playwright would eval a string, which the Content-Security-Policy forbids.
    page.wait_for_function("() => document.querySelector('#chart-waits .uplot').offsetWidth <= 375")
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= PHONE["width"], f"the metrics page scrolls sideways at 375 px ({scroll}px)"
    screenshot(page, "metrics-375")

"""The Content-Security-Policy holds in a real browser (issue 24): every page — sign-in, the dashboard, a
decision link, email settings, the admin, the API docs — works with no CSP violation in the console,
and the live parts (htmx, the websocket feed, the thread page's refresh) still run under it."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from playwright.sync_api import expect

from tests.helpers.browser import E2E_DIR, EMAIL, PASSWORD, call_card, unique, wait_live

pytestmark = pytest.mark.e2e


def watch(page: Any) -> list[str]:
    """CSP violations (the browser reports each on the console: "Refused to … Content Security Policy")
    and uncaught script errors."""
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if "Content Security Policy" in m.text else None)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    return problems


def visit(page: Any, url: str) -> None:
    response = page.goto(url)
    assert response is not None and response.status < 400, f"{url}: {response and response.status}"
    assert "script-src 'self'" in response.headers["content-security-policy"], url
    page.wait_for_load_state("networkidle")


@pytest.fixture
def admin_user(users: dict) -> Any:
    from django.contrib.auth.models import User

    user, _ = User.objects.get_or_create(username="csp-admin", defaults={"is_staff": True, "is_superuser": True})
    user.set_password(PASSWORD)
    user.save()
    return user


def test_every_page_runs_without_a_csp_violation(chromium, live_server_url, admin_user, suspend, settings):
    from django.contrib import admin

    from agentrun.core.models import Decision, Run
    from notifications import links

    thread = unique("t-csp")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)
    settings.AGENTRUN_PUBLIC_URL = live_server_url
    settings.SECRET_KEY = os.environ.get("SECRET_KEY") or (E2E_DIR / "secret_key").read_text().strip()
    from agentrun.core.models import SuspendedToolCall

    link = links.create(admin_user, SuspendedToolCall.objects.get(run_id=run_id, tool_call_id=call_id))

    context = chromium.new_context(base_url=live_server_url)
    page = context.new_page()
    problems = watch(page)
    try:
        visit(page, "/accounts/login/")
        page.get_by_label("Username").fill("csp-admin")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(re.compile(r"/approvals/$"))
        wait_live(page)  # htmx and its ws extension run: the feed is connected

        pages = [
            "/approvals/",
            "/approvals/history/",
            "/approvals/grants/",
            "/approvals/settings/",
            "/approvals/metrics/",
            f"/approvals/runs/{run_id}/",
            link.removeprefix(live_server_url),
            "/admin/",
            "/admin/notifications/webhookendpoint/add/",
            "/api/docs/",
        ]
        pages += [f"/admin/{m._meta.app_label}/{m._meta.model_name}/" for m in admin.site._registry]  # every list
        pages.append(f"/admin/agentrun/run/{quote(run_id)}/change/")
        for url in pages:
            visit(page, url)
            if url == "/api/docs/":
                expect(page.locator(".swagger-ui .info")).to_be_visible()  # the docs' script ran

        # The thread page: its live refresh (htmx:configRequest adds the shown calls) runs on a feed event.
        visit(page, "/approvals/")
        page.locator(".thread-row .thread-link", has_text=thread).click()
        wait_live(page)
        expect(call_card(page, call_id)).to_be_visible()
        second_run, second_call = suspend("send-email", EMAIL, thread=thread)
        expect(call_card(page, second_call)).to_be_visible(timeout=5_000)
        expect(call_card(page, call_id)).to_have_count(1)  # known calls were sent: not appended twice
        # Deciding goes through htmx too.
        call_card(page, second_call).get_by_role("button", name="Decline", exact=True).click()
        expect(page.locator(f'[data-decided-call-id="{second_call}"]')).to_contain_text("Declined")
        assert Decision.objects.filter(run_id=second_run).exists()
        assert Run.objects.filter(pk=run_id, status="suspended").exists()
    finally:
        context.close()
    assert not problems, "\n".join(problems)

"""An email with a working decision link, end to end (issue 14): a run suspends, the reviewer's email
(Django's file backend) holds a signed link, a real browser opens it — which decides nothing — and
approves; the run completes on the server, and the used link says so."""

from __future__ import annotations

import os
import re
import time
import uuid
from email import message_from_string
from email.message import EmailMessage
from email.policy import default
from pathlib import Path

import pytest
from playwright.sync_api import expect

from agentrun.core.models import Decision, ToolEffect
from notifications.delivery import notifier
from tests.helpers.browser import E2E_DIR, screenshot
from tests.helpers.runs import wait_until_final
from tests.helpers.waiting import wait_for_tasks

pytestmark = pytest.mark.e2e

EMAIL = {"to": "ann@example.com", "subject": "Your <order>", "body": "It shipped."}


@pytest.fixture
def mailbox(settings, tmp_path: Path, live_server_url: str) -> Path:
    """Email from this process goes to files; its links point at the live server, signed with its key."""
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.filebased.EmailBackend",
            "OPTIONS": {"file_path": str(tmp_path)},
        }
    }
    settings.AGENTRUN_PUBLIC_URL = live_server_url
    settings.SECRET_KEY = os.environ.get("SECRET_KEY") or (E2E_DIR / "secret_key").read_text().strip()
    yield tmp_path
    wait_for_tasks()


@pytest.fixture
def erin(users):
    from django.contrib.auth.models import Group, User

    from agentrun.core.access import REVIEWERS

    user, _ = User.objects.get_or_create(username="erin", defaults={"email": "erin@example.com"})
    user.groups.add(Group.objects.get(name=REVIEWERS))
    notifier.invalidate()
    yield user
    user.delete()  # the other browser tests send no email


def wait_for_email(mailbox: Path, needle: str, timeout: float = 15) -> EmailMessage:
    """The first message in the mailbox's files whose text mentions ``needle``, parsed as a mail client would."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in mailbox.iterdir():
            for raw in path.read_text().split("-" * 79):
                if (
                    raw.strip()
                    and needle in (message := message_from_string(raw.strip(), policy=default)).get_content()
                ):
                    return message
        time.sleep(0.1)
    raise AssertionError(f"no email mentioning {needle!r}")


def test_an_emailed_link_approves_in_a_real_browser(chromium, live_server_url, mailbox, erin, suspend):
    thread = f"t-mail-{uuid.uuid4().hex[:8]}"
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)
    message = wait_for_email(mailbox, thread)
    assert message["To"] == "erin@example.com" and "send-email" in message["Subject"]
    [link] = re.findall(rf"{re.escape(live_server_url)}/approvals/links/\S+/", message.get_content())

    context = chromium.new_context(viewport={"width": 1280, "height": 900})  # nobody signed in
    context.set_default_timeout(8_000)
    page = context.new_page()
    page.goto(link)
    expect(page.get_by_role("heading", level=1)).to_contain_text("Review send-email")
    expect(page.get_by_test_id("link-args")).to_contain_text('"subject": "Your <order>"')
    expect(page.locator("#decision-link")).to_contain_text("You are deciding as erin")
    expect(page.locator(f'[data-tool-call-id="{call_id}"]')).to_be_visible()
    assert not Decision.objects.filter(run_id=run_id).exists()  # opening the link decided nothing
    screenshot(page, "link-desktop")
    page.set_viewport_size({"width": 375, "height": 800})
    screenshot(page, "link-375")

    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text("Approved send-email as erin")
    assert wait_until_final(run_id, timeout=15).status == "completed"
    decision = Decision.objects.get(run_id=run_id)
    assert (decision.kind, decision.via, decision.decided_by_username) == ("approve", "link", "erin")
    assert ToolEffect.objects.filter(run_id=run_id).count() == 1

    page.goto(link)  # the same link again
    expect(page.get_by_role("heading", level=1)).to_have_text("This link was already used")
    expect(page.locator("#decision-link")).to_contain_text("You approved send-email")
    assert page.get_by_role("button", name="Approve").count() == 0
    assert Decision.objects.filter(run_id=run_id).count() == 1
    context.close()

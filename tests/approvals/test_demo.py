"""``make demo`` (``manage.py demo_seed``): it says how to sign in every time, and resets on request."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

pytestmark = pytest.mark.django_db(transaction=True)


def seed(monkeypatch, **env: str) -> str:
    for name in ("AGENTRUN_REVIEWER_PASSWORD", "AGENTRUN_VIEWER_PASSWORD", "AGENTRUN_RESET_DEMO_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = io.StringIO()
    call_command("demo_seed", stdout=out)
    return out.getvalue()


def printed_password(output: str, username: str) -> str:
    return re.search(rf"Sign in as '{username}' with password: (\S+)", output).group(1)


def test_every_run_says_how_to_sign_in_and_a_reset_gives_a_new_password(monkeypatch):
    first = seed(monkeypatch)
    password = printed_password(first, "reviewer")
    reviewer = get_user_model().objects.get(username="reviewer")
    assert reviewer.check_password(password)

    again = seed(monkeypatch)
    assert "Sign in as 'reviewer' with the password printed when it was created" in again
    assert "AGENTRUN_RESET_DEMO_PASSWORD=1 make demo" in again

    reset = seed(monkeypatch, AGENTRUN_RESET_DEMO_PASSWORD="1")
    new_password = printed_password(reset, "reviewer")
    reviewer.refresh_from_db()
    assert new_password != password and reviewer.check_password(new_password)
    assert printed_password(reset, "viewer")


def test_only_the_account_that_audits_in_the_admin_is_staff(monkeypatch):
    get_user_model().objects.create_user("viewer", is_staff=True)  # seeded as staff by an older demo
    seed(monkeypatch)
    staff = dict(get_user_model().objects.values_list("username", "is_staff"))
    assert staff == {"reviewer": True, "viewer": False}


def test_the_seeded_calls_show_the_agents_own_words_on_their_cards(monkeypatch, client):
    """The demo's runs say what they are about to do (``/say``): each card quotes it."""
    seed(monkeypatch, AGENTRUN_REVIEWER_PASSWORD="pw-reviewer-demo")
    assert client.login(username="reviewer", password="pw-reviewer-demo")
    for thread, words in (
        ("demo-orders", "I will email her that it is on its way."),
        ("demo-cleanup", "I will delete it and tell operations."),
        ("demo-travel", "I need to ask before shipping."),
        ("demo-billing", "Refunding order A-881 in full: 25.50."),  # the sub-agent's own words
    ):
        page = client.get(f"/approvals/threads/{thread}/").content.decode()
        assert 'data-testid="call-reason"' in page and words in page, thread

"""A decision made in Slack appears live on a dashboard page that is open (issue 22, docs/slack.md): the
production web server verifies a click signed as Slack signs it (``slack_sdk``) and decides; the
reviewers' feed tells the open page who decided, and how."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect
from slack_sdk.signature import SignatureVerifier

from agentrun.core.models import Decision, SuspendedToolCall
from notifications import slack
from notifications.models import SlackDestination, SlackIdentity
from tests.helpers.browser import E2E_DIR, EMAIL, SLACK_SIGNING_SECRET, call_card, unique, wait_live

pytestmark = pytest.mark.e2e


def test_a_slack_decision_appears_live_on_an_open_dashboard_page(login, suspend, live_server_url, users, settings):
    # The button's value is signed here as the server would sign it: with the server's key.
    settings.SECRET_KEY = os.environ.get("SECRET_KEY") or (E2E_DIR / "secret_key").read_text().strip()
    thread = unique("t-slack")
    run_id, call_id = suspend("send-email", EMAIL, thread=thread)
    # Inactive: nothing is posted to Slack (these tests reach no outside host); the message is made here.
    place = SlackDestination.objects.create(name="e2e", channel="C0E2E", owner=users["rita"], active=False)
    identity = SlackIdentity.objects.create(team_id="T0E2E", slack_user_id="U0RITA", user=users["rita"])
    try:
        [message] = slack.show([SuspendedToolCall.objects.select_related("run").get(run_id=run_id)], [place])
        watcher = login("olga")
        watcher.goto(f"/approvals/threads/{thread}/")
        wait_live(watcher)
        expect(call_card(watcher, call_id)).to_have_count(1)

        payload = {
            "type": "block_actions",
            "team": {"id": "T0E2E"},
            "user": {"id": "U0RITA", "team_id": "T0E2E"},
            "trigger_id": "trig.e2e",
            # Not a Slack host: never called (docs/slack.md's response_url rule), so nothing leaves the machine.
            "response_url": "http://127.0.0.1:9/hooks/e2e",
            "actions": [{"type": "button", "action_id": slack.APPROVE, "value": slack.button_value(message)}],
        }
        body = urlencode({"payload": json.dumps(payload)}).encode()
        stamp = str(int(time.time()))
        signature = SignatureVerifier(SLACK_SIGNING_SECRET).generate_signature(timestamp=stamp, body=body)
        request = urllib.request.Request(
            f"{live_server_url}/integrations/slack/actions",
            data=body,
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "X-Slack-Request-Timestamp": stamp,
                "X-Slack-Signature": signature or "",
            },
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

        decided = watcher.locator(f'[data-decided-call-id="{call_id}"]')
        expect(decided).to_contain_text("rita", timeout=5_000)
        expect(decided).to_contain_text("via slack")
        expect(call_card(watcher, call_id)).to_have_count(0)
        decision = Decision.objects.get(run_id=run_id)
        assert (decision.via, decision.decided_by_username) == ("slack", "rita")
    finally:
        identity.delete()
        place.delete()

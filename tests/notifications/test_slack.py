"""Deciding from Slack (issue 22, docs/slack.md): interactive messages posted through the queue, clicks
verified and bound to what the message showed, people linked to accounts, messages kept true.

Slack is a local server (``slack_fake``): the tests reach no outside host. Requests are signed with
``slack_sdk``'s ``SignatureVerifier``; everything agentrun sends Slack is validated with
``slack_sdk.models``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from urllib.parse import quote

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from rest_framework.test import APIClient

from agentrun.core.models import Decision, SuspendedToolCall
from agentrun.engine.decisions import shown_fingerprint
from agentrun.engine.types import Decider
from notifications import slack
from notifications.models import SlackDelivery, SlackDestination, SlackIdentity, SlackMessage
from tests.helpers import slack_fake
from tests.helpers.decisions import decide_call
from tests.helpers.runs import email_run, refund_run, start, tool_line, wait_rested
from tests.helpers.slack_fake import click, command, interact, submission
from tests.helpers.users import make_user
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "xoxb-test-0000-token"


@pytest.fixture
def fake_slack(settings):
    state, stop = slack_fake.serve()
    settings.AGENTRUN_SLACK_API_URL = state.base
    settings.AGENTRUN_SLACK_SIGNING_SECRET = slack_fake.SIGNING_SECRET
    # The Web API's host is the operator's own setting: reachable without allowing private webhooks.
    settings.AGENTRUN_WEBHOOK_ALLOW_PRIVATE = False
    yield state
    slack_fake.settle()  # what the test set going reaches Slack before Slack goes
    stop()


def destination(**fields) -> SlackDestination:
    owner = User.objects.filter(username="slack-owner").first() or User.objects.create_superuser("slack-owner")
    made = SlackDestination(name="reviews", channel="#reviews", owner=owner, **fields)
    made.bot_token = TOKEN
    made.save()
    return made


def posted(fake, count: int = 1) -> list[SlackMessage]:
    """Wait until ``count`` messages are posted; the SlackMessage rows."""
    fake.wait_for("chat.postMessage", count)
    return wait_until(
        lambda: (
            list(SlackMessage.objects.exclude(ts=None))
            if SlackMessage.objects.exclude(ts=None).count() >= count
            else None
        ),
        timeout=30,
        what="posted messages",
    )


def value_of(fake, index: int = -1) -> str:
    body = fake.of("chat.postMessage")[index].body
    [actions] = [b for b in body["blocks"] if b["type"] == "actions"]
    return actions["elements"][0]["value"]


def linked(username: str, slack_user_id: str, **extra) -> User:
    user = make_user(username, **extra)
    SlackIdentity.objects.create(team_id=slack_fake.TEAM, slack_user_id=slack_user_id, user=user)
    return user


def hooks_text(fake) -> list[str]:
    return [c.body.get("text", "") for c in fake.of("hook")]


# --- destinations over REST -------------------------------------------------------------------------------
def test_destinations_are_managed_over_rest_like_webhook_endpoints(fake_slack):
    root = make_user("root", group=None, is_staff=True, is_superuser=True)
    api = APIClient()
    api.force_authenticate(root)
    body = {"name": "Reviews", "botToken": TOKEN, "channel": "C0REVIEWS", "agents": ["support-agent"]}
    created = api.post("/api/slack-destinations/", body, format="json")
    assert created.status_code == 201, created.content
    data = created.json()
    assert {k: data[k] for k in ("name", "channel", "agents", "active")} == {
        "name": "Reviews",
        "channel": "C0REVIEWS",
        "agents": ["support-agent"],
        "active": True,
    }
    assert "botToken" not in data and TOKEN not in created.content.decode()
    row = SlackDestination.objects.get(pk=data["id"])
    assert row.bot_token == TOKEN and TOKEN not in row.sealed_bot_token  # encrypted at rest
    listed = api.get("/api/slack-destinations/").json()
    assert listed["object"] == "list" and [d["id"] for d in listed["data"]] == [data["id"]]
    url = f"/api/slack-destinations/{quote(data['id'])}"
    patched = api.patch(url, {"active": False, "agents": []}, format="json").json()
    assert (patched["active"], patched["agents"]) == (False, [])
    assert api.get(url).json()["channel"] == "C0REVIEWS"
    refused = api.post("/api/slack-destinations/", {**body, "botTokn": "x"}, format="json")
    assert refused.status_code == 400 and refused.json()["error"]["details"]["unknownFields"] == ["botTokn"]
    missing = api.post("/api/slack-destinations/", {"name": "x", "channel": "C1"}, format="json")
    assert missing.status_code == 400 and SlackDestination.objects.count() == 1
    assert api.get("/api/slack-destinations/nope%2F%20%23").status_code == 404
    assert api.delete(url).status_code == 204 and not SlackDestination.objects.exists()

    reviewer = APIClient()
    reviewer.force_authenticate(make_user("rita"))
    assert reviewer.get("/api/slack-destinations/").status_code == 403
    assert APIClient().get("/api/slack-destinations/").status_code == 401


# --- the message ------------------------------------------------------------------------------------------
def test_a_waiting_call_is_posted_with_what_it_is_and_buttons_bound_to_it(fake_slack):
    destination()
    run_id = email_run(thread="t slack/#1?", args={"to": "<!channel> & co", "subject": "s", "body": "b"})
    [message] = posted(fake_slack)
    [call] = fake_slack.of("chat.postMessage")
    assert call.token == TOKEN and call.body["channel"] == "#reviews"
    text = json.dumps(call.body["blocks"])
    assert "support-agent" in text and "send-email" in text and "medium" in text
    assert "&lt;!channel&gt; &amp; co" in text and "<!channel>" not in text  # the model's text cannot ping
    assert "http://agentrun.test/approvals/threads/t%20slack%2F%231%3F/" in text
    [actions] = [b for b in call.body["blocks"] if b["type"] == "actions"]
    approve, decline, edit = actions["elements"]
    assert (approve["action_id"], decline["action_id"], edit.get("url") is not None) == (
        slack.APPROVE,
        slack.DECLINE,
        True,
    )
    assert approve["value"] == decline["value"] and run_id not in approve["value"]  # opaque
    row = SuspendedToolCall.objects.get(run_id=run_id)
    assert (message.run_id, message.tool_call_id, message.suspension) == (run_id, row.tool_call_id, row.suspension)
    assert message.args_fingerprint == shown_fingerprint(row)
    assert (message.channel_id, message.ts) == (slack_fake.CHANNEL_ID, "1700000000.000001")


def test_long_arguments_are_truncated_with_a_link_to_the_card(fake_slack):
    destination()
    email_run(thread="t-long", args={"to": "a@example.com", "subject": "s", "body": "x" * 5000})
    posted(fake_slack)
    text = json.dumps(fake_slack.of("chat.postMessage")[0].body["blocks"])
    assert "x" * 1400 in text and "x" * 1600 not in text and "see them all in agentrun" in text


# --- signatures ---------------------------------------------------------------------------------------------
def _approve_click(fake, slack_user_id: str, value: str) -> dict:
    return click(value, slack.APPROVE, slack_user_id, response_url=fake.response_url())


@pytest.mark.parametrize("how", ["wrong secret", "stale", "unsigned", "tampered"])
def test_a_request_not_signed_by_slack_now_changes_nothing(fake_slack, how):
    destination()
    linked("erin", "U0ERIN")
    run_id = email_run(thread=f"t-sig-{how}")
    posted(fake_slack)
    payload = _approve_click(fake_slack, "U0ERIN", value_of(fake_slack))
    body = json.dumps(payload)
    if how == "wrong secret":
        response = interact(payload, secret="not-the-signing-secret")
    elif how == "stale":
        response = interact(payload, timestamp=int(time.time()) - 6 * 60)
    elif how == "unsigned":
        response = interact(payload, headers={"HTTP_X_SLACK_REQUEST_TIMESTAMP": str(int(time.time()))})
    else:
        from urllib.parse import urlencode

        headers = slack_fake.signed_headers(urlencode({"payload": body}).encode())
        tampered = body.replace("U0ERIN", "U0EVIL")
        response = Client().post(
            "/integrations/slack/actions",
            urlencode({"payload": tampered}),
            content_type="application/x-www-form-urlencoded",
            **headers,
        )
    assert response.status_code == 401
    assert SuspendedToolCall.objects.get(run_id=run_id).status == "open" and not Decision.objects.exists()
    assert not fake_slack.of("hook") and not SlackDelivery.objects.filter(action="respond").exists()


def test_a_replayed_request_is_refused(fake_slack):
    destination()
    linked("erin", "U0ERIN")
    run_id = email_run(thread="t-replay")
    posted(fake_slack)
    from urllib.parse import urlencode

    body = urlencode({"payload": json.dumps(_approve_click(fake_slack, "U0ERIN", value_of(fake_slack)))}).encode()
    headers = slack_fake.signed_headers(body)
    first = Client().post(
        "/integrations/slack/actions", body, content_type="application/x-www-form-urlencoded", **headers
    )
    assert first.status_code == 200
    wait_rested(run_id)
    assert Decision.objects.count() == 1
    again = Client().post(
        "/integrations/slack/actions", body, content_type="application/x-www-form-urlencoded", **headers
    )
    assert again.status_code == 401 and Decision.objects.count() == 1


def test_without_a_signing_secret_every_request_is_refused(fake_slack, settings):
    settings.AGENTRUN_SLACK_SIGNING_SECRET = ""
    assert command("link x", "U0ERIN").status_code == 401
    assert interact({"type": "block_actions"}).status_code == 401


# --- people -----------------------------------------------------------------------------------------------------
def test_an_unlinked_slack_user_is_told_how_to_link_and_nothing_changes(fake_slack):
    destination()
    run_id = email_run(thread="t-unlinked")
    posted(fake_slack)
    assert interact(_approve_click(fake_slack, "U0STRANGER", value_of(fake_slack))).status_code == 200
    [hook] = fake_slack.wait_for("hook")
    assert hook.body["response_type"] == "ephemeral" and hook.body["replace_original"] is False
    assert "not linked" in hook.body["text"] and "/agentrun link" in hook.body["text"]
    assert "http://agentrun.test/approvals/settings/" in hook.body["text"]
    assert SuspendedToolCall.objects.get(run_id=run_id).status == "open" and not Decision.objects.exists()


def test_a_linked_person_outside_the_agents_reviewers_decides_nothing(fake_slack, settings):
    settings.AGENTRUN_AGENT_REVIEWERS = {"support-agent": ["Support team"]}
    destination()
    linked("otto", "U0OTTO")
    run_id = email_run(thread="t-outsider")
    posted(fake_slack)
    interact(_approve_click(fake_slack, "U0OTTO", value_of(fake_slack)))
    [hook] = fake_slack.wait_for("hook")
    assert "may not decide" in hook.body["text"] and hook.body["response_type"] == "ephemeral"
    assert SuspendedToolCall.objects.get(run_id=run_id).status == "open" and not Decision.objects.exists()


def test_a_reviewer_links_their_slack_account_with_the_code_from_their_settings(fake_slack):
    erin = make_user("erin", email="erin@example.com")
    browser = Client()
    browser.force_login(erin)
    page = browser.get("/approvals/settings/").content.decode()
    [code] = re.findall(r"/agentrun link ([^<\s]+)", page)
    answer = command(f"link {code}", "U0ERIN")
    assert answer.status_code == 200 and answer.json()["response_type"] == "ephemeral"
    assert "Linked" in answer.json()["text"] and "erin" in answer.json()["text"]
    identity = SlackIdentity.objects.get()
    assert (identity.team_id, identity.slack_user_id, identity.user) == (slack_fake.TEAM, "U0ERIN", erin)
    assert "U0ERIN" in browser.get("/approvals/settings/").content.decode()

    assert "used already" in command(f"link {code}", "U0MALLORY").json()["text"]  # a code works once
    assert "not a link code" in command("link 1:forged:code", "U0MALLORY").json()["text"]
    assert "/agentrun link" in command("help", "U0MALLORY").json()["text"]
    assert SlackIdentity.objects.count() == 1

    assert "Unlinked" in command("unlink", "U0ERIN").json()["text"] and not SlackIdentity.objects.exists()


def test_an_expired_link_code_links_nothing(fake_slack, monkeypatch):
    erin = make_user("erin")
    code = slack.link_code(erin)
    monkeypatch.setattr(slack, "LINK_CODE_MAX_AGE", -1)
    assert "expired" in command(f"link {code}", "U0ERIN").json()["text"] and not SlackIdentity.objects.exists()


# --- deciding -------------------------------------------------------------------------------------------------------
def test_approving_from_slack_records_the_person_and_their_slack_ids_and_the_message_says_so(fake_slack):
    destination()
    erin = linked("erin", "U0ERIN")
    run_id = email_run(thread="t-approve")
    posted(fake_slack)
    assert interact(_approve_click(fake_slack, "U0ERIN", value_of(fake_slack))).status_code == 200
    decision = Decision.objects.get(run_id=run_id)
    assert (decision.kind, decision.via, decision.decided_by, decision.completes) == ("approve", "slack", erin, True)
    assert decision.details == {"slack": {"userId": "U0ERIN", "teamId": slack_fake.TEAM}}
    assert decision.args_fingerprint == SlackMessage.objects.get().args_fingerprint
    assert wait_rested(run_id).status == "completed"
    # The clicker's answer replaces the message; every copy of it is updated through the queue.
    [hook] = fake_slack.wait_for("hook")
    assert hook.body["replace_original"] is True and "Approved" in json.dumps(hook.body["blocks"])
    update = fake_slack.wait_for("chat.update")[0]  # on the decision, then on the run's end: both show it
    assert (update.body["channel"], update.body["ts"]) == (slack_fake.CHANNEL_ID, "1700000000.000001")
    shown = json.dumps(update.body["blocks"])
    assert "*Approved* by erin (via slack)" in shown and not [
        b for b in update.body["blocks"] if b["type"] == "actions"
    ]

    # The history shows it: the REST audit trail and the dashboard's page, no browser needed.
    api = APIClient()
    api.force_authenticate(erin)
    [item] = [d for d in api.get("/api/decisions").json()["data"] if d["runId"] == run_id]
    assert (item["via"], item["decidedBy"], item["details"]["slack"]["userId"]) == ("slack", "erin", "U0ERIN")
    browser = Client()
    browser.force_login(erin)
    history = browser.get("/approvals/history/").content.decode()
    assert re.search(r'data-label="Via">\s*slack\s*<', history)


def test_a_message_is_updated_after_a_decision_made_on_the_dashboard(fake_slack):
    destination()
    bob = make_user("bob")
    run_id = email_run(thread="t-dash")
    [message] = posted(fake_slack)
    browser = Client()
    browser.force_login(bob)
    url = f"/approvals/runs/{quote(run_id)}/calls/{quote(message.tool_call_id)}/decide"
    response = browser.post(
        url, {"action": "decline", "reason": "not <now>", "args_fingerprint": message.args_fingerprint}
    )
    assert response.status_code == 302
    update = fake_slack.wait_for("chat.update")[0]
    shown = json.dumps(update.body["blocks"])
    assert "*Declined* by bob (via dashboard)" in shown and "not &lt;now&gt;" in shown
    assert not [b for b in update.body["blocks"] if b["type"] == "actions"]
    # The decision's update went once; the run's end (a decline completes it) sends another, in either order.
    delivery = wait_until(
        lambda: SlackDelivery.objects.filter(
            action="update", event__type="toolcall.decided", status="delivered"
        ).first()
    )
    assert delivery.attempts == 1


def test_a_failed_update_is_retried_with_backoff_and_logged(fake_slack, fast_retries):
    destination()
    run_id = email_run(thread="t-retry")
    posted(fake_slack)
    fake_slack.statuses = [429]  # Slack's rate limit, once
    decide_call(agent_id="support-agent", run_id=run_id, kind="approve", decider=Decider.system("ops"))
    fake_slack.wait_for("chat.update", 2)
    # Updated on the decision and on the run's end (their order is the queue's): the one Slack refused
    # went at the second attempt, the other at its first.
    updates = SlackDelivery.objects.filter(action="update", status="delivered")
    wait_until(lambda: updates.count() == 2, what="both updates delivered")
    assert sorted(updates.values_list("attempts", "response_status", "last_error")) == [(1, 200, None), (2, 200, None)]
    assert sorted(updates.values_list("event__type", flat=True)) == ["run.completed", "toolcall.decided"]
    wait_rested(run_id)


def test_a_run_that_ends_without_a_decision_updates_its_message(fake_slack):
    from agentrun.engine.decisions import cancel_run

    destination()
    run_id = email_run(thread="t-cancel")
    posted(fake_slack)
    cancel_run(run_id=run_id)
    [update] = fake_slack.wait_for("chat.update")
    assert "No longer waits (the run is cancelled)" in json.dumps(update.body["blocks"])


def test_a_racing_pair_of_clicks_makes_one_decision_and_the_other_is_told_who_won(fake_slack):
    destination()
    linked("erin", "U0ERIN")
    linked("finn", "U0FINN")
    run_id = email_run(thread="t-race")
    posted(fake_slack)
    value = value_of(fake_slack)
    barrier = threading.Barrier(2)
    statuses: list[int] = []

    def clicker(slack_user_id: str) -> None:
        try:
            barrier.wait()
            statuses.append(interact(_approve_click(fake_slack, slack_user_id, value)).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=clicker, args=(u,)) for u in ("U0ERIN", "U0FINN")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200, 200]
    [decision] = Decision.objects.filter(run_id=run_id)
    winner = decision.decided_by_username
    hooks = fake_slack.wait_for("hook", 2)
    [lost] = [h for h in hooks if h.body.get("response_type") == "ephemeral"]
    assert f"Already approved by {winner} (via slack)" in lost.body["text"]
    wait_rested(run_id)


def test_a_high_risk_approval_asks_for_confirmation_showing_every_argument(fake_slack):
    destination()
    erin = linked("erin", "U0ERIN")
    run_id = refund_run(thread="t-high")
    posted(fake_slack)
    approve = json.dumps(fake_slack.of("chat.postMessage")[0].body["blocks"], ensure_ascii=False)
    assert "Approve…" in approve and "high" in approve
    interact(_approve_click(fake_slack, "U0ERIN", value_of(fake_slack)))
    [opened] = fake_slack.wait_for("views.open")
    view = opened.body["view"]
    assert view["callback_id"] == slack.CONFIRM_VIEW and view["submit"]["text"] == "Approve"
    assert '\\"orderId\\": \\"o-1\\"' in json.dumps(view["blocks"]) and opened.token == TOKEN
    assert not Decision.objects.exists()  # the click itself decided nothing

    answer = interact(submission(view, "U0ERIN"))
    assert answer.status_code == 200 and not answer.content  # an empty answer closes the modal
    decision = Decision.objects.get(run_id=run_id)
    assert (decision.kind, decision.via, decision.decided_by, decision.risk) == ("approve", "slack", erin, "high")
    wait_rested(run_id)


def test_declining_asks_for_a_reason_in_a_modal(fake_slack):
    destination()
    linked("erin", "U0ERIN")
    run_id = email_run(thread="t-decline")
    posted(fake_slack)
    interact(click(value_of(fake_slack), slack.DECLINE, "U0ERIN", response_url=fake_slack.response_url()))
    [opened] = fake_slack.wait_for("views.open")
    assert opened.body["view"]["callback_id"] == slack.DECLINE_VIEW and not Decision.objects.exists()
    interact(submission(opened.body["view"], "U0ERIN", reason="  wrong customer  "))
    decision = Decision.objects.get(run_id=run_id)
    assert (decision.kind, decision.reason, decision.via) == ("decline", "wrong customer", "slack")
    wait_rested(run_id)


def test_a_stale_button_after_a_new_suspension_decides_nothing(fake_slack):
    """A sub-agent surfaces refund SMALL on the supervisor's call, and the message shows it; SMALL is
    approved on the dashboard; the same call then surfaces refund HUGE (a new suspension, a new
    message). The old message's buttons decide nothing: they say who decided what they showed."""
    destination()
    linked("erin", "U0ERIN")
    bob = make_user("bob")
    small, huge = {"orderId": "small", "amount": 1.0}, {"orderId": "huge", "amount": 99999}
    message = "\n".join([tool_line("refund", small), tool_line("refund", huge)])
    stream, _ = async_to_sync(start)("support-supervisor", tool_line("agent-billing-agent", {"message": message}))
    found = posted(fake_slack)
    [old] = found
    old_value = value_of(fake_slack)
    outer = SuspendedToolCall.objects.get(run_id=stream.run_id, status="open")
    decide_call(
        agent_id="support-supervisor",
        run_id=stream.run_id,
        kind="approve",
        tool_call_id=outer.tool_call_id,
        args_fingerprint=old.args_fingerprint,
        decider=Decider.person(bob, via=Decision.Via.DASHBOARD),
    )
    wait_rested(stream.run_id)
    outer.refresh_from_db()
    assert outer.status == "open" and outer.suspension == 1
    posted(fake_slack, 2)
    assert "huge" in json.dumps(fake_slack.of("chat.postMessage")[1].body["blocks"])

    interact(_approve_click(fake_slack, "U0ERIN", old_value))
    [hook] = fake_slack.wait_for("hook")
    assert "Already approved by bob (via dashboard)" in hook.body["text"]
    assert not fake_slack.of("views.open")  # no confirmation is asked for what nobody can decide
    outer.refresh_from_db()
    assert outer.status == "open" and not Decision.objects.filter(via="slack").exists()


def test_a_response_url_outside_slacks_hosts_is_never_called(fake_slack):
    destination()
    run_id = email_run(thread="t-evil")
    posted(fake_slack)
    interact(click(value_of(fake_slack), slack.APPROVE, "U0STRANGER", response_url="https://evil.example/hooks/x"))
    assert not SlackDelivery.objects.filter(action="respond").exists() and not fake_slack.of("hook")
    assert SuspendedToolCall.objects.get(run_id=run_id).status == "open"
    assert slack.response_url_allowed("https://hooks.slack.com/actions/T1/2/x")
    assert not slack.response_url_allowed("http://hooks.slack.com/actions/T1/2/x")
    assert not slack.response_url_allowed("https://hooks.slack.com.evil.example/x")


def test_a_forged_button_value_decides_nothing(fake_slack):
    destination()
    linked("erin", "U0ERIN")
    run_id = email_run(thread="t-forged")
    [message] = posted(fake_slack)
    assert interact(_approve_click(fake_slack, "U0ERIN", message.id)).status_code == 200
    assert SuspendedToolCall.objects.get(run_id=run_id).status == "open" and not Decision.objects.exists()


def test_a_call_that_needs_two_approvals_shows_its_count_and_keeps_its_buttons(fake_slack):
    destination()
    linked("erin", "U0ERIN")
    linked("finn", "U0FINN")
    stream, _ = async_to_sync(start)("billing-agent", tool_line("pay-invoice", {"invoiceId": "inv-1", "amount": 12.5}))
    posted(fake_slack)
    value = value_of(fake_slack)
    assert "Approvals: 0 of 2" in json.dumps(fake_slack.of("chat.postMessage")[0].body["blocks"])
    interact(_approve_click(fake_slack, "U0ERIN", value))
    [update] = fake_slack.wait_for("chat.update")
    shown = json.dumps(update.body["blocks"])
    assert "Approvals: 1 of 2 (erin)" in shown and [b for b in update.body["blocks"] if b["type"] == "actions"]
    interact(_approve_click(fake_slack, "U0ERIN", value))  # the same person again: nothing
    fake_slack.wait_until(
        lambda: [h for h in fake_slack.of("hook") if "another person must approve" in h.body.get("text", "")],
        what="the explanation",
    )
    interact(_approve_click(fake_slack, "U0FINN", value))
    assert [d.decided_by_username for d in Decision.objects.filter(run_id=stream.run_id).order_by("decided_at")] == [
        "erin",
        "finn",
    ]
    wait_rested(stream.run_id)
    final = fake_slack.wait_until(
        lambda: [c for c in fake_slack.of("chat.update") if "*Approved* by finn (via slack)" in json.dumps(c.body)],
        what="the final update",
    )
    assert not [b for b in final[-1].body["blocks"] if b["type"] == "actions"]


def test_an_expired_run_updates_its_message(fake_slack):
    from django.utils import timezone

    from agentrun.core.models import Run, Snapshot
    from agentrun.engine.decisions import expire_due_runs

    destination()
    run_id = email_run(thread="t-expire")
    posted(fake_slack)
    Snapshot.objects.filter(run_id=run_id).update(expires_at=timezone.now())
    Run.objects.filter(pk=run_id).update(expires_at=timezone.now())
    assert expire_due_runs() == 1
    update = fake_slack.wait_until(
        lambda: [c for c in fake_slack.of("chat.update") if "Expired" in json.dumps(c.body)], what="the update"
    )
    assert "by the system (via system)" in json.dumps(update[-1].body["blocks"])


def test_a_destination_gets_only_the_calls_its_owner_may_view_and_of_its_agents(fake_slack, settings):
    settings.AGENTRUN_AGENT_REVIEWERS = {"support-agent": ["Support team"]}
    narrow = make_user("nora", group=None, is_staff=True)
    made = SlackDestination(name="narrow", channel="#n", owner=narrow)
    made.bot_token = TOKEN
    made.save()
    destination(agents=["billing-agent"])
    email_run(thread="t-scope")  # support-agent: nora may not view it; the other is for billing-agent
    refund_run(thread="t-scope-b")
    [message] = posted(fake_slack)
    assert message.agent_id == "billing-agent" and message.destination.name == "reviews"
    assert SlackMessage.objects.count() == 1


def test_the_sweep_sends_again_what_lost_its_task(fake_slack, monkeypatch):
    from datetime import timedelta

    from notifications import delivery

    destination()
    lost = type("LostTask", (), {"enqueue": staticmethod(lambda *a, **k: None)})()
    monkeypatch.setattr(slack, "attempt_slack", lost)  # the process "dies" before its task runs
    email_run(thread="t-sweep")
    row = wait_until(lambda: SlackDelivery.objects.filter(action="post").first(), what="the post delivery")
    monkeypatch.undo()
    delivery.sweep()
    assert not fake_slack.of("chat.postMessage")  # due too recently: its own task may still run
    SlackDelivery.objects.filter(pk=row.pk).update(next_attempt_at=row.next_attempt_at - timedelta(minutes=1))
    delivery.sweep()
    fake_slack.wait_for("chat.postMessage")
    wait_until(lambda: SlackDelivery.objects.filter(pk=row.pk, status="delivered").exists())


def test_the_admin_shows_the_slack_delivery_log_and_resends(fake_slack):
    destination()
    email_run(thread="t-admin")
    posted(fake_slack)
    row = wait_until(lambda: SlackDelivery.objects.filter(status="delivered").first())
    browser = Client()
    browser.force_login(make_user("root", group=None, is_staff=True, is_superuser=True))
    for page in ("slackdestination", "slackdelivery", "slackmessage", "slackidentity"):
        assert browser.get(f"/admin/notifications/{page}/").status_code == 200, page
    added = browser.post(
        "/admin/notifications/slackdestination/add/",
        {"name": "ops", "bot_token": "xoxb-admin", "channel": "C0OPS", "agents": "", "active": "on"},
    )
    assert added.status_code == 302
    made = SlackDestination.objects.get(name="ops")
    assert (
        made.bot_token == "xoxb-admin"
        and "xoxb-admin" not in browser.get(f"/admin/notifications/slackdestination/{made.pk}/change/").content.decode()
    )
    response = browser.post(
        "/admin/notifications/slackdelivery/",
        {"action": "resend_slack_deliveries", "_selected_action": [row.id]},
        follow=True,
    )
    assert "Resending 1 Slack delivery" in response.content.decode()
    wait_until(lambda: SlackDelivery.objects.filter(pk=row.pk, attempts=2, status="delivered").exists())
    assert len(fake_slack.of("chat.postMessage")) == 1  # posted already: the resend does not post twice


def test_the_destination_list_costs_a_fixed_number_of_queries(fake_slack, django_assert_max_num_queries):
    root = make_user("root", group=None, is_staff=True, is_superuser=True)
    for _ in range(5):
        destination()
    api = APIClient()
    api.force_authenticate(root)
    with django_assert_max_num_queries(3):
        assert len(api.get("/api/slack-destinations/").json()["data"]) == 5


def test_arguments_full_of_control_characters_stay_within_slacks_limits(fake_slack):
    """Escaping makes text longer (``<`` is ``&lt;``): the message and the modal are cut after escaping,
    never inside an entity, and every block still validates (slack_fake validates with slack_sdk)."""
    destination()
    linked("erin", "U0ERIN")
    order = "<&>" * 3000
    stream, _ = async_to_sync(start)("billing-agent", tool_line("refund", {"orderId": order, "amount": 5}))
    posted(fake_slack)
    text = json.dumps(fake_slack.of("chat.postMessage")[0].body["blocks"])
    assert "see them all in agentrun" in text and "<&>" not in text
    interact(_approve_click(fake_slack, "U0ERIN", value_of(fake_slack)))
    [opened] = fake_slack.wait_for("views.open")
    sections = [b["text"]["text"] for b in opened.body["view"]["blocks"][1:]]
    assert all(len(s) <= 3000 for s in sections) and len(sections) > 1
    shown = "".join(s.removeprefix("```").removesuffix("```") for s in sections)
    assert shown.count("&lt;&amp;&gt;") == 3000  # every character, none cut in half
    interact(submission(opened.body["view"], "U0ERIN"))
    assert Decision.objects.get(run_id=stream.run_id).via == "slack"
    wait_rested(stream.run_id)


def test_an_update_that_overtakes_its_post_is_sent_as_soon_as_the_post_is(fake_slack, settings):
    """The call is decided while Slack still answers the post: the update waits for the post (no retry
    of its own: the retry delay here is ten minutes), and goes the moment the post is done."""
    settings.AGENTRUN_WEBHOOK_RETRY_SECONDS = 600
    fake_slack.hold_posts = threading.Event()
    destination()
    run_id = email_run(thread="t-overtake")
    fake_slack.wait_until(lambda: fake_slack.holding == 1, what="the post in flight")
    decide_call(agent_id="support-agent", run_id=run_id, kind="approve", decider=Decider.system("ops"))
    decided = SlackDelivery.objects.filter(action="update", event__type="toolcall.decided")
    wait_until(lambda: decided.filter(last_error="not posted yet").exists(), what="the update waiting for its post")
    fake_slack.hold_posts.set()
    fake_slack.wait_for("chat.postMessage")
    row = wait_until(lambda: decided.filter(status="delivered").first(), what="the update sent after the post")
    assert row.attempts == 2
    assert fake_slack.of("chat.update")[0].body["ts"] == "1700000000.000001"
    wait_rested(run_id)

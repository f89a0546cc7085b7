"""Signed decision links in email (issue 14): single-use, expiring, bound to one reviewer and one call;
opening one decides nothing; deciding goes through the one decision service (via link)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core import signing
from django.test import Client
from django.utils import timezone

from agentrun.core.models import Decision, Message, ToolEffect
from agentrun.engine.types import Decider
from notifications import links
from notifications.models import DecisionLink
from tests.helpers.decisions import decide_call
from tests.helpers.notifications import sent_emails
from tests.helpers.runs import email_run, wait_rested
from tests.helpers.users import make_user

pytestmark = pytest.mark.django_db(transaction=True)

LINK = re.compile(r"http://agentrun\.test(/approvals/links/[^/\s]+/)")


def link_path(email) -> str:
    [path] = LINK.findall(email.body)
    return path


def test_an_email_link_shows_the_call_and_approves_it_once(erin):
    run_id = email_run(thread="t-link", args={"to": "ann@example.com", "subject": "<b>Hi</b>", "body": "x"})
    [email] = sent_emails(1)
    assert email.to == ["erin@example.com"]
    assert "send-email" in email.subject and "support-agent" in email.subject
    assert '"to": "ann@example.com"' in email.body  # the arguments, in full
    assert "http://agentrun.test/approvals/threads/t-link/" in email.body
    path = link_path(email)

    browser = Client()  # not signed in: the link is the credential
    page = browser.get(path)
    assert page.status_code == 200
    html = page.content.decode()
    assert "Review" in html and "send-email" in html and "deciding as <strong>erin</strong>" in html
    assert "&lt;b&gt;Hi&lt;/b&gt;" in html and "<b>Hi</b>" not in html  # what the model wrote is escaped
    assert page.headers["Cache-Control"].startswith("max-age=0")
    assert not Decision.objects.exists()  # a link preview or a mail scanner decides nothing

    done = browser.post(path, {"action": "approve"})
    assert done.status_code == 200 and "Approved" in done.content.decode()
    decision = Decision.objects.get()
    assert (decision.kind, decision.via, decision.decided_by_username) == ("approve", "link", "erin")
    assert DecisionLink.objects.get().decision == decision
    assert wait_rested(run_id).status == "completed"
    assert ToolEffect.objects.filter(run_id=run_id).count() == 1

    again = browser.post(path, {"action": "approve"})  # a re-used link
    assert again.status_code == 410 and "already used" in again.content.decode()
    assert browser.post(path, {"action": "decline"}).status_code == 410
    assert Decision.objects.count() == 1 and ToolEffect.objects.count() == 1
    reopened = browser.get(path)
    assert reopened.status_code == 410 and "You approved" in reopened.content.decode()


def test_declining_through_a_link_hands_the_reason_to_the_model(erin):
    run_id = email_run(thread="t-link-decline")
    path = link_path(sent_emails(1)[0])
    Client().post(path, {"action": "decline", "reason": "Not to this customer."})
    assert wait_rested(run_id).status == "completed"
    decision = Decision.objects.get()
    assert (decision.kind, decision.reason, decision.via) == ("decline", "Not to this customer.", "link")
    answer = Message.objects.filter(run_id=run_id, role="assistant").last().content
    assert answer == "send-email: denied: Not to this customer."


def test_a_link_to_a_call_someone_else_decided_says_who(erin):
    run_id = email_run(thread="t-link-raced")
    path = link_path(sent_emails(1)[0])
    decide_call(agent_id="support-agent", run_id=run_id, kind="decline", decider=Decider.system("olga"))
    page = Client().get(path)
    assert page.status_code == 409
    assert "no longer waits" in page.content.decode() and "olga" in page.content.decode()
    posted = Client().post(path, {"action": "approve"})
    assert posted.status_code == 409 and Decision.objects.count() == 1
    assert DecisionLink.objects.get().used_at is None


def test_an_expired_link_explains_itself_and_decides_nothing(erin):
    email_run(thread="t-link-expired")
    path = link_path(sent_emails(1)[0])
    DecisionLink.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    for response in (Client().get(path), Client().post(path, {"action": "approve"})):
        assert response.status_code == 410 and "expired" in response.content.decode()
    assert not Decision.objects.exists()


def test_a_link_is_bound_to_its_reviewer(erin):
    email_run(thread="t-link-bound")
    path = link_path(sent_emails(1)[0])
    olga = Client()
    olga.force_login(make_user("olga"))
    for response in (olga.get(path), olga.post(path, {"action": "approve"})):
        assert response.status_code == 403 and "sent to erin" in response.content.decode()
    assert not Decision.objects.exists()
    erin_browser = Client()
    erin_browser.force_login(erin)  # signed in as the link's reviewer: fine too
    assert erin_browser.get(path).status_code == 200


def test_a_reviewer_who_may_no_longer_decide_gets_a_refusal(erin):
    email_run(thread="t-link-demoted")
    path = link_path(sent_emails(1)[0])
    erin.groups.clear()
    response = Client().post(path, {"action": "approve"})
    assert response.status_code == 403 and not Decision.objects.exists()


@pytest.mark.parametrize("token", ["nonsense", signing.dumps("lnk_x", salt="another salt"), signing.dumps(["a"])])
def test_a_forged_or_mangled_link_is_not_found(token):
    response = Client().get(f"/approvals/links/{token}/")
    assert response.status_code == 404 and "not valid" in response.content.decode()


def test_a_link_token_names_a_row_and_nothing_else(erin):
    email_run(thread="t-link-token")
    path = link_path(sent_emails(1)[0])
    link = DecisionLink.objects.get()
    token = path.split("/")[-2]
    assert signing.loads(token, salt=links.SALT) == link.id
    assert links.resolve(token) == link
    assert links.resolve(token[:-2]) is None  # cut short
    assert Client().post(path, {"action": "resume"}).status_code == 400  # links approve or decline only

"""Email to reviewers (issue 14): the reviewers allowed to decide the agent, each as they prefer
(immediately, a digest, or not at all); the preference is theirs to set in the dashboard."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import Group
from django.core import mail
from django.test import Client
from django.utils import timezone

from agentrun.core.models import OutboxEvent
from notifications import delivery
from notifications.models import EmailNotice, NotificationPreference
from tests.helpers.decisions import decide_call
from tests.helpers.notifications import sent_emails
from tests.helpers.runs import ask_run, email_run, refund_run
from tests.helpers.users import make_user
from tests.helpers.waiting import wait_for_tasks, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def outbox_to() -> list[str]:
    return sorted(address for email in mail.outbox for address in email.to)


def test_the_reviewers_allowed_to_decide_the_agent_are_told(settings, viewer_with_email):
    settings.AGENTRUN_AGENT_REVIEWERS = {"billing-agent": ["Billing reviewers"]}
    bill = make_user("bill", email="bill@example.com")  # a reviewer in billing's group
    bill.groups.add(Group.objects.create(name="Billing reviewers"))
    make_user("rita", email="rita@example.com")  # a reviewer, outside billing's groups
    make_user("root", group=None, email="root@example.com", is_superuser=True)
    make_user("nomail")  # a reviewer without an address
    NotificationPreference.objects.create(user=make_user("off", email="off@example.com"), email="off")
    make_user("gone", email="gone@example.com", is_active=False)

    refund_run(thread="t-billing")
    sent_emails(2)
    wait_for_tasks()
    assert outbox_to() == ["bill@example.com", "root@example.com"]

    mail.outbox.clear()
    email_run(thread="t-support")  # support-agent: any reviewer (and superusers), never a viewer
    sent_emails(3)
    wait_for_tasks()
    assert outbox_to() == ["bill@example.com", "rita@example.com", "root@example.com"]


def test_a_call_waiting_for_an_answer_points_to_the_dashboard(erin):
    ask_run(thread="t-ask-mail")
    [email] = sent_emails(1)
    assert "waits for your answer" in email.subject
    assert "ask-user" in email.body and "Which city?" in email.body
    assert "/approvals/links/" not in email.body  # links approve or decline; answers are given on the page
    assert "http://agentrun.test/approvals/threads/t-ask-mail/" in email.body


def test_a_digest_gathers_what_still_waits_into_one_email(erin):
    NotificationPreference.objects.create(user=erin, email="digest")
    email_run(thread="t-digest-1")
    email_run(thread="t-digest-2")
    decided = email_run(thread="t-digest-3")
    wait_until(lambda: EmailNotice.objects.count() == 3 or None, what="three notices")
    decide_call(agent_id="support-agent", run_id=decided, kind="approve")
    delivery.sweep()
    wait_for_tasks()
    assert mail.outbox == []  # not due yet: one digest per period at most
    notices = EmailNotice.objects.all()
    assert all(n.digest for n in notices) and len({n.next_attempt_at for n in notices}) == 1

    EmailNotice.objects.update(next_attempt_at=timezone.now())  # the period is over
    delivery.sweep()
    [email] = sent_emails(1)
    assert email.subject == "[agentrun] 2 tool calls wait for your decision"
    assert "t-digest-1" in email.body and "t-digest-2" in email.body and "t-digest-3" not in email.body
    assert email.body.count("/approvals/links/") == 2
    wait_for_tasks()
    assert EmailNotice.objects.filter(sent_at__isnull=True).count() == 0
    delivery.sweep()
    wait_for_tasks()
    assert len(mail.outbox) == 1


def test_nobody_to_email_writes_nothing_for_a_suspension():
    make_user("nomail")
    email_run(thread="t-no-mail")
    assert not OutboxEvent.objects.exists()


def test_a_reviewer_chooses_how_they_get_email_in_the_dashboard(erin):
    browser = Client()
    page = browser.get("/approvals/settings/")
    assert page.status_code == 302 and "/accounts/login/" in page.url
    browser.force_login(erin)
    page = browser.get("/approvals/settings/")
    html = page.content.decode()
    assert page.status_code == 200 and "erin@example.com" in html
    assert 'value="immediately" checked' in html
    saved = browser.post("/approvals/settings/", {"email": "digest"}, follow=True)
    assert "Saved." in saved.content.decode() and 'value="digest" checked' in saved.content.decode()
    assert NotificationPreference.objects.get(user=erin).email == "digest"
    bad = browser.post("/approvals/settings/", {"email": "hourly"})
    assert bad.status_code == 400 and NotificationPreference.objects.get(user=erin).email == "digest"
    browser.post("/approvals/settings/", {"email": "off"})
    email_run(thread="t-off")
    wait_for_tasks()
    assert mail.outbox == []


def test_a_failing_mail_server_is_retried_by_the_queue(erin, settings, fast_retries):
    settings.MAILERS = {"default": {"BACKEND": "tests.notifications.test_emails.AlwaysFailing"}}
    email_run(thread="t-smtp")
    notice = wait_until(lambda: EmailNotice.objects.filter(attempts=1).first(), what="a failed attempt")
    assert "refused" in notice.last_error and notice.sent_at is None
    settings.MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
    [email] = sent_emails(1)  # the failed attempt enqueued the next one, run_after its backoff
    assert email.to == ["erin@example.com"]


class AlwaysFailing:
    def __init__(self, **kwargs: object) -> None:
        pass

    def send_messages(self, messages: list) -> int:
        raise ConnectionRefusedError("the mail server refused the connection")


def test_a_routing_rule_emails_its_group_first_and_the_others_only_if_the_call_still_waits(settings):
    """docs/dashboard.md#shared-work: the routed group's members are told at once; the other reviewers'
    notices wait for the head start, and are not sent at all if the call was decided meanwhile."""
    settings.AGENTRUN_REVIEW_ROUTES = {"tools": {"send-email": "Mail desk"}, "agents": {}}
    settings.AGENTRUN_ROUTE_HEAD_START_SECONDS = 3600
    desk = make_user("dora", email="dora@example.com")
    desk.groups.add(Group.objects.create(name="Mail desk"))
    make_user("rita", email="rita@example.com")
    email_run(thread="t-routed-mail")
    sent_emails(1)
    wait_for_tasks()
    assert outbox_to() == ["dora@example.com"]
    later = EmailNotice.objects.get(user__username="rita")
    assert later.sent_at is None and later.next_attempt_at > timezone.now()
    # The head start is over but the call was decided: nothing is sent to rita.
    from agentrun.core.models import SuspendedToolCall

    call = SuspendedToolCall.objects.get(status="open", run__thread_id="t-routed-mail")
    decide_call(agent_id="support-agent", run_id=call.run_id, kind="decline", tool_call_id=call.tool_call_id)
    wait_for_tasks()
    mail.outbox.clear()
    EmailNotice.objects.filter(pk=later.pk).update(next_attempt_at=timezone.now())
    delivery.send_notice.call(later.pk)
    assert mail.outbox == []


def test_a_view_of_who_gets_email_read_across_a_change_is_not_kept(monkeypatch):
    # The events listener keeps a view of who subscribes; one read while a person with an address was
    # added (in another thread, before the signal) must not be kept, or nobody is emailed until the
    # view is read again (AGENTRUN_EVENTS_REFRESH_SECONDS).
    read, go_on = threading.Event(), threading.Event()
    email_possible = delivery.emails.email_possible

    def slow() -> bool:
        found = email_possible()
        read.set()
        go_on.wait(5)
        return found

    monkeypatch.setattr(delivery.emails, "email_possible", slow)
    reader = threading.Thread(target=delivery.notifier.wants, args=("run.suspended", "support-agent"))
    reader.start()
    assert read.wait(5)
    monkeypatch.setattr(delivery.emails, "email_possible", email_possible)
    make_user("late", email="late@example.com")
    go_on.set()
    reader.join(5)
    assert delivery.notifier.wants("run.suspended", "support-agent")
    email_run(thread="t-late")
    assert [m.to for m in sent_emails(1)] == [["late@example.com"]]

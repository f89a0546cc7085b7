"""The admin is an auditing window, not a door (issue 19, item 6): its lists and pages show only the
agents the user may see, and the records the engine keeps are view-only for everyone."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Group, Permission
from django.test import Client

from agentrun.core.access import REVIEWERS, ensure_groups
from agentrun.core.models import Decision, OutboxEvent, Run, RunChunk, SuspendedToolCall
from tests.helpers.decisions import decide_call
from tests.helpers.runs import email_run
from tests.helpers.users import make_user

# A test runs in a transaction rolled back at its end; those marked transaction=True need real commits
# (a decision's continuation starts on commit, in another thread).
pytestmark = pytest.mark.django_db

SCOPED = ["run", "runstep", "message", "snapshot", "suspendedtoolcall", "decision", "runchunk", "thread"]


def staff(name: str, *groups: str) -> Client:
    ensure_groups()
    user = make_user(name, password=f"pw-{name}-12345", is_staff=True, group=None)
    user.groups.add(Group.objects.get(name=REVIEWERS))
    for group in groups:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_outboxevent", "view_idempotencykey"]))
    browser = Client()
    browser.force_login(user)
    return browser


@pytest.mark.django_db(transaction=True)
def test_a_staff_user_outside_an_agents_reviewers_reads_none_of_its_records(settings):
    settings.AGENTRUN_AGENT_REVIEWERS = {"support-agent": ["Support reviewers"]}
    waiting = email_run(thread="t-secret-waiting", args={"to": "secret@example.com", "subject": "s", "body": "b"})
    decided = email_run(thread="t-secret-decided")
    decide_call(agent_id="support-agent", run_id=decided, kind="decline", reason="secret reason")
    outsider, insider = staff("otto"), staff("sue", "Support reviewers")

    for model in SCOPED:
        url = f"/admin/agentrun/{model}/"
        hidden = outsider.get(url)
        assert hidden.status_code == 200, (model, hidden.status_code)
        page = hidden.content.decode()
        assert waiting not in page and decided not in page and "t-secret" not in page, model
        assert "secret@example.com" not in page and "secret reason" not in page, model
        assert insider.get(url).status_code == 200
    assert waiting in insider.get("/admin/agentrun/run/").content.decode()

    # The pages of its records are not found either (the admin sends the user back to its index).
    call = SuspendedToolCall.objects.get(run_id=waiting)
    decision = Decision.objects.get(run_id=decided)
    for model, pk in (("run", waiting), ("suspendedtoolcall", call.pk), ("decision", decision.pk)):
        assert outsider.get(f"/admin/agentrun/{model}/{quote(pk)}/change/").status_code == 302, model
        assert insider.get(f"/admin/agentrun/{model}/{quote(pk)}/change/").status_code == 200, model


def test_the_records_the_engine_keeps_are_view_only_for_everyone():
    run_id = email_run(thread="t-side")
    root = make_user("root", password="pw-root-12345", group=None, is_staff=True, is_superuser=True)
    browser = Client()
    browser.force_login(root)
    chunk = RunChunk.objects.filter(run_id=run_id).first()
    event = OutboxEvent.objects.first()
    for model, pk in (
        ("run", run_id),
        ("runchunk", chunk.pk),
        ("suspendedtoolcall", SuspendedToolCall.objects.get().pk),
    ):
        page = browser.get(f"/admin/agentrun/{model}/{quote(pk)}/change/")
        assert page.status_code == 200 and 'name="_save"' not in page.content.decode(), model
        assert browser.post(f"/admin/agentrun/{model}/{quote(pk)}/delete/", {"post": "yes"}).status_code == 403, model
    for model in ("idempotencykey", "snapshotcount", "workerheartbeat", "outboxevent", "tooleffect"):
        assert browser.get(f"/admin/agentrun/{model}/add/").status_code == 403, model
    if event is not None:
        assert (
            browser.post(f"/admin/agentrun/outboxevent/{quote(event.pk)}/delete/", {"post": "yes"}).status_code == 403
        )
    for model in ("webhookdelivery", "emailnotice", "decisionlink"):
        assert browser.get(f"/admin/notifications/{model}/add/").status_code == 403, model
    assert Run.objects.filter(pk=run_id).exists()

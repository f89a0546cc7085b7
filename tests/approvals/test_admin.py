"""The admin: every model registered; decisions read-only for superusers too; CSV export."""

from __future__ import annotations

import csv
import io

import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from agentrun.core.models import Decision
from tests.helpers.runs import EMAIL, suspend
from tests.helpers.users import make_user

# Each test runs in a transaction rolled back at its end: nothing here needs a real commit.
pytestmark = pytest.mark.django_db


def decided_runs(n: int) -> list[Decision]:
    """Decisions made through the engine (the runs are left unfinished: only the trail matters here)."""
    from tests.helpers.decisions import record_decision as decide

    decisions = []
    for i in range(n):
        run_id = suspend("send-email", dict(EMAIL, to=f"user{i}@example.com"), thread=f"t-admin{i}")
        decisions.append(decide(agent_id="support-agent", run_id=run_id, kind="decline", reason=f"r{i}").decision)
    return decisions


def test_every_agentrun_model_is_registered():
    for model in apps.get_app_config("agentrun").get_models():
        assert admin.site.is_registered(model), model


def test_admin_pages_load(admin_client_):
    client, _ = admin_client_
    decided_runs(1)
    for model in apps.get_app_config("agentrun").get_models():
        url = reverse(f"admin:agentrun_{model._meta.model_name}_changelist")
        assert client.get(url, {"q": "t-admin0"}).status_code == 200, url


def test_superuser_cannot_add_change_or_delete_decisions(admin_client_):
    client, _ = admin_client_
    [decision] = decided_runs(1)
    assert client.get(reverse("admin:agentrun_decision_add")).status_code == 403
    change_url = reverse("admin:agentrun_decision_change", args=[decision.pk])
    page = client.get(change_url)
    assert page.status_code == 200 and b'name="_save"' not in page.content  # view only
    assert client.post(change_url, {"reason": "rewritten"}).status_code == 403
    delete_url = reverse("admin:agentrun_decision_delete", args=[decision.pk])
    assert client.post(delete_url, {"post": "yes"}).status_code == 403
    changelist = client.get(reverse("admin:agentrun_decision_changelist")).content.decode()
    assert "delete_selected" not in changelist and "export_decisions_csv" in changelist
    response = client.post(
        reverse("admin:agentrun_decision_changelist"),
        {"action": "delete_selected", "_selected_action": [decision.pk], "post": "yes"},
    )
    assert Decision.objects.filter(pk=decision.pk, reason="r0").exists()
    assert response.status_code in (200, 302)


def test_csv_export_holds_the_selected_rows(admin_client_):
    client, _ = admin_client_
    decisions = decided_runs(3)
    chosen = decisions[:2]
    response = client.post(
        reverse("admin:agentrun_decision_changelist"),
        {"action": "export_decisions_csv", "_selected_action": [d.pk for d in chosen]},
    )
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert sorted(r["id"] for r in rows) == sorted(d.pk for d in chosen)
    assert {r["reason"] for r in rows} == {"r0", "r1"}
    assert all(r["kind"] == "decline" and r["tool_name"] == "send-email" for r in rows)


ENGINE_STATE = ["run", "runstep", "snapshot", "suspendedtoolcall", "runchunk", "message", "backgroundtask"]


def test_engine_state_is_view_only_for_superusers_too(admin_client_):
    from agentrun.core.models import BackgroundTask, Message, Run, RunChunk, RunStep, Snapshot, SuspendedToolCall

    client, _ = admin_client_
    run_id = suspend("send-email", EMAIL, thread="t-view-only")
    run = Run.objects.get(pk=run_id)
    task = BackgroundTask.objects.create(
        run=run, agent_id=run.agent_id, thread_id=run.thread_id, tool_call_id="bg-1", tool_name="research"
    )
    objects = {
        "run": run.pk,
        "runstep": RunStep.objects.filter(run=run).first().pk,
        "snapshot": Snapshot.objects.get(run=run).pk,
        "suspendedtoolcall": SuspendedToolCall.objects.get(run=run).pk,
        "runchunk": RunChunk.objects.filter(run=run).first().pk,
        "message": Message.objects.filter(run=run).first().pk,
        "backgroundtask": task.pk,
    }
    for model in ENGINE_STATE:
        from django.contrib.admin.utils import quote

        assert client.get(reverse(f"admin:agentrun_{model}_add")).status_code == 403, model
        change_url = reverse(f"admin:agentrun_{model}_change", args=[quote(objects[model])])
        page = client.get(change_url)
        assert page.status_code == 200 and b'name="_save"' not in page.content, model
        assert client.post(change_url, {}).status_code == 403, model
        delete_url = reverse(f"admin:agentrun_{model}_delete", args=[quote(objects[model])])
        assert client.post(delete_url, {"post": "yes"}).status_code == 403, model
        changelist = client.get(reverse(f"admin:agentrun_{model}_changelist")).content.decode()
        assert "delete_selected" not in changelist, model
    assert Run.objects.get(pk=run_id).status == "suspended" and Snapshot.objects.filter(run=run).exists()


def test_cancel_run_action_goes_through_the_engine(admin_client_, reviewer):
    from agentrun.core.models import Run, Snapshot, SuspendedToolCall

    client, _ = admin_client_
    waiting = suspend("send-email", EMAIL, thread="t-cancel")
    other = suspend("send-email", EMAIL, thread="t-keep")
    changelist = reverse("admin:agentrun_run_changelist")
    assert "cancel_selected_runs" in client.get(changelist).content.decode()
    response = client.post(changelist, {"action": "cancel_selected_runs", "_selected_action": [waiting]}, follow=True)
    assert "Cancelled 1 run(s)." in response.content.decode()
    run = Run.objects.get(pk=waiting)
    assert run.status == "cancelled" and run.cancelled_at is not None
    assert not Snapshot.objects.filter(run_id=waiting).exists()
    assert not SuspendedToolCall.objects.filter(run_id=waiting).exists()
    assert Run.objects.get(pk=other).status == "suspended"
    # The inbox no longer lists it; cancelling again says why nothing happened.
    reviewer_client, _ = reviewer
    inbox = reviewer_client.get(reverse("approvals:inbox")).content.decode()
    assert 'data-thread-id="t-cancel"' not in inbox and 'data-thread-id="t-keep"' in inbox
    again = client.post(changelist, {"action": "cancel_selected_runs", "_selected_action": [waiting]}, follow=True)
    assert "has already finished" in again.content.decode()


def test_staff_without_the_cancel_permission_gets_no_cancel_action(groups):
    from django.contrib.auth.models import Permission
    from django.test import Client

    from agentrun.core.models import Run

    run_id = suspend("send-email", EMAIL, thread="t-staff")
    staff = make_user("stan", is_staff=True, group=None)
    staff.user_permissions.add(Permission.objects.get(codename="view_run"))
    client = Client()
    client.force_login(staff)
    changelist = reverse("admin:agentrun_run_changelist")
    assert client.get(changelist).status_code == 200
    assert "cancel_selected_runs" not in client.get(changelist).content.decode()
    client.post(changelist, {"action": "cancel_selected_runs", "_selected_action": [run_id]})
    assert Run.objects.get(pk=run_id).status == "suspended"


def test_one_run_link_for_every_admin():
    links = {
        type(admin.site._registry[m]).run_link
        for m in admin.site._registry
        if hasattr(admin.site._registry[m], "run_link")
    }
    assert len(links) == 1

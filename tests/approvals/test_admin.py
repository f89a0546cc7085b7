"""The admin: every model registered; decisions read-only for superusers too; CSV export."""

from __future__ import annotations

import csv
import io

import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from agentrun.models import Decision
from tests.approvals.conftest import suspend
from tests.factories import EMAIL

pytestmark = pytest.mark.django_db(transaction=True)


def decided_runs(n: int) -> list[Decision]:
    """Decisions made through the engine (the runs are left unfinished: only the trail matters here)."""
    from tests.factories import record_decision as decide

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

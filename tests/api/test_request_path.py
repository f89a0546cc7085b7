"""What every REST request pays before the view: one query for the token, one for the permissions."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.helpers.runs import email_run
from tests.helpers.users import make_user, token_client

# Each test runs in a transaction rolled back at its end: nothing here needs a real commit.
pytestmark = pytest.mark.django_db

URL = "/api/agents/support-agent/suspended-runs"


def test_a_request_reads_the_token_once_and_the_permissions_once(api):
    email_run(thread="t-1")
    with CaptureQueriesContext(connection) as ctx:
        response = api.get(URL)
    assert response.status_code == 200
    sql = [q["sql"] for q in ctx.captured_queries]
    assert sum("authtoken_token" in q for q in sql) == 1
    assert sum("auth_permission" in q for q in sql) == 1  # the person's own and their groups' together


def test_permissions_granted_to_the_person_and_to_their_groups_both_count(reviewer, viewer):
    loner = make_user("lone", password="pw", group=None)
    assert token_client(loner).get(URL).status_code == 403
    loner.user_permissions.add(Permission.objects.get(codename="view_run"))
    assert token_client(loner).get(URL).status_code == 200
    assert token_client(loner).post("/api/agents/support-agent/runs/nope/approve", {}, format="json").status_code == 403
    viewer.user_permissions.add(Permission.objects.get(codename="decide_toolcall"))  # groups' and own together
    answer = token_client(viewer).post(f"/api/agents/support-agent/runs/{email_run()}/approve", {}, format="json")
    assert answer.status_code == 202
    assert token_client(reviewer).get(URL).status_code == 200

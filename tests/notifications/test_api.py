"""REST for webhook endpoints (docs/notifications.md#25-rest): shapes, write-only secrets, validation, who may."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from hypothesis import HealthCheck, settings
from rest_framework.test import APIClient

from notifications import signatures
from notifications.models import WebhookDelivery, WebhookEndpoint
from tests.helpers.notifications import make_endpoint
from tests.helpers.runs import email_run
from tests.helpers.schema import CHECKS, schema
from tests.helpers.users import make_user, token_client, token_of
from tests.helpers.waiting import wait_until

# A test runs in a transaction rolled back at its end; those marked transaction=True need real commits
# (a webhook is delivered by a task that starts on commit, in another thread).
pytestmark = pytest.mark.django_db

BASE = "/api/webhook-endpoints"


@pytest.fixture
def root() -> APIClient:
    return token_client(make_user("root", group=None, is_staff=True, is_superuser=True))


def test_create_read_update_delete(root):
    created = root.post(
        f"{BASE}/",
        {"url": "https://hooks.example.com/x", "secret": "s3cret", "events": ["run.suspended"], "agents": []},
        format="json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert set(body) >= {"id", "url", "events", "agents", "active"}
    assert "secret" not in body  # write-only
    assert (body["url"], body["events"], body["agents"], body["active"]) == (
        "https://hooks.example.com/x",
        ["run.suspended"],
        [],
        True,
    )
    endpoint_id = body["id"]
    assert WebhookEndpoint.objects.get(pk=endpoint_id).secret == "s3cret"

    listing = root.get(f"{BASE}/").json()
    assert listing["object"] == "list" and [e["id"] for e in listing["data"]] == [endpoint_id]
    assert listing["hasMore"] is False and "secret" not in listing["data"][0]
    assert root.get(BASE).status_code == 200  # with and without the trailing slash

    for path in (f"{BASE}/{endpoint_id}", f"{BASE}/{endpoint_id}/"):
        assert root.get(path).json() == body
    patched = root.patch(f"{BASE}/{endpoint_id}", {"active": False, "agents": ["billing-agent"]}, format="json")
    assert patched.status_code == 200
    assert (patched.json()["active"], patched.json()["agents"], patched.json()["events"]) == (
        False,
        ["billing-agent"],
        ["run.suspended"],
    )
    assert root.patch(f"{BASE}/{endpoint_id}", {"secret": "rotated"}, format="json").status_code == 200
    assert WebhookEndpoint.objects.get(pk=endpoint_id).secret == "rotated"

    assert root.delete(f"{BASE}/{endpoint_id}").status_code == 204
    missing = root.get(f"{BASE}/{endpoint_id}")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "NOT_FOUND"


def test_a_secret_is_generated_when_none_is_given_and_shown_once(root):
    created = root.post(f"{BASE}/", {"url": "http://127.0.0.1:9/h"}, format="json").json()
    assert created["secret"].startswith("whsec_")
    assert created["events"] == [] and created["agents"] == []  # empty: everything
    assert "secret" not in root.get(f"{BASE}/{created['id']}").json()
    assert signatures.signing_key(created["secret"])  # a usable key


@pytest.mark.parametrize(
    "body, field",
    [
        ({"url": "ftp://example.com/x"}, "url"),
        ({"url": "not a url"}, "url"),
        ({}, "url"),
        ({"url": "https://e.com", "events": ["run.exploded"]}, "events"),
        ({"url": "https://e.com", "events": "run.suspended"}, "events"),
        ({"url": "https://e.com", "secret": "whsec_!!!"}, "secret"),
        ({"url": "https://e.com", "secret": ""}, "secret"),
        ({"url": "https://e.com", "active": "maybe"}, "active"),
        ({"url": "https://e.com", "format": "teams"}, "format"),
    ],
)
def test_bad_input_is_a_400_and_changes_nothing(root, body, field):
    response = root.post(f"{BASE}/", body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "INVALID_REQUEST" and field in error["details"]["fields"]
    assert not WebhookEndpoint.objects.exists()


def test_a_misspelled_field_is_refused_not_ignored(root):
    # "agent" for "agents" would otherwise make an endpoint that receives every agent's events.
    refused = root.post(f"{BASE}/", {"url": "https://e.com/h", "agent": ["billing-agent"]}, format="json")
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"]["details"]["unknownFields"] == ["agent"]
    assert not WebhookEndpoint.objects.exists()
    endpoint = make_endpoint("https://e.com/h", agents=["billing-agent"])
    patch = root.patch(f"{BASE}/{endpoint.pk}", {"active": False, "evnts": ["run.completed"]}, format="json")
    assert patch.status_code == 400 and patch.json()["error"]["details"]["unknownFields"] == ["evnts"]
    endpoint.refresh_from_db()
    assert endpoint.active and endpoint.events == []


def test_text_the_database_cannot_store_is_a_400(root):
    response = root.post(f"{BASE}/", {"url": "https://e.com", "agents": ["a\u0000b"]}, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_REQUEST"
    assert root.post(f"{BASE}/", [1, 2], format="json").status_code == 400


def test_superusers_and_staff_with_the_model_permissions_only(root):
    endpoint = make_endpoint("https://hooks.example.com/y")
    assert APIClient().get(f"{BASE}/").status_code == 401
    reviewer = token_client(make_user("rita"))  # may decide calls, not manage webhooks
    denied = reviewer.get(f"{BASE}/")
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "PERMISSION_DENIED"
    staff_user = make_user("stan", group=None, is_staff=True)
    staff = token_client(staff_user)
    assert staff.get(f"{BASE}/").status_code == 403
    staff_user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_webhookendpoint", "view_webhookdelivery"])
    )
    staff = token_client(staff_user)  # a fresh permission cache
    assert staff.get(f"{BASE}/").status_code == 200
    assert staff.get(f"{BASE}/{endpoint.id}/deliveries").status_code == 200
    assert staff.post(f"{BASE}/", {"url": "https://e.com"}, format="json").status_code == 403
    assert staff.delete(f"{BASE}/{endpoint.id}").status_code == 403
    staff_user.user_permissions.add(Permission.objects.get(codename="delete_webhookendpoint"))
    assert token_client(staff_user).delete(f"{BASE}/{endpoint.id}").status_code == 204
    non_staff = make_user("nina", group=None)
    non_staff.user_permissions.add(*Permission.objects.filter(codename__endswith="_webhookendpoint"))
    assert token_client(non_staff).get(f"{BASE}/").status_code == 403  # staff, too


@pytest.mark.django_db(transaction=True)
def test_deliveries_list_their_attempts(root, receiver):
    endpoint = make_endpoint(receiver.url, events=["run.suspended"])
    email_run(thread="t-api-deliveries")
    wait_until(lambda: WebhookDelivery.objects.filter(status="delivered").exists())
    page = root.get(f"{BASE}/{endpoint.id}/deliveries").json()
    assert page["object"] == "list"
    [item] = page["data"]
    assert {k: item[k] for k in ("type", "status", "attempts", "responseStatus", "nextAttemptAt")} == {
        "type": "run.suspended",
        "status": "delivered",
        "attempts": 1,
        "responseStatus": 200,
        "nextAttemptAt": None,
    }
    assert item["eventId"].startswith("evt_") and item["id"].startswith("whd_")
    assert root.get(f"{BASE}/whep_missing/deliveries").status_code == 404


@pytest.mark.parametrize("weird", ["a b", "a%2Fb", "%23x", "%3Fq", "é"])
def test_unknown_ids_of_any_spelling_are_not_found(root, weird):
    response = root.get(f"{BASE}/{weird}")
    assert response.status_code == 404 and response.json()["error"]["code"] == "NOT_FOUND"


# --- fuzzing as a superuser (the suite-wide fuzz runs as a reviewer, who gets 403 here) ---------
webhook_schema = schema.include(path_regex="^/api/webhook-endpoints")


@pytest.fixture
def root_header(transactional_db) -> dict[str, str]:
    user = make_user("fuzz-root", group=None, is_staff=True, is_superuser=True)
    make_endpoint("https://hooks.example.com/fuzz")  # something for the item routes to find
    return {"Authorization": f"Token {token_of(user)}"}


@pytest.mark.usefixtures("keep_test_connection")
@webhook_schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_fuzz_the_webhook_api_as_a_superuser(case, root_header):
    response = case.call(headers=root_header)
    case.validate_response(response, checks=CHECKS, headers=root_header)

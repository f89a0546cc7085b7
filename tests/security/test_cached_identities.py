"""Tokens, permissions and groups are kept a few seconds per process (docs/security.md, "Cached
identities"), and every change that decides who someone is or what they may do takes effect on the
next request in the process that made it: these requests would be answered from the cache otherwise."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token

from agentrun.core import authcache
from agentrun.core.access import REVIEWERS, VIEWERS
from tests.helpers.runs import email_run
from tests.helpers.users import make_user, token_client

pytestmark = pytest.mark.django_db

AGENTS = "/api/agents/"
LISTING = "/api/agents/billing-agent/suspended-runs"


def approve(client, run_id: str) -> int:
    return client.post(f"/api/agents/support-agent/runs/{run_id}/approve", {}, format="json").status_code


def test_a_second_request_reads_neither_the_token_nor_the_permissions(reviewer):
    client = token_client(reviewer)
    assert client.get(AGENTS).status_code == 200
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(AGENTS).status_code == 200
    assert ctx.captured_queries == []


def test_a_deleted_token_is_refused_at_once(reviewer):
    client = token_client(reviewer)
    assert client.get(AGENTS).status_code == 200
    Token.objects.filter(user=reviewer).delete()
    assert client.get(AGENTS).status_code == 401


def test_a_rotated_token_works_and_the_old_one_is_refused_at_once(reviewer):
    client = token_client(reviewer)
    assert client.get(AGENTS).status_code == 200
    old = Token.objects.get(user=reviewer)
    old.delete()
    new = Token.objects.create(user=reviewer)
    assert client.get(AGENTS).status_code == 401
    client.credentials(HTTP_AUTHORIZATION=f"Token {new.key}")
    assert client.get(AGENTS).status_code == 200


def test_a_deactivated_person_is_refused_at_once_and_welcome_back_when_reactivated(reviewer):
    client = token_client(reviewer)
    assert client.get(AGENTS).status_code == 200
    reviewer.is_active = False
    reviewer.save()
    assert client.get(AGENTS).status_code == 401
    reviewer.is_active = True
    reviewer.save()
    assert client.get(AGENTS).status_code == 200


def test_leaving_the_reviewers_takes_the_right_to_decide_at_once(reviewer):
    client = token_client(reviewer)
    run_id = email_run()
    assert client.get(AGENTS).status_code == 200  # the permissions are read, and kept
    reviewer.groups.remove(Group.objects.get(name=REVIEWERS))
    reviewer.groups.add(Group.objects.get(name=VIEWERS))
    assert approve(client, run_id) == 403


def test_a_permission_taken_from_a_group_or_a_person_is_gone_at_once(reviewer):
    client = token_client(reviewer)
    assert client.get(AGENTS).status_code == 200
    decide = Permission.objects.get(codename="decide_toolcall")
    reviewer.user_permissions.add(decide)  # their own, and their group's
    Group.objects.get(name=REVIEWERS).permissions.remove(decide)
    assert approve(client, email_run()) == 202
    reviewer.user_permissions.remove(decide)
    assert approve(client, email_run()) == 403


def test_being_made_superuser_and_back_takes_effect_at_once(settings):
    settings.AGENTRUN_AGENT_REVIEWERS = {"billing-agent": ["Billing reviewers"]}
    person = make_user("sam", group=VIEWERS)
    client = token_client(person)
    assert client.get(LISTING).status_code == 404
    person.is_superuser = True
    person.save()
    assert client.get(LISTING).status_code == 200
    person.is_superuser = False
    person.save()
    assert client.get(LISTING).status_code == 404


def test_agent_scope_follows_group_membership_renames_and_the_setting_at_once(settings):
    settings.AGENTRUN_AGENT_REVIEWERS = {"billing-agent": ["Billing reviewers"]}
    person = make_user("bill", group=REVIEWERS)
    client = token_client(person)
    assert client.get(LISTING).status_code == 404
    billing = Group.objects.create(name="Billing reviewers")
    person.groups.add(billing)
    assert client.get(LISTING).status_code == 200
    billing.name = "Former billing reviewers"
    billing.save()
    assert client.get(LISTING).status_code == 404
    settings.AGENTRUN_AGENT_REVIEWERS = {"billing-agent": ["Former billing reviewers"]}
    assert client.get(LISTING).status_code == 200
    person.groups.remove(billing)
    assert client.get(LISTING).status_code == 404


def test_what_a_request_read_while_the_person_was_being_deactivated_is_not_kept(reviewer):
    """A request that read the token just before a deactivation (in another thread, say) must not keep
    what it read: the next request sees the deactivation."""
    client = token_client(reviewer)
    key = Token.objects.get(user=reviewer).key

    def read_then_deactivate():
        token = Token.objects.select_related("user").get(key=key)  # read while still active...
        reviewer.is_active = False
        reviewer.save()  # ...then the change lands before the read is stored
        return token

    assert authcache.cached(("token", key), read_then_deactivate).user.is_active
    assert client.get(AGENTS).status_code == 401

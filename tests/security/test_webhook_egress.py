"""Webhooks cannot be turned into a probe of the private network (issue 24, docs/security.md "Webhook
targets"): blocked addresses are refused at creation and at every connection, the delivery log never
echoes what answered, an endpoint sees no more than its owner, its secret is encrypted at rest, and
deleting an endpoint ends its deliveries cleanly."""

from __future__ import annotations

import logging
import socket
import threading

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from rest_framework.test import APIClient

from agentrun.core.access import VIEWERS, ensure_groups
from notifications.models import WebhookDelivery, WebhookEndpoint

# receiver: a real HTTP receiver on 127.0.0.1; _clean_notifier: AGENTRUN_WEBHOOK_ALLOW_PRIVATE on (for it),
# and no notifications task outliving a test.
from tests.helpers.notifications import make_endpoint
from tests.helpers.runs import email_run, refund_run
from tests.helpers.users import make_user
from tests.helpers.waiting import wait_for_tasks, wait_until

# Webhooks and email as the notification tests send them (a fresh view of subscribers, no job left).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_notifier")]

BASE = "/api/webhook-endpoints"

# What a staff user tried (issue 24): the database, Redis, the metadata service, the host itself.
PROBES = [
    ("http://127.0.0.1:3306/", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[::1]:6379/", "loopback"),
    ("http://localhost:5432/", "loopback"),
    ("http://10.0.0.5/hook", "private"),
    ("http://192.168.1.1/hook", "private"),
    ("http://[fd00::1]/hook", "private"),
    ("http://100.64.0.1/hook", "private"),  # carrier-grade NAT: not public either
    ("http://[::ffff:127.0.0.1]/hook", "loopback"),  # IPv4-mapped IPv6 is the IPv4 address
    ("http://0.0.0.0:8000/", "unspecified"),
    ("http://224.0.0.1/", "multicast"),
    ("http://240.0.0.1/", "reserved"),
]


@pytest.fixture
def root() -> APIClient:
    client = APIClient()
    client.force_authenticate(make_user("root", group=None, is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def default_egress(settings) -> None:
    """The production default (tests/notifications' conftest allows the local receivers)."""
    settings.AGENTRUN_WEBHOOK_ALLOW_PRIVATE = False


@pytest.mark.parametrize(("url", "kind"), PROBES)
def test_a_url_reaching_inside_is_refused_at_creation_naming_why(root, default_egress, url, kind):
    response = root.post(f"{BASE}/", {"url": url}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "INVALID_REQUEST"
    assert f"{kind} address" in error["details"]["fields"]["url"][0]
    assert not WebhookEndpoint.objects.exists()


def test_a_change_to_a_url_reaching_inside_is_refused_too(root, default_egress):
    created = root.post(f"{BASE}/", {"url": "https://hooks.example.com/x"}, format="json").json()
    response = root.patch(f"{BASE}/{created['id']}", {"url": "http://127.0.0.1:6379/"}, format="json")
    assert response.status_code == 400
    assert WebhookEndpoint.objects.get().url == "https://hooks.example.com/x"


def test_the_admin_form_refuses_it_as_well(default_egress, client):
    client.force_login(make_user("admin-root", group=None, is_staff=True, is_superuser=True))
    response = client.post(
        "/admin/notifications/webhookendpoint/add/", {"url": "http://169.254.169.254/", "format": "standard"}
    )
    assert response.status_code == 200  # the form again, with the error
    assert "link-local address" in response.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_allow_private_admits_internal_receivers_but_never_link_local(root, settings):
    settings.AGENTRUN_WEBHOOK_ALLOW_PRIVATE = True
    for url in ("http://127.0.0.1:8080/hook", "http://10.1.2.3/hook", "http://localhost:9000/"):
        assert root.post(f"{BASE}/", {"url": url}, format="json").status_code == 201
    for url in ("http://169.254.169.254/", "http://224.0.0.1/"):
        assert root.post(f"{BASE}/", {"url": url}, format="json").status_code == 400


class BannerServer:
    """A TCP service that is not HTTP (MariaDB greets with a binary banner), counting connections."""

    BANNER = b"d\x00\x00\x00\n11.4.2-MariaDB secret-build\x00"

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.recv(65536)  # the request, then the greeting a client would have had first
                conn.sendall(self.BANNER)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def banner():
    server = BannerServer()
    yield server
    server.close()


def _delivery_attempted() -> WebhookDelivery:
    return wait_until(lambda: WebhookDelivery.objects.filter(attempts__gte=1).first(), what="an attempt")


def test_a_name_that_resolves_inside_is_blocked_at_connect_time(settings, banner):
    """Accepted once (an internal receiver, or a name that did not resolve then), refused when it connects."""
    make_endpoint(f"http://localhost:{banner.port}/", events=["run.suspended"])
    settings.AGENTRUN_WEBHOOK_ALLOW_PRIVATE = False
    email_run(thread="t-rebind")
    row = _delivery_attempted()
    assert (row.last_error, row.response_status) == ("blocked address", None)
    assert banner.connections == 0  # nothing was ever sent there


def test_the_delivery_log_never_echoes_what_answered(settings, banner):
    make_endpoint(f"http://127.0.0.1:{banner.port}/", events=["run.suspended"])  # allowed: a private receiver
    email_run(thread="t-banner")
    row = _delivery_attempted()
    assert banner.connections == 1
    assert row.last_error == "invalid HTTP response"
    assert "MariaDB" not in row.last_error and "\x00" not in row.last_error


def _staff(name: str, *groups: str) -> User:
    ensure_groups()
    user = make_user(name, is_staff=True, group=None)
    for group in groups:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def test_an_endpoint_receives_only_the_agents_its_owner_may_view(settings, receiver):  # noqa: F811
    settings.AGENTRUN_AGENT_REVIEWERS = {"billing-agent": ["Billing reviewers"]}
    outsider = _staff("support-staff", VIEWERS)  # may view support-agent, not billing-agent
    make_endpoint(receiver.url, events=["run.suspended"], agents=[], owner=outsider)  # "all agents"
    refund_run(thread="t-billing-secret")
    email_run(thread="t-support")
    [request] = receiver.wait_for(1)
    wait_for_tasks()
    assert b"t-support" in request.body
    assert len(receiver.requests) == 1  # the refund, with its arguments, never left


def test_an_endpoint_whose_owner_may_view_nothing_receives_nothing(receiver):  # noqa: F811
    make_endpoint(receiver.url, events=["run.suspended"], owner=_staff("hooks-only"))  # no view permission
    email_run(thread="t-nobody")
    wait_for_tasks()
    assert not receiver.requests and not WebhookDelivery.objects.exists()


def test_the_creator_becomes_the_owner(root):
    created = root.post(f"{BASE}/", {"url": "https://hooks.example.com/o"}, format="json").json()
    assert WebhookEndpoint.objects.get(pk=created["id"]).owner.username == "root"


def test_secrets_are_encrypted_at_rest_and_never_shown_again(root):
    created = root.post(f"{BASE}/", {"url": "https://hooks.example.com/s", "secret": "plain-s3cret"}, format="json")
    assert "secret" not in created.json()  # given, so not echoed
    with connection.cursor() as cursor:
        cursor.execute("SELECT sealed_secret FROM notifications_webhookendpoint")
        [(stored,)] = cursor.fetchall()
    assert "plain-s3cret" not in stored
    assert WebhookEndpoint.objects.get().secret == "plain-s3cret"  # the deliveries still sign with it
    assert "secret" not in root.get(f"{BASE}/{created.json()['id']}").json()


def test_a_secret_rotated_to_a_new_key_stays_readable(settings):
    from cryptography.fernet import Fernet

    from agentrun.management.commands.agentrun_secrets import rotate_all

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.AGENTRUN_ENCRYPTION_KEYS = [old]
    endpoint = make_endpoint("https://hooks.example.com/r", secret="rotate-me")
    settings.AGENTRUN_ENCRYPTION_KEYS = [new, old]
    assert rotate_all() == 1
    settings.AGENTRUN_ENCRYPTION_KEYS = [new]  # the old key dropped
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).secret == "rotate-me"


def test_deleting_an_endpoint_during_a_delivery_ends_it_cleanly(root, receiver, caplog):  # noqa: F811
    receiver.answers = ["hang"]
    endpoint = make_endpoint(receiver.url, events=["run.suspended"])
    email_run(thread="t-delete")
    wait_until(lambda: receiver.hanging == 1, what="the delivery in flight")
    assert root.delete(f"{BASE}/{endpoint.id}").status_code == 204
    with caplog.at_level(logging.INFO, logger="agentrun"):
        receiver.release()
        wait_until(lambda: "endpoint was deleted" in caplog.text, what="the attempt's end")
    assert not WebhookDelivery.objects.exists()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text

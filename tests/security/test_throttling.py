"""Nothing speeds a guesser up (issue 24, docs/security.md "Throttling"): failed logins lock the account and
the address for a while with a message; failed token authentications are limited per address before any
token is checked (429 THROTTLED, Retry-After), on REST and websockets alike; API use is limited per
person; password reset exists only with email, is limited, and links to AGENTRUN_PUBLIC_URL; a person's
open websockets are capped (close 4029)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from axes.models import AccessAttempt
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, User
from django.core import mail
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agentrun.asgi import application
from agentrun.core.access import REVIEWERS, ensure_groups
from tests.helpers.users import make_user

# A test runs in a transaction rolled back at its end; those marked transaction=True need real commits
# (async tests reach the database from another thread; rate counters key on user ids, which a rolled back
# insert gives again on SQLite).
pytestmark = pytest.mark.django_db

ORIGIN = (b"origin", b"http://localhost")


def new_address() -> str:
    """A client address of its own: counters live in the cache (Redis on PostgreSQL runs), keyed by it."""
    return f"2001:db8::{uuid.uuid4().hex[:4]}:{uuid.uuid4().hex[:4]}"


def reviewer(name: str | None = None, password: str = "right-password-123") -> User:
    ensure_groups()
    user = make_user(name or f"rev-{uuid.uuid4().hex[:8]}", password=password, group=None)
    user.groups.add(Group.objects.get(name=REVIEWERS))
    return user


def sign_in(client: Client, username: str, password: str):  # noqa: ANN201
    return client.post("/accounts/login/", {"username": username, "password": password})


# --- logins -------------------------------------------------------------------------------------
def test_thirty_wrong_passwords_then_the_right_one_is_refused_with_a_message(settings):
    settings.AXES_FAILURE_LIMIT = 10
    user = reviewer()
    client = Client(REMOTE_ADDR=new_address())
    answers = [sign_in(client, user.username, f"guess-{i}").status_code for i in range(30)]
    assert answers[:9] == [200] * 9  # the form again, "did not match"
    assert set(answers[9:]) == {429}
    response = sign_in(client, user.username, "right-password-123")
    assert response.status_code == 429
    page = response.content.decode()
    assert "Too many failed sign-ins" in page and "Try again in 15 minutes" in page
    assert int(response["Retry-After"]) == 900
    assert "_auth_user_id" not in client.session


def test_the_account_is_locked_whatever_address_the_guesses_come_from(settings):
    settings.AXES_FAILURE_LIMIT = 3
    user = reviewer()
    for _ in range(3):
        sign_in(Client(REMOTE_ADDR=new_address()), user.username, "wrong")
    assert sign_in(Client(REMOTE_ADDR=new_address()), user.username, "right-password-123").status_code == 429


def test_the_address_is_locked_whatever_accounts_it_tries(settings):
    settings.AXES_FAILURE_LIMIT = 3
    address = new_address()
    for i in range(3):
        sign_in(Client(REMOTE_ADDR=address), f"nobody-{i}", "wrong")
    user = reviewer()
    assert sign_in(Client(REMOTE_ADDR=address), user.username, "right-password-123").status_code == 429
    assert sign_in(Client(REMOTE_ADDR=new_address()), user.username, "right-password-123").status_code == 302


def test_the_lock_out_expires(settings):
    settings.AXES_FAILURE_LIMIT = 3
    user = reviewer()
    address = new_address()
    for _ in range(3):
        sign_in(Client(REMOTE_ADDR=address), user.username, "wrong")
    assert sign_in(Client(REMOTE_ADDR=address), user.username, "right-password-123").status_code == 429
    # The failures happened longer ago than the cool-off (15 minutes): they no longer count.
    for attempt in AccessAttempt.objects.all():
        AccessAttempt.objects.filter(pk=attempt.pk).update(attempt_time=attempt.attempt_time - timedelta(minutes=16))
    assert sign_in(Client(REMOTE_ADDR=address), user.username, "right-password-123").status_code == 302


# --- tokens -------------------------------------------------------------------------------------
def test_a_token_guesser_gets_429_past_the_limit_before_any_token_is_checked(settings):
    settings.AGENTRUN_TOKEN_FAILURE_RATE = "30/minute"
    address = new_address()
    guesser = APIClient(REMOTE_ADDR=address)
    answers = [guesser.get("/api/agents/", HTTP_AUTHORIZATION=f"Token guess{i:036d}").status_code for i in range(30)]
    assert set(answers) == {401}
    response = guesser.get("/api/agents/", HTTP_AUTHORIZATION="Bearer guess-31")
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "THROTTLED"
    assert 1 <= int(response["Retry-After"]) <= 60
    # Even a right guess is not looked at until the window passes; another address is not affected.
    key = Token.objects.create(user=reviewer()).key
    assert guesser.get("/api/agents/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 429
    elsewhere = APIClient(REMOTE_ADDR=new_address())
    assert elsewhere.get("/api/agents/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200


def test_good_tokens_are_not_counted(settings):
    settings.AGENTRUN_TOKEN_FAILURE_RATE = "3/minute"
    key = Token.objects.create(user=reviewer()).key
    client = APIClient(REMOTE_ADDR=new_address())
    assert {client.get("/api/agents/", HTTP_AUTHORIZATION=f"Token {key}").status_code for _ in range(10)} == {200}


def test_a_token_known_already_is_refused_too_from_an_address_past_its_limit(settings):
    """A token the process knows (cached) skips the token lookup, not the failed-token check: that check
    and the API count go to the cache together (docs/performance.md, "Fourth pass"), same answers."""
    settings.AGENTRUN_TOKEN_FAILURE_RATE = "3/minute"
    key = Token.objects.create(user=reviewer()).key
    address = new_address()
    client = APIClient(REMOTE_ADDR=address)
    assert client.get("/api/agents/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200  # now known
    assert client.get("/api/agents/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    for i in range(3):
        assert client.get("/api/agents/", HTTP_AUTHORIZATION=f"Token wrong{i}").status_code == 401
    response = client.get("/api/agents/", HTTP_AUTHORIZATION=f"Token {key}")
    assert (response.status_code, response.json()["error"]["code"]) == (429, "THROTTLED")
    assert "failed token" in response.json()["error"]["message"]
    elsewhere = APIClient(REMOTE_ADDR=new_address())
    assert elsewhere.get("/api/agents/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200


def test_behind_a_trusted_proxy_the_forwarded_address_is_the_one_counted(settings):
    settings.AGENTRUN_TOKEN_FAILURE_RATE = "2/minute"
    settings.AGENTRUN_TRUSTED_PROXIES = 1
    proxy = APIClient(REMOTE_ADDR="10.0.0.2")
    guesser, other = new_address(), new_address()
    for _ in range(2):
        proxy.get("/api/agents/", HTTP_AUTHORIZATION="Token nope", HTTP_X_FORWARDED_FOR=guesser)
    # A client cannot pick its address: only the proxy's (right-most) entry is believed.
    spoofed = f"{other}, {guesser}"
    assert proxy.get("/api/agents/", HTTP_AUTHORIZATION="Token nope", HTTP_X_FORWARDED_FOR=spoofed).status_code == 429
    assert proxy.get("/api/agents/", HTTP_AUTHORIZATION="Token nope", HTTP_X_FORWARDED_FOR=other).status_code == 401


@pytest.mark.django_db(transaction=True)
async def test_websocket_token_guesses_count_with_rest_ones(settings):
    settings.AGENTRUN_TOKEN_FAILURE_RATE = "2/minute"
    settings.AGENTRUN_TRUSTED_PROXIES = 1
    address = new_address()
    forwarded = (b"x-forwarded-for", address.encode())
    user = await sync_to_async(reviewer)()
    key = (await Token.objects.acreate(user=user)).key
    for _ in range(2):
        comm = WebsocketCommunicator(application, "/ws/approvals/?token=wrong", headers=[ORIGIN, forwarded])
        assert not (await comm.connect())[0]
    # Past the limit even the right token is not looked up from there: refused like an anonymous socket.
    comm = WebsocketCommunicator(application, f"/ws/approvals/?token={key}", headers=[ORIGIN, forwarded])
    assert not (await comm.connect())[0]
    response = await sync_to_async(
        lambda: APIClient(REMOTE_ADDR="10.0.0.2").get(
            "/api/agents/", HTTP_AUTHORIZATION=f"Token {key}", HTTP_X_FORWARDED_FOR=address
        )
    )()
    assert response.status_code == 429


# --- API use ------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)  # counters key on user ids: a rolled back one comes again
def test_api_use_is_limited_per_person_with_token_and_session_alike(settings):
    settings.AGENTRUN_API_RATE = "4/minute"
    user = reviewer()
    key = Token.objects.create(user=user).key
    with_token = APIClient(REMOTE_ADDR=new_address(), HTTP_AUTHORIZATION=f"Token {key}")
    with_session = APIClient(REMOTE_ADDR=new_address())
    with_session.force_login(user)
    answers = [client.get("/api/agents/").status_code for client in (with_token, with_session) * 2]
    assert answers == [200] * 4
    response = with_session.get("/api/decisions")
    assert (response.status_code, response.json()["error"]["code"]) == (429, "THROTTLED")
    assert 1 <= int(response["Retry-After"]) <= 60
    someone_else = Token.objects.create(user=reviewer()).key
    other = APIClient(REMOTE_ADDR=new_address(), HTTP_AUTHORIZATION=f"Token {someone_else}")
    assert other.get("/api/agents/").status_code == 200


@pytest.mark.django_db(transaction=True)  # counters key on user ids: a rolled back one comes again
def test_requests_refused_for_want_of_permission_do_not_use_up_the_api_rate(settings):
    """A refused request was never counted (the throttle runs after the permissions); a known token's
    count, taken with its token check, is taken back when the permissions refuse."""
    settings.AGENTRUN_API_RATE = "3/minute"
    loner = make_user(f"lone-{uuid.uuid4().hex[:8]}", group=None)
    client = APIClient(REMOTE_ADDR=new_address(), HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=loner).key}")
    assert [client.get("/api/decisions").status_code for _ in range(5)] == [403] * 5
    loner.groups.add(Group.objects.get(name=REVIEWERS))
    assert [client.get("/api/decisions").status_code for _ in range(4)] == [200, 200, 200, 429]


# --- password reset -----------------------------------------------------------------------------
def test_password_reset_does_not_exist_without_email(settings):
    settings.AGENTRUN_PASSWORD_RESET = False
    assert Client().get("/accounts/password_reset/").status_code == 404
    assert Client().post("/accounts/password_reset/", {"email": "a@b.c"}).status_code == 404


def test_password_reset_links_come_from_the_public_url_never_the_host_header(settings):
    settings.AGENTRUN_PASSWORD_RESET = True
    settings.AGENTRUN_PUBLIC_URL = "https://agentrun.example.com"
    settings.ALLOWED_HOSTS = ["*"]  # a permissive deployment: Host is whatever the client says
    user = reviewer()
    user.email = "rita@example.com"
    user.save()
    response = Client(REMOTE_ADDR=new_address()).post(
        "/accounts/password_reset/", {"email": "rita@example.com"}, HTTP_HOST="evil.example"
    )
    assert response.status_code == 302
    [message] = mail.outbox
    assert "https://agentrun.example.com/accounts/reset/" in message.body
    assert "evil.example" not in message.body


def test_password_reset_requests_are_limited(settings):
    settings.AGENTRUN_PASSWORD_RESET = True
    settings.AGENTRUN_PASSWORD_RESET_RATE = "2/hour"
    client = Client(REMOTE_ADDR=new_address())
    answers = [client.post("/accounts/password_reset/", {"email": f"x{i}@example.com"}).status_code for i in range(3)]
    assert answers == [302, 302, 429]
    # The same email address asked from elsewhere is limited too.
    target = "victim@example.com"
    for _ in range(2):
        Client(REMOTE_ADDR=new_address()).post("/accounts/password_reset/", {"email": target})
    response = Client(REMOTE_ADDR=new_address()).post("/accounts/password_reset/", {"email": target})
    assert response.status_code == 429 and "Retry-After" in response


# --- websockets per person ----------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
async def test_a_persons_open_websockets_are_capped_with_a_documented_close_code(settings):
    settings.AGENTRUN_WS_MAX_PER_USER = 3
    user = await sync_to_async(reviewer)()
    key = (await Token.objects.acreate(user=user)).key
    sockets = []
    for _ in range(3):
        comm = WebsocketCommunicator(application, f"/ws/approvals/?token={key}", headers=[ORIGIN])
        assert (await comm.connect())[0]
        sockets.append(comm)
    extra = WebsocketCommunicator(application, f"/ws/approvals/?token={key}", headers=[ORIGIN])
    await extra.connect()
    closed = await extra.receive_output(timeout=5)
    assert (closed["type"], closed["code"]) == ("websocket.close", 4029)
    # Someone else is not affected, and a closed socket frees its place.
    other = (await Token.objects.acreate(user=await sync_to_async(reviewer)())).key
    comm = WebsocketCommunicator(application, f"/ws/approvals/?token={other}", headers=[ORIGIN])
    assert (await comm.connect())[0]
    await comm.disconnect()
    await sockets.pop().disconnect()
    again = WebsocketCommunicator(application, f"/ws/approvals/?token={key}", headers=[ORIGIN])
    assert (await again.connect())[0]
    for comm in [*sockets, again]:
        await comm.disconnect()

"""Every door through every rule of a safe decision (issue 19).

A person's approval is the gate in front of a risky action; the gate's rules live in the decision
service (``agentrun.engine.service.decide`` → ``decisions.record_decisions``), and each door only
translates its input into one ``DecisionCommand``. This file walks each door — in-process Python, REST
(native), the Mastra prefix, the batch route, the ``ws/agents`` socket, the dashboard card, the admin
action, a signed link, a Slack message's buttons, a standing grant, a timeout policy — through each rule:

- strict bodies: a key a JSON body does not declare is refused, never ignored;
- proof of sight: approving a high-risk call needs the fingerprint of what was shown (428);
- stale: a decision bound to arguments (or a suspension) that changed since decides nothing;
- two people: a call that needs two approvals runs after two distinct people approved it;
- scope: someone outside the agent's reviewers decides nothing;
- grant limits: a grant never covers a high-risk or quorum call, nor outlives its creator's trust.

A refused attempt leaves the call waiting, no decision and no side effect. ``DOORS`` names a door for
every ``Decision.Via``: a door added to the product without a row here fails this file.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agentrun import Agent, AgentRunError, tool
from agentrun.asgi import application
from agentrun.core.access import REVIEWERS, ensure_groups
from agentrun.core.models import Decision, Run, StandingGrant, SuspendedToolCall, args_fingerprint
from agentrun.engine.decisions import shown_fingerprint
from agentrun.engine.timeouts import apply_due_timeouts
from agentrun.engine.types import Decider
from notifications import links, slack
from notifications.models import DecisionLink, SlackDestination, SlackIdentity, SlackMessage
from tests.helpers import slack_fake
from tests.helpers.runs import collect, of_type, rested, start, tool_line, wait_rested
from tests.helpers.users import make_user

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = "vault-agent"
EXECUTED: list[tuple[str, Any]] = []  # what the vault's tools really did (their side effects)


def vault_agent() -> Agent:
    @tool(id="wipe", requires_approval=True, risk="high")
    async def wipe(target: str) -> dict:
        EXECUTED.append(("wipe", target))
        return {"wiped": target}

    @tool(id="note", requires_approval=True)
    async def note(text: str) -> dict:
        EXECUTED.append(("note", text))
        return {"noted": text}

    @tool(id="pay", requires_approval=True, approvals_required=2)
    async def pay(amount: int) -> dict:
        EXECUTED.append(("pay", amount))
        return {"paid": amount}

    return Agent(id=AGENT, tools=[wipe, note, pay])


@pytest.fixture(autouse=True)
def vault(settings):
    EXECUTED.clear()
    settings.AGENTRUN_AGENT_REVIEWERS = {AGENT: ["Vault reviewers"]}
    ensure_groups()
    return vault_agent()


@pytest.fixture(autouse=True)
def slack_workspace(settings):
    """Slack's stand-in (tests/helpers/slack_fake.py) for the Slack door; no Slack task outlives the test."""
    state, stop = slack_fake.serve()
    settings.AGENTRUN_SLACK_API_URL = state.base
    settings.AGENTRUN_SLACK_SIGNING_SECRET = slack_fake.SIGNING_SECRET
    SLACK[:] = [state]
    yield state
    slack_fake.settle()
    stop()


SLACK: list[slack_fake.FakeSlack] = []


def person(name: str, *, vault: bool = True) -> User:
    user = make_user(name, password=f"pw-{name}-12345", group=None)
    user.groups.add(Group.objects.get(name=REVIEWERS))
    if vault:
        user.groups.add(Group.objects.get_or_create(name="Vault reviewers")[0])
    Token.objects.create(user=user)
    return user


@dataclass
class Waiting:
    run_id: str
    tool_call_id: str
    fingerprint: str  # what the listing shows

    @property
    def call(self) -> SuspendedToolCall:
        return SuspendedToolCall.objects.get(run_id=self.run_id, tool_call_id=self.tool_call_id)

    @property
    def still_waiting(self) -> bool:
        call = SuspendedToolCall.objects.filter(run_id=self.run_id, tool_call_id=self.tool_call_id).first()
        return call is not None and call.status == "open"

    def completing_decisions(self) -> int:
        return Decision.objects.filter(run_id=self.run_id, tool_call_id=self.tool_call_id, completes=True).count()


def waiting(tool_id: str, args: dict, *, thread: str | None = None) -> Waiting:
    stream, chunks = async_to_sync(start)(AGENT, tool_line(tool_id, args), thread=thread or f"t-{uuid.uuid4().hex}")
    [approval] = of_type(chunks, "tool-call-approval")
    call = SuspendedToolCall.objects.get(run_id=stream.run_id, tool_call_id=approval["payload"]["toolCallId"])
    return Waiting(stream.run_id, call.tool_call_id, shown_fingerprint(call))


# --- the doors ------------------------------------------------------------------------------------
@dataclass
class Attempt:
    """What a door answered: ``code`` is the error code it gave (None: it accepted the decision)."""

    code: str | None


SEEN = object()  # send the fingerprint the listing shows


def _fingerprint(call: Waiting, fingerprint: Any) -> str | None:
    return call.fingerprint if fingerprint is SEEN else fingerprint


def _api(user: User) -> APIClient:
    """A REST client with the user's token (sync: the continuation runs on the server's own loop)."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get(user=user).key}")
    return client


def _code(response: Any) -> str | None:
    """None for an accepted decision; else the error code (native: {error: {code}}, Mastra: {code})."""
    if response.status_code < 300:
        if getattr(response, "streaming", False):
            response.close()  # Mastra's answer streams the continuation: accepted, not read here
        return None
    body = response.json()
    return body["error"]["code"] if isinstance(body.get("error"), dict) else body.get("code")


def by_python(user: User, call: Waiting, *, fingerprint: Any = SEEN, extra: dict | None = None) -> Attempt:
    from agentrun import get_agent

    try:
        async_to_sync(_follow)(
            get_agent(AGENT).approve_tool_call(
                run_id=call.run_id,
                tool_call_id=call.tool_call_id,
                args_fingerprint=_fingerprint(call, fingerprint),
                decided_by=Decider.person(user, via="python"),
                **(extra or {}),
            )
        )
    except AgentRunError as exc:
        return Attempt(exc.code)
    return Attempt(None)


async def _follow(decision: Any) -> None:
    """The continuation, and then its end (its lease released) on this event loop, which closes next."""
    stream, _ = await collect(decision)
    await rested(stream.run_id)


def by_rest(user: User, call: Waiting, *, fingerprint: Any = SEEN, extra: dict | None = None) -> Attempt:
    body = {"toolCallId": call.tool_call_id, **(extra or {})}
    if (seen := _fingerprint(call, fingerprint)) is not None:
        body["argsFingerprint"] = seen
    return Attempt(_code(_api(user).post(f"/api/agents/{AGENT}/runs/{call.run_id}/approve", body, format="json")))


def by_batch(user: User, call: Waiting, *, fingerprint: Any = SEEN, extra: dict | None = None) -> Attempt:
    item = {"toolCallId": call.tool_call_id, "decision": "approve", **(extra or {})}
    if (seen := _fingerprint(call, fingerprint)) is not None:
        item["argsFingerprint"] = seen
    url = f"/api/agents/{AGENT}/runs/{call.run_id}/decisions"
    return Attempt(_code(_api(user).post(url, {"decisions": [item]}, format="json")))


def by_mastra(user: User, call: Waiting, *, fingerprint: Any = SEEN, extra: dict | None = None) -> Attempt:
    body = {"runId": call.run_id, "toolCallId": call.tool_call_id, **(extra or {})}
    if (seen := _fingerprint(call, fingerprint)) is not None:
        body["argsFingerprint"] = seen
    return Attempt(_code(_api(user).post(f"/api/mastra/agents/{AGENT}/approve-tool-call", body, format="json")))


def by_websocket(user: User, call: Waiting, *, fingerprint: Any = SEEN, extra: dict | None = None) -> Attempt:
    frame = {"action": "approve", "runId": call.run_id, "toolCallId": call.tool_call_id, **(extra or {})}
    if (seen := _fingerprint(call, fingerprint)) is not None:
        frame["argsFingerprint"] = seen

    token = Token.objects.get(user=user).key

    async def send() -> str | None:
        comm = WebsocketCommunicator(
            application, f"/ws/agents/{AGENT}/?token={token}", headers=[(b"origin", b"http://localhost")]
        )
        try:
            connected, _ = await comm.connect()
            assert connected
            await comm.send_json_to(frame)
            while True:
                answer = await comm.receive_json_from(timeout=10)
                if answer["type"] == "error":
                    return answer["error"]["code"]
                if answer["type"] in ("finish", "decision"):  # the continuation ran, or the call waits on
                    return None
        finally:
            await comm.disconnect()

    return Attempt(async_to_sync(send)())


def _browser(user: User) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


def by_dashboard(user: User, call: Waiting, *, fingerprint: Any = SEEN, extra: dict | None = None) -> Attempt:
    form = {"action": "approve", "confirm": "high-risk", **(extra or {})}
    if (seen := _fingerprint(call, fingerprint)) is not None:
        form["args_fingerprint"] = seen
    url = f"/approvals/runs/{quote(call.run_id)}/calls/{quote(call.tool_call_id)}/decide"
    response = _browser(user).post(url, form)
    return Attempt(None if response.status_code == 302 else f"HTTP {response.status_code}")


def by_admin(user: User, call: Waiting, *, fingerprint: Any = SEEN, extra: dict | None = None) -> Attempt:
    User.objects.filter(pk=user.pk).update(is_staff=True)  # the admin is for staff
    browser = _browser(user)
    pk = call.call.pk
    form = {"action": "approve_selected_calls", "_selected_action": pk}
    page = browser.post("/admin/agentrun/suspendedtoolcall/", form).content.decode()
    shown = re.findall(rf'name="fingerprint-{pk}" value="([0-9a-f]+)"', page)
    form |= {"post": "yes", "confirm_high_risk": "yes", **(extra or {})}
    if fingerprint is SEEN and shown:
        form[f"fingerprint-{pk}"] = shown[0]
    elif fingerprint is not SEEN and fingerprint is not None:
        form[f"fingerprint-{pk}"] = fingerprint
    response = browser.post("/admin/agentrun/suspendedtoolcall/", form, follow=True)
    messages = [str(m) for m in response.context["messages"]] if response.context else []
    if any(m.startswith(("Approved 1 ", "Recorded 1 ")) for m in messages):
        return Attempt(None)
    return Attempt(next((m for m in messages if m.startswith(call.tool_call_id)), f"refused: {messages}"))


def by_link(user: User, call: Waiting, *, fingerprint: Any = SEEN, extra: dict | None = None) -> Attempt:
    """A signed link emailed when the call was shown (bound to what it showed), used. The link always
    carries what it showed: ``fingerprint`` is the one it binds (the call's at the time)."""
    link = links.create(user, call.call)
    if fingerprint is not SEEN:  # made when the call showed other arguments
        DecisionLink.objects.filter(pk=links.resolve(_token(link)).pk).update(args_fingerprint=fingerprint or "")
    response = Client().post(urlsplit(link).path, {"action": "approve"})
    return Attempt(None if response.status_code == 200 else f"HTTP {response.status_code}")


def by_slack(user: User, call: Waiting, *, fingerprint: Any = SEEN, extra: dict | None = None) -> Attempt:
    """The message posted about the call (bound to what it showed), its Approve button clicked by the
    person's linked Slack account — and, for a high-risk call, the confirmation modal submitted. The
    message always carries what it showed: ``fingerprint`` is the one it binds (the call's at the time)."""
    fake = SLACK[0]
    owner = User.objects.filter(is_superuser=True).first() or User.objects.create_superuser("slack-owner")
    place = SlackDestination.objects.first()
    if place is None:
        place = SlackDestination(name="reviews", channel="C0REVIEWS", owner=owner)
        place.bot_token = "xoxb-door"
        place.save()
    [message] = slack.show([SuspendedToolCall.objects.select_related("run").get(pk=call.call.pk)], [place])
    if fingerprint is not SEEN:  # posted when the call showed other arguments
        SlackMessage.objects.filter(pk=message.pk).update(args_fingerprint=fingerprint or "")
        message.refresh_from_db()
    slack_user = f"U{user.pk:06d}"
    SlackIdentity.objects.get_or_create(team_id=slack_fake.TEAM, slack_user_id=slack_user, defaults={"user": user})
    before = Decision.objects.filter(decided_by=user, via="slack").count()
    opened = len(fake.of("views.open"))
    value = slack.button_value(message)
    answer = slack_fake.interact(slack_fake.click(value, slack.APPROVE, slack_user, response_url=fake.response_url()))
    said = ""
    if len(fake.of("views.open")) > opened:  # high risk: confirm in the modal that shows every argument
        view = fake.of("views.open")[-1].body["view"]
        submitted = slack_fake.interact(slack_fake.submission(view, slack_user))
        said = submitted.content.decode()
    elif answer.status_code != 200:
        return Attempt(f"HTTP {answer.status_code}")
    if Decision.objects.filter(decided_by=user, via="slack").count() > before:
        return Attempt(None)
    return Attempt(f"refused {said}".strip())


def _token(link: str) -> str:
    return urlsplit(link).path.rstrip("/").rsplit("/", 1)[-1]


PERSON_DOORS: dict[str, Callable[..., Attempt]] = {
    "python": by_python,
    "rest": by_rest,
    "mastra": by_mastra,
    "batch": by_batch,
    "websocket": by_websocket,
    "dashboard": by_dashboard,
    "admin": by_admin,
    "link": by_link,
    "slack": by_slack,
}

# Every way a decision is recorded (its ``via``), and the doors that record it. Grants and timeout
# policies (``policy``) and expiry (``system``) decide without a person: they have tests of their own.
DOORS_BY_VIA = {
    "python": ["python"],
    "api": ["rest", "mastra", "batch"],
    "websocket": ["websocket"],
    "dashboard": ["dashboard", "admin"],
    "link": ["link"],
    "slack": ["slack"],
    "policy": ["grant", "timeout"],
    "system": ["expiry"],
}


def test_every_way_a_decision_is_recorded_has_a_door_in_this_file():
    assert set(DOORS_BY_VIA) == set(Decision.Via.values), "a new door: add it here and walk it through the rules"


# --- proof of sight -------------------------------------------------------------------------------
@pytest.mark.parametrize("door", [d for d in PERSON_DOORS if d not in ("python", "link", "slack")])
def test_a_high_risk_approval_without_what_was_seen_decides_nothing(door):
    alice = person("alice")
    call = waiting("wipe", {"target": "prod-db"})
    attempt = PERSON_DOORS[door](alice, call, fingerprint=None)
    assert attempt.code is not None, f"{door} approved a high-risk call without proof of sight"
    if door in ("rest", "mastra", "batch", "websocket"):
        assert attempt.code == "FINGERPRINT_REQUIRED"
    assert call.still_waiting and call.completing_decisions() == 0 and EXECUTED == []

    assert PERSON_DOORS[door](alice, call).code is None  # with the fingerprint of what was shown
    wait_rested(call.run_id)
    assert EXECUTED == [("wipe", "prod-db")]


def test_in_process_python_and_signed_links_carry_what_they_showed():
    alice = person("alice")
    call = waiting("wipe", {"target": "staging"})
    assert by_python(alice, call, fingerprint=None).code is None  # in-process code: the program's own call
    link_call = waiting("wipe", {"target": "dev"})
    link = links.create(alice, link_call.call)
    assert links.resolve(_token(link)).args_fingerprint == link_call.fingerprint
    wait_rested(call.run_id)
    slack_call = waiting("wipe", {"target": "qa"})
    assert by_slack(alice, slack_call).code is None  # the confirmation modal showed it: its fingerprint decides
    decision = Decision.objects.get(run_id=slack_call.run_id)
    assert (decision.via, decision.args_fingerprint) == ("slack", slack_call.fingerprint)
    wait_rested(slack_call.run_id)


def test_the_rest_status_of_proof_of_sight_is_428():
    alice = person("alice")
    call = waiting("wipe", {"target": "x"})

    response = _api(alice).post(f"/api/agents/{AGENT}/runs/{call.run_id}/approve", {}, format="json")
    status, body = response.status_code, response.json()
    assert status == 428 and body["error"]["code"] == "FINGERPRINT_REQUIRED"
    assert "argsFingerprint" not in body["error"].get("details", {})  # never handed out: read the listing


# --- strict bodies ----------------------------------------------------------------------------------
@pytest.mark.parametrize("door", ["rest", "batch", "websocket"])
def test_a_misspelled_field_is_refused_not_ignored(door):
    alice = person("alice")
    call = waiting("note", {"text": "to everyone"})
    attempt = PERSON_DOORS[door](alice, call, extra={"reson": "only to me"})
    assert attempt.code == "INVALID_REQUEST"
    assert call.still_waiting and call.completing_decisions() == 0 and EXECUTED == []


def test_a_misspelled_fingerprint_at_the_mastra_prefix_is_ignored_as_mastra_does_and_the_rule_still_holds():
    alice = person("alice")
    call = waiting("wipe", {"target": "prod"})
    attempt = by_mastra(alice, call, fingerprint=None, extra={"argsFingerprnt": call.fingerprint})
    assert attempt.code == "FINGERPRINT_REQUIRED" and call.still_waiting and EXECUTED == []


# --- stale ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("door", [d for d in PERSON_DOORS if d != "link"])
def test_a_decision_on_arguments_that_changed_since_decides_nothing(door):
    alice = person("alice")
    call = waiting("note", {"text": "hello"})
    seen = call.fingerprint
    SuspendedToolCall.objects.filter(run_id=call.run_id).update(args={"text": "hello, and wire the money"})
    attempt = PERSON_DOORS[door](alice, call, fingerprint=seen)
    assert attempt.code is not None, f"{door} decided on arguments nobody saw"
    assert call.still_waiting and call.completing_decisions() == 0 and EXECUTED == []


def test_a_stale_link_does_not_approve_the_next_call_its_supervisor_surfaces():
    """The issue's scenario: a sub-agent surfaces refund SMALL; a reviewer's link for it stays unused;
    SMALL is approved elsewhere; the same supervisor call then surfaces refund HUGE. The old link is
    bound to SMALL's suspension and arguments: it decides nothing."""
    alice, bob = person("alice"), person("bob")
    for user in (alice, bob):
        user.groups.add(Group.objects.get_or_create(name="Support reviewers")[0])
    small, huge = {"orderId": "small", "amount": 1.0}, {"orderId": "huge", "amount": 99999}
    message = "\n".join([tool_line("refund", small), tool_line("refund", huge)])
    stream, _ = async_to_sync(start)("support-supervisor", tool_line("agent-billing-agent", {"message": message}))
    outer = SuspendedToolCall.objects.get(run_id=stream.run_id, status="open")
    url = links.create(alice, outer)
    small_seen = shown_fingerprint(outer)
    assert by_dashboard(bob, Waiting(stream.run_id, outer.tool_call_id, small_seen)).code is None
    wait_rested(stream.run_id)
    outer.refresh_from_db()
    assert outer.status == "open" and outer.suspension == 1  # HUGE surfaced on the same call
    response = Client().post(urlsplit(url).path, {"action": "approve"})
    assert response.status_code in (409, 410) and "Approved" not in response.content.decode()
    outer.refresh_from_db()
    assert outer.status == "open"
    inner = SuspendedToolCall.objects.get(run__parent_run_id=stream.run_id, status="open")
    assert inner.args == {"orderId": "huge", "amount": 99999.0}


# --- two people -------------------------------------------------------------------------------------
@pytest.mark.parametrize("door", list(PERSON_DOORS))
def test_a_call_that_needs_two_approvals_runs_after_two_distinct_people(door):
    alice, bob = person("alice"), person("bob")
    call = waiting("pay", {"amount": 40})
    assert PERSON_DOORS[door](alice, call).code is None
    assert call.still_waiting and EXECUTED == []
    listed = async_to_sync(get_listing)(call)
    assert listed["approvals"]["required"] == 2 and [g["decidedBy"] for g in listed["approvals"]["given"]] == ["alice"]
    again = PERSON_DOORS[door](alice, call)
    assert again.code is not None and call.still_waiting and EXECUTED == []
    if door in ("rest", "batch", "websocket", "mastra", "python"):
        assert again.code == "ALREADY_APPROVED"
    assert PERSON_DOORS[door](bob, call).code is None
    wait_rested(call.run_id)
    assert EXECUTED == [("pay", 40)]
    approvals = Decision.objects.filter(run_id=call.run_id).order_by("decided_at")
    assert [(d.decided_by_username, d.completes) for d in approvals] == [("alice", False), ("bob", True)]


async def get_listing(call: Waiting) -> dict:
    from agentrun import get_agent

    page = await get_agent(AGENT).list_suspended_runs()
    [run] = [r for r in page.runs if r.run_id == call.run_id]
    return run.tool_calls[0].to_dict()


def test_an_edit_starts_the_count_again_and_one_decline_ends_it():
    alice, bob, carol = person("alice"), person("bob"), person("carol")
    call = waiting("pay", {"amount": 40})
    assert by_rest(alice, call).code is None
    assert by_rest(bob, call, extra={"args": {"amount": 30}}).code is None  # bob's edit: 1 of 2 again
    assert call.still_waiting and EXECUTED == []
    assert by_rest(carol, call).code == "ARGS_CHANGED"  # carol saw 40, the call now shows 30
    edited = Waiting(call.run_id, call.tool_call_id, shown_fingerprint(call.call))
    assert by_rest(alice, edited).code is None  # alice approves the edit: two people on 30
    wait_rested(call.run_id)
    assert EXECUTED == [("pay", 30)]

    declined = waiting("pay", {"amount": 5})
    assert by_rest(alice, declined).code is None

    url = f"/api/agents/{AGENT}/runs/{declined.run_id}/decline"
    assert _code(_api(bob).post(url, {"toolCallId": declined.tool_call_id}, format="json")) is None
    wait_rested(declined.run_id)
    assert not declined.still_waiting and EXECUTED == [("pay", 30)]


def test_the_runs_starter_does_not_count_when_self_approval_is_off(settings):
    settings.AGENTRUN_SELF_APPROVAL = False
    alice, bob = person("alice"), person("bob")

    body = {"messages": tool_line("note", {"text": "x"})}
    run_id = _api(alice).post(f"/api/agents/{AGENT}/generate", body, format="json").json()["runId"]
    assert Run.objects.get(pk=run_id).started_by_username == "alice"
    call_row = SuspendedToolCall.objects.get(run_id=run_id)
    call = Waiting(run_id, call_row.tool_call_id, shown_fingerprint(call_row))
    assert by_rest(alice, call).code == "PERMISSION_DENIED" and call.still_waiting
    assert by_rest(bob, call).code is None


# --- scope ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("door", list(PERSON_DOORS))
def test_someone_outside_the_agents_reviewers_decides_nothing(door):
    outsider = person("otto", vault=False)
    call = waiting("note", {"text": "hi"})
    assert PERSON_DOORS[door](outsider, call).code is not None
    assert call.still_waiting and call.completing_decisions() == 0 and EXECUTED == []


# --- grants -----------------------------------------------------------------------------------------
def _grant(user: User, tool_name: str, thread: str, **fields: Any) -> StandingGrant:
    return StandingGrant.objects.create(
        agent_id=AGENT, tool_name=tool_name, scope="thread", scope_id=thread, created_by=user, **fields
    )


def test_a_grant_covers_a_medium_call_but_never_a_high_risk_or_quorum_one():
    alice = person("alice")
    for tool_name in ("note", "wipe", "pay"):
        _grant(alice, tool_name, "t-granted", expires_at=timezone.now() + timedelta(days=1))
    async_to_sync(start)(AGENT, tool_line("note", {"text": "a"}), thread="t-granted")
    async_to_sync(start)(AGENT, tool_line("wipe", {"target": "b"}), thread="t-granted")
    async_to_sync(start)(AGENT, tool_line("pay", {"amount": 1}), thread="t-granted")
    assert EXECUTED == [("note", "a")]
    assert SuspendedToolCall.objects.filter(status="open").count() == 2


@pytest.mark.parametrize("how", ["left the reviewers", "deactivated"])
def test_a_grant_stops_working_when_its_creator_may_no_longer_decide(how):
    alice = person("alice")
    grant = _grant(alice, "note", "t-trust", expires_at=timezone.now() + timedelta(days=1))
    async_to_sync(start)(AGENT, tool_line("note", {"text": "1"}), thread="t-trust")
    assert EXECUTED == [("note", "1")]
    if how == "deactivated":
        alice.is_active = False
        alice.save()
        assert StandingGrant.objects.get(pk=grant.pk).revoked_at is not None
    else:
        alice.groups.remove(Group.objects.get(name="Vault reviewers"))
    async_to_sync(start)(AGENT, tool_line("note", {"text": "2"}), thread="t-trust")
    assert EXECUTED == [("note", "1")]


@pytest.mark.parametrize("door", ["dashboard", "admin"])
def test_only_a_person_who_may_decide_makes_a_grant_and_never_a_forever_one(door, settings):
    outsider = person("otto", vault=False)
    outsider.is_staff = True
    outsider.save()
    from django.contrib.auth.models import Permission

    outsider.user_permissions.add(Permission.objects.get(codename="add_standinggrant"))
    alice = person("alice")
    alice.is_staff = True
    alice.save()
    alice.user_permissions.add(Permission.objects.get(codename="add_standinggrant"))
    call = waiting("note", {"text": "x"}, thread="t-door-grant")
    if door == "dashboard":
        form = {"run_id": call.run_id, "tool_call_id": call.tool_call_id, "scope": "thread", "expires_in": ""}
        refused = _browser(outsider).post("/approvals/grants/new", form | {"args_fingerprint": call.fingerprint})
        assert refused.status_code == 403
        too_long = form | {"expires_in": str(365 * 86400), "args_fingerprint": call.fingerprint}
        assert _browser(alice).post("/approvals/grants/new", too_long).status_code == 302
        assert not StandingGrant.objects.exists() and call.still_waiting
        ok = _browser(alice).post("/approvals/grants/new", form | {"args_fingerprint": call.fingerprint})
        assert ok.status_code == 302
    else:
        form = {"agent_id": AGENT, "tool_name": "note", "scope": "thread", "scope_id": "t-door-grant"}
        refused = _browser(outsider).post("/admin/agentrun/standinggrant/add/", form)
        assert refused.status_code == 200 and not StandingGrant.objects.exists()
        high = _browser(alice).post("/admin/agentrun/standinggrant/add/", form | {"tool_name": "wipe"})
        assert high.status_code == 200 and "never approves it" in high.content.decode()
        assert _browser(alice).post("/admin/agentrun/standinggrant/add/", form).status_code == 302
    grant = StandingGrant.objects.get()
    assert grant.created_by_username == "alice"
    assert timezone.now() + timedelta(days=29) < grant.expires_at <= timezone.now() + timedelta(days=31)


# --- timeout policies ------------------------------------------------------------------------------------
def test_a_timeout_never_approves_a_high_risk_or_quorum_call():
    with pytest.raises(ValueError, match="high"):
        tool(id="t1", requires_approval=True, risk="high", approval_timeout=60, on_timeout="approve")(_noop)
    with pytest.raises(ValueError, match="approvals_required"):
        tool(id="t2", requires_approval=True, approvals_required=2, approval_timeout=60, on_timeout="approve")(_noop)


async def _noop() -> dict:
    return {}


def test_a_timeout_policy_declines_through_the_same_service():
    @tool(id="slow", requires_approval=True, risk="high", approval_timeout=60, on_timeout="decline")
    async def slow() -> dict:
        EXECUTED.append(("slow", None))
        return {}

    Agent(id="slow-agent", tools=[slow])
    stream, _ = async_to_sync(start)("slow-agent", tool_line("slow", {}))
    SuspendedToolCall.objects.filter(run_id=stream.run_id).update(timeout_at=timezone.now() - timedelta(seconds=1))
    assert apply_due_timeouts() == 1
    wait_rested(stream.run_id)
    decision = Decision.objects.get(run_id=stream.run_id)
    assert (decision.kind, decision.via, decision.args_fingerprint) == ("decline", "policy", args_fingerprint({}))
    assert EXECUTED == []


def test_refused_attempts_leave_no_trace_in_the_audit_trail():
    alice = person("alice")
    call = waiting("wipe", {"target": "prod"})
    for door in ("rest", "batch", "websocket", "mastra", "dashboard", "admin"):
        PERSON_DOORS[door](alice, call, fingerprint=None)
    assert not Decision.objects.exists() and json.dumps(EXECUTED) == "[]"

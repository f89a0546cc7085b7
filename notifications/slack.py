"""Deciding from Slack (docs/slack.md): interactive messages, verified clicks, people linked to accounts.

- **Messages.** A ``run.suspended`` event becomes one ``SlackMessage`` per waiting approval call and
  subscribed ``SlackDestination`` (``create_deliveries``, in the transaction that takes the event), and
  a ``post`` delivery: ``chat.postMessage`` through the task queue, retried like a webhook. Every later
  event about the call (``toolcall.decided``, ``approval.given``, the run's end) becomes an ``update``
  delivery (``chat.update``). A message is always built from the call's state *when it is sent*
  (``blocks``), so updates that arrive out of order still converge on the truth.
- **Clicks.** A button's ``value`` is a signed reference to its message (``button_value``); the message
  row binds the call, its suspension and the fingerprint of the arguments it showed. ``decide`` hands
  the decision service one ``DecisionCommand`` carrying all three, as the linked person (``via``
  slack, with the Slack user and team ids in the decision's details): a stale button, a second click,
  someone outside the agent's reviewers all decide nothing, by the service's own rules.
- **People.** ``link_code`` (shown on /approvals/settings/) is a signed, expiring code; ``/agentrun link
  <code>`` typed by a Slack user links them (``SlackIdentity``) to the code's account (``link``).
- **Signatures.** ``verify`` checks Slack's v0 signature of a request (HMAC-SHA256 of
  ``v0:<timestamp>:<body>`` with ``AGENTRUN_SLACK_SIGNING_SECRET``), its age, and that it was not seen
  before.

Web API calls go to ``AGENTRUN_SLACK_API_URL`` through ``notifications.egress`` (no redirects, no proxy,
generic failure reasons); a click's ``response_url`` is used only on Slack's hooks host or that URL's host.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core import signing
from django.core.cache import cache
from django.db import transaction
from django.tasks import task
from django.urls import reverse
from django.utils import timezone

from agentrun.core import access, secretbox
from agentrun.core.models import Decision, OutboxEvent, Run, SuspendedToolCall
from agentrun.core.outbox import APPROVAL_GIVEN, FINAL_STATUS_OF, RUN_SUSPENDED, TOOLCALL_DECIDED
from agentrun.engine import service
from agentrun.engine.decisions import AUTOMATIC_DECIDERS, shown_fingerprint
from agentrun.engine.service import Decider, DecisionCommand, DecisionOutcome
from approvals.public import open_call_views, thread_path
from notifications import egress
from notifications.models import SlackDelivery, SlackDestination, SlackIdentity, SlackMessage
from notifications.payloads import escape, public_url

logger = logging.getLogger("agentrun.notifications.slack")

QUEUE = "notifications"
USER_AGENT = "agentrun-slack/1"
SLACK_HOOKS_HOST = "hooks.slack.com"
MAX_AGE_SECONDS = 300  # a request signed longer ago than this is refused (Slack's own advice)
LINK_CODE_MAX_AGE = 600  # a link code works for ten minutes, once
VALUE_SALT = "agentrun.notifications.slack-button"
CODE_SALT = "agentrun.notifications.slack-link-code"
APPROVE, DECLINE = "agentrun_approve", "agentrun_decline"  # the buttons' action_id
CONFIRM_VIEW, DECLINE_VIEW = "agentrun_confirm", "agentrun_decline"  # the modals' callback_id
REASON_BLOCK, REASON_INPUT = "reason", "reason_input"
ARGS_IN_MESSAGE = 1500  # characters of arguments a channel message shows; the modal shows them all
MODAL_CHUNK = 2800  # characters per section of the confirmation modal (Slack's limit is 3000)
MODAL_CHUNKS = 40  # at most this many sections of arguments (Slack's limit is 100 blocks)
READ_LIMIT = 65536
# The events a message is posted or updated on (docs/slack.md "What the message shows").
SLACK_EVENTS = (RUN_SUSPENDED, TOOLCALL_DECIDED, APPROVAL_GIVEN, *FINAL_STATUS_OF)


# --- signatures ------------------------------------------------------------------------------------
def signature_of(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's v0 signature: ``v0=`` + hex HMAC-SHA256 of ``v0:<timestamp>:<body>``."""
    return "v0=" + hmac.new(secret.encode(), f"v0:{timestamp}:".encode() + body, hashlib.sha256).hexdigest()


def verify(*, body: bytes, timestamp: str | None, signature: str | None) -> str | None:
    """Why a request that claims to come from Slack is refused, or None: it is Slack's, recent, and new.

    A replay (the same signature again, within the five minutes a signature is accepted) is refused:
    each signature is remembered (in the cache) for longer than it could be accepted."""
    secret = settings.AGENTRUN_SLACK_SIGNING_SECRET
    if not secret:
        return "Slack is not configured (AGENTRUN_SLACK_SIGNING_SECRET)"
    if not timestamp or not timestamp.isdigit() or not signature:
        return "unsigned request"
    if abs(time.time() - int(timestamp)) > MAX_AGE_SECONDS:
        return "stale request"
    if not hmac.compare_digest(signature_of(secret, timestamp, body).encode(), signature.encode("utf-8", "replace")):
        return "bad signature"
    if not cache.add(f"agentrun:slack-seen:{hashlib.sha256(signature.encode()).hexdigest()}", 1, 2 * MAX_AGE_SECONDS):
        return "replayed request"
    return None


# --- people ----------------------------------------------------------------------------------------
def link_code(user: Any) -> str:
    """A code that links whoever types it into ``/agentrun link`` to ``user``: signed, for ten minutes."""
    return signing.TimestampSigner(salt=CODE_SALT).sign(str(user.pk))


def settings_url() -> str:
    return public_url(reverse("notifications:settings"))


def link(*, code: str, team_id: str, slack_user_id: str) -> tuple[Any | None, str]:
    """Link a Slack user to the account ``code`` names. Returns (the user, what to tell them)."""
    from django.contrib.auth import get_user_model

    try:
        user_pk = signing.TimestampSigner(salt=CODE_SALT).unsign(code.strip(), max_age=LINK_CODE_MAX_AGE)
    except signing.SignatureExpired:
        return None, f"That link code has expired. Get a new one at {settings_url()}"
    except signing.BadSignature:
        return None, f"That is not a link code. Copy yours from {settings_url()}"
    user = get_user_model().objects.filter(pk=user_pk, is_active=True).first()
    if user is None:
        return None, "That link code's account no longer exists."
    if not cache.add(f"agentrun:slack-code:{hashlib.sha256(code.strip().encode()).hexdigest()}", 1, LINK_CODE_MAX_AGE):
        return None, f"That link code was used already. Get a new one at {settings_url()}"
    SlackIdentity.objects.update_or_create(team_id=team_id, slack_user_id=slack_user_id, defaults={"user": user})
    return user, f"Linked: your Slack decisions are now {escape(user.get_username())}'s in agentrun."


def linked_user(team_id: str, slack_user_id: str) -> Any | None:
    identity = SlackIdentity.objects.select_related("user").filter(team_id=team_id, slack_user_id=slack_user_id).first()
    return identity.user if identity is not None and identity.user.is_active else None


# --- buttons ---------------------------------------------------------------------------------------
def button_value(message: SlackMessage) -> str:
    """What the message's buttons carry: its id, signed (opaque to Slack, unforgeable)."""
    return signing.dumps(message.id, salt=VALUE_SALT)


def message_for(value: str) -> SlackMessage | None:
    try:
        message_id = signing.loads(value, salt=VALUE_SALT)
    except signing.BadSignature:
        return None
    if not isinstance(message_id, str):
        return None
    return SlackMessage.objects.select_related("destination").filter(pk=message_id).first()


def decide(
    message: SlackMessage, *, user: Any, kind: str, reason: str | None, slack_user_id: str, team_id: str
) -> DecisionOutcome:
    """Approve or decline the message's call as ``user``, bound to what the message showed (its call,
    suspension and arguments). Raises the decision service's ``AgentRunError`` when it decides nothing."""
    command = DecisionCommand.one(
        agent_id=message.agent_id,
        run_id=message.run_id,
        tool_call_id=message.tool_call_id,
        kind=kind,
        reason=reason,
        args_fingerprint=message.args_fingerprint,
        suspension=message.suspension,
        decider=Decider.person(
            user, via=Decision.Via.SLACK, details={"slack": {"userId": slack_user_id, "teamId": team_id}}
        ),
    )
    return service.decide(command)


# --- what a message shows ------------------------------------------------------------------------------
def _plain(text: str, limit: int = 75) -> dict:
    return {"type": "plain_text", "text": text[:limit], "emoji": True}


def _mrkdwn(text: str) -> dict:
    return {"type": "mrkdwn", "text": text}


def _args_text(args: Any) -> str:
    """The arguments as JSON, escaped for mrkdwn: inside ``` Slack still reads &, < and >, so escaped
    the arguments cannot ping or forge a link (and cannot close the code block)."""
    text = json.dumps(args, ensure_ascii=False, indent=2, sort_keys=True)
    return escape(text).replace("```", "`\u200b``")


def _cut(text: str, limit: int) -> str:
    """At most ``limit`` characters of escaped text, never ending inside an entity (``&amp;``)."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    amp = cut.rfind("&")
    if amp > limit - 5 and ";" not in cut[amp:]:
        cut = cut[:amp]
    return cut


def _chunks(text: str, size: int) -> list[str]:
    chunks = []
    while text:
        chunks.append(_cut(text, size))
        text = text[len(chunks[-1]) :]
    return chunks or [""]


def _code(text: str) -> str:
    return "```" + text + "```"


def state(message: SlackMessage) -> tuple[Decision | None, str | None, list[Decision]]:
    """(the decision that took the call, the run's final status if the call ended without one, the
    approvals given so far towards a quorum)."""
    decisions = list(
        Decision.objects.filter(
            run_id=message.run_id, tool_call_id=message.tool_call_id, suspension=message.suspension
        ).order_by("decided_at", "id")
    )
    final = next((d for d in decisions if d.completes), None)
    given = [d for d in decisions if not d.completes and d.approved_fingerprint == message.args_fingerprint]
    ended = None
    if final is None:
        run = Run.objects.filter(pk=message.run_id).only("status").first()
        waiting = SuspendedToolCall.objects.filter(
            run_id=message.run_id,
            tool_call_id=message.tool_call_id,
            suspension=message.suspension,
            status=SuspendedToolCall.Status.OPEN,
        ).exists()
        if run is None or not waiting:
            ended = run.status if run is not None else "removed"
    return final, ended, given


def outcome_line(decision: Decision) -> str:
    """ "Approved by alice (via slack) at …": who decided, how, when; the reason if declined."""
    icon = {"approve": ":white_check_mark:", "decline": ":no_entry:", "expire": ":hourglass:"}.get(decision.kind, "")
    verb = {"approve": "Approved", "decline": "Declined", "resume": "Resumed", "expire": "Expired"}[decision.kind]
    who = decision.decided_by_username or AUTOMATIC_DECIDERS.get(Decision.Via(decision.via), "someone")
    stamp, fallback = int(decision.decided_at.timestamp()), f"{decision.decided_at:%Y-%m-%d %H:%M} UTC"
    when = f"<!date^{stamp}^{{date_short_pretty}} {{time}}|{fallback}>"  # shown in the reader's time zone
    line = f"{icon} *{verb}* by {escape(who)} (via {decision.via}) {when}"
    if decision.reason and decision.kind == "decline":
        line += f": {_cut(escape(decision.reason), 1000)}"
    return line


def blocks(message: SlackMessage, *, value: str | None = None) -> tuple[str, list[dict]]:
    """The message as it should look now: (fallback text, Block Kit blocks). Buttons only while the
    call waits on what the message shows."""
    call = message.call
    final, ended, given = state(message)
    tool = call["tool"]
    risk = call.get("risk") or "medium"
    risk_icon = {"high": ":red_circle:", "medium": ":large_orange_circle:", "low": ":white_circle:"}.get(risk, "")
    # The fallback text (notifications, screen readers) is mrkdwn too: escaped like the blocks.
    text = f"{escape(message.agent_id)} waits for a decision on {escape(tool)} (risk {risk})"
    card = public_url(thread_path(message.thread_id))
    fields = [
        _mrkdwn(f"*Agent*\n{escape(message.agent_id)}"),
        _mrkdwn(f"*Tool*\n`{escape(tool)}`"),
        _mrkdwn(f"*Risk*\n{risk_icon} {risk}"),
        _mrkdwn(f"*Thread*\n<{card}|{escape(message.thread_id[:200])}>"),
    ]
    if call.get("resourceId"):
        fields.append(_mrkdwn(f"*Resource*\n{escape(str(call['resourceId'])[:200])}"))
    args = _args_text(call.get("args"))
    shown = args if len(args) <= ARGS_IN_MESSAGE else _cut(args, ARGS_IN_MESSAGE) + "\n…"
    result: list[dict] = [
        {
            "type": "section",
            "text": _mrkdwn(f":hourglass_flowing_sand: *{escape(message.agent_id)}* waits for a decision"),
        },
        {"type": "section", "fields": fields},
        {"type": "section", "text": _mrkdwn("*Arguments*\n" + _code(shown))},
    ]
    if len(args) > ARGS_IN_MESSAGE:
        result.append(
            {"type": "context", "elements": [_mrkdwn(f"Arguments truncated: <{card}|see them all in agentrun>")]}
        )
    if call.get("reason"):
        result.append({"type": "section", "text": _mrkdwn("*Why*\n" + _cut(escape(call["reason"]), 1500))})
    required = call.get("approvalsRequired") or 1
    if required > 1:
        names = ", ".join(escape(d.decided_by_username or "someone") for d in given) or "none yet"
        result.append({"type": "context", "elements": [_mrkdwn(f"Approvals: {len(given)} of {required} ({names})")]})
    if final is not None:
        result.append({"type": "context", "elements": [_mrkdwn(outcome_line(final))]})
        text = f"{escape(tool)}: {final.kind} by {escape(final.decided_by_username or final.via)} (via {final.via})"
    elif ended is not None:
        result.append(
            {"type": "context", "elements": [_mrkdwn(f":heavy_minus_sign: No longer waits (the run is {ended}).")]}
        )
        text = f"{escape(tool)}: no longer waits (run {ended})"
    else:
        value = value or button_value(message)
        approve: dict[str, Any] = {
            "type": "button",
            "action_id": APPROVE,
            "text": _plain("Approve…" if risk == "high" else "Approve"),
            "style": "primary",
            "value": value,
        }
        result.append(
            {
                "type": "actions",
                "block_id": "agentrun_decide",
                "elements": [
                    approve,
                    {
                        "type": "button",
                        "action_id": DECLINE,
                        "text": _plain("Decline…"),
                        "style": "danger",
                        "value": value,
                    },
                    {"type": "button", "action_id": "agentrun_open", "text": _plain("Edit in agentrun"), "url": card},
                ],
            }
        )
    return text, result


def confirm_view(message: SlackMessage, private_metadata: str) -> dict:
    """The modal a high-risk Approve opens: every argument, and a confirm button (none when they are too
    long to show in Slack: then they are approved on the dashboard, where they are shown)."""
    chunks = _chunks(_args_text(message.call.get("args")), MODAL_CHUNK)
    card = public_url(thread_path(message.thread_id))
    head = [
        {
            "type": "section",
            "text": _mrkdwn(
                f":warning: *High risk.* Approve `{escape(message.call['tool'])}` of *{escape(message.agent_id)}* "
                "with exactly these arguments?"
            ),
        }
    ]
    view: dict[str, Any] = {
        "type": "modal",
        "callback_id": CONFIRM_VIEW,
        "private_metadata": private_metadata,
        "title": _plain("Approve high-risk call", 24),
        "close": _plain("Cancel", 24),
    }
    if len(chunks) > MODAL_CHUNKS:
        view["blocks"] = [
            {
                "type": "section",
                "text": _mrkdwn(
                    f"These arguments are too long to show in Slack: <{card}|review and approve them in agentrun>."
                ),
            },
        ]
        return view
    view["blocks"] = head + [{"type": "section", "text": _mrkdwn(_code(chunk))} for chunk in chunks]
    view["submit"] = _plain("Approve", 24)
    return view


def decline_view(message: SlackMessage, private_metadata: str) -> dict:
    return {
        "type": "modal",
        "callback_id": DECLINE_VIEW,
        "private_metadata": private_metadata,
        "title": _plain("Decline call", 24),
        "submit": _plain("Decline", 24),
        "close": _plain("Cancel", 24),
        "blocks": [
            {
                "type": "section",
                "text": _mrkdwn(f"Decline `{escape(message.call['tool'])}` of *{escape(message.agent_id)}*?"),
            },
            {
                "type": "input",
                "block_id": REASON_BLOCK,
                "optional": True,
                "label": _plain("Reason (the agent reads it)"),
                "element": {
                    "type": "plain_text_input",
                    "action_id": REASON_INPUT,
                    "multiline": True,
                    "max_length": 2000,
                },
            },
        ],
    }


def notice_view(text: str) -> dict:
    """A modal that only says something (what became of a submission that decided nothing)."""
    return {
        "type": "modal",
        "title": _plain("agentrun", 24),
        "close": _plain("Close", 24),
        "blocks": [{"type": "section", "text": _mrkdwn(text)}],
    }


# --- Slack's Web API -----------------------------------------------------------------------------------
def _api_host() -> str:
    return (urlsplit(settings.AGENTRUN_SLACK_API_URL).hostname or "").lower()


def response_url_allowed(url: str) -> bool:
    """A click's ``response_url`` is used only on Slack's hooks host (https) or the Web API's host."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    host = (parts.hostname or "").lower()
    if host == SLACK_HOOKS_HOST:
        return parts.scheme == "https"
    return bool(host) and host == _api_host() and parts.scheme in ("http", "https")


def _post_json(url: str, payload: dict, headers: dict[str, str], *, timeout: float) -> egress.Outcome:
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json; charset=utf-8", "User-Agent": USER_AGENT, **headers}
    # The Web API's host is the operator's setting, not a user's choice: reachable even when private.
    trusted = (urlsplit(url).hostname or "").lower() == _api_host()
    return egress.post(
        url, body, headers, timeout=timeout, read_limit=READ_LIMIT, allow_private=True if trusted else None
    )


def web_api(method: str, token: str, payload: dict, *, timeout: float | None = None) -> tuple[egress.Outcome, dict]:
    """Call a Web API method; (the outcome — an ``ok: false`` answer is an error, named by Slack's
    error code — and the answer)."""
    url = f"{settings.AGENTRUN_SLACK_API_URL}/{method}"
    outcome = _post_json(
        url, payload, {"Authorization": f"Bearer {token}"}, timeout=timeout or settings.AGENTRUN_WEBHOOK_TIMEOUT_SECONDS
    )
    if outcome.error is not None:
        return outcome, {}
    try:
        answer = json.loads(outcome.body)
    except ValueError:
        return egress.Outcome(outcome.status, "invalid answer"), {}
    if not isinstance(answer, dict) or answer.get("ok") is not True:
        code = str(answer.get("error", "")) if isinstance(answer, dict) else ""
        return egress.Outcome(
            outcome.status, f"slack: {code}" if re.fullmatch(r"[a-z_]{1,64}", code) else "slack: error"
        ), {}
    return outcome, answer


# --- deliveries (the task queue) ------------------------------------------------------------------------
def recipients(agent_id: str) -> list[SlackDestination]:
    """Active destinations that want this agent, whose owner may view it (as webhook endpoints)."""
    destinations = SlackDestination.objects.filter(active=True, owner__isnull=False).select_related("owner")
    return [d for d in destinations if d.subscribes(agent_id) and access.can_view_agent(d.owner, agent_id)]


def _messages_for_suspension(event: OutboxEvent) -> list[SlackMessage]:
    """A message per destination and per approval call the event lists that still waits."""
    destinations = recipients(event.agent_id)
    if not destinations:
        return []
    listed = [c["toolCallId"] for c in event.data.get("toolCalls", []) if c.get("requiresApproval")]
    calls = list(
        SuspendedToolCall.objects.select_related("run").filter(
            run_id=event.run_id, tool_call_id__in=listed, status=SuspendedToolCall.Status.OPEN
        )
    )
    # A sub-agent's calls are surfaced, one at a time, on its supervisor's call, and shown (and decided)
    # there (docs/runs.md#sub-agents): one message per thing to decide.
    return show([c for c in calls if c.run.parent_run_id is None], destinations, event=event)


def show(
    calls: list[SuspendedToolCall], destinations: list[SlackDestination], *, event: OutboxEvent | None = None
) -> list[SlackMessage]:
    """The message about each open call (its run selected) in each destination, made once: bound to the
    call's current suspension and to the fingerprint of the arguments it shows."""
    messages = []
    for view in open_call_views(calls):
        call = view.call
        inner = call.inner_agent_id
        shown = {
            "tool": f"{inner} → {view.inner_tool_name}" if inner else call.tool_name,
            "args": view.args,
            "risk": call.risk,
            "reason": view.reason,
            "approvalsRequired": call.approvals_required,
            "resourceId": call.run.resource_id,
        }
        for destination in destinations:
            message, _ = SlackMessage.objects.get_or_create(
                destination=destination,
                run_id=call.run_id,
                tool_call_id=call.tool_call_id,
                suspension=call.suspension,
                defaults={
                    "event": event,
                    "agent_id": call.run.agent_id,
                    "thread_id": call.run.thread_id,
                    "args_fingerprint": shown_fingerprint(call),
                    "call": shown,
                },
            )
            messages.append(message)
    return messages


def create_deliveries(event: OutboxEvent, *, destinations: bool = True) -> list[str]:
    """In the transaction that takes ``event``: the Slack deliveries it causes. Returns their ids.
    ``destinations``: whether any destination is active (the listener's in-memory view): without one,
    no query is made (a deactivated destination's messages are no longer updated)."""
    if event.type not in SLACK_EVENTS or not destinations:
        return []
    if event.type == RUN_SUSPENDED:
        messages, action = _messages_for_suspension(event), SlackDelivery.Action.POST
    else:
        found = SlackMessage.objects.filter(run_id=event.run_id)
        if event.type in (TOOLCALL_DECIDED, APPROVAL_GIVEN):
            found = found.filter(tool_call_id=event.data.get("toolCallId"))
        messages, action = list(found), SlackDelivery.Action.UPDATE
    if not messages:
        return []
    now = timezone.now()
    SlackDelivery.objects.bulk_create(
        [SlackDelivery(message=m, event=event, action=action, next_attempt_at=now) for m in messages],
        ignore_conflicts=True,
    )
    return list(SlackDelivery.objects.filter(event=event).values_list("id", flat=True))


def respond(message: SlackMessage, response_url: str | None, body: dict) -> None:
    """Answer a click at its ``response_url`` (through the queue, retried), if the URL may be used."""
    if not response_url or not response_url_allowed(response_url):
        logger.warning("Slack: a response_url outside docs/slack.md's host rule was not used")
        return
    delivery = SlackDelivery.objects.create(
        message=message,
        action=SlackDelivery.Action.RESPOND,
        url=response_url,
        body=body,
        next_attempt_at=timezone.now(),
    )
    transaction.on_commit(lambda: attempt_slack.enqueue(delivery.pk))


def ephemeral(text: str) -> dict:
    return {"response_type": "ephemeral", "replace_original": False, "text": text}


def _attempt(delivery: SlackDelivery) -> egress.Outcome:
    message = delivery.message
    if delivery.action == SlackDelivery.Action.RESPOND:
        outcome = _post_json(
            delivery.url or "", delivery.body or {}, {}, timeout=settings.AGENTRUN_WEBHOOK_TIMEOUT_SECONDS
        )
        return egress.Outcome(outcome.status, outcome.error)
    try:
        token = message.destination.bot_token
    except secretbox.UnreadableSecret:
        logger.error("Slack destination %s: its bot token cannot be decrypted", message.destination_id)
        return egress.Outcome(None, "token unreadable")
    text, content = blocks(message)
    if delivery.action == SlackDelivery.Action.POST:
        if message.ts:
            return egress.Outcome(200, None)  # posted already (a duplicate task)
        payload = {"channel": message.destination.channel, "text": text, "blocks": content, "unfurl_links": False}
        outcome, answer = web_api("chat.postMessage", token, payload)
        if outcome.error is None:
            SlackMessage.objects.filter(pk=message.pk).update(channel_id=answer.get("channel"), ts=answer.get("ts"))
        return outcome
    if not message.ts:
        posting = message.deliveries.filter(action=SlackDelivery.Action.POST, status=SlackDelivery.Status.PENDING)
        # Posted after this update was queued: the post shows the state it finds, the update waits for it.
        return egress.Outcome(None, "not posted yet" if posting.exists() else "never posted")
    channel = message.channel_id or message.destination.channel
    payload = {"channel": channel, "ts": message.ts, "text": text, "blocks": content}
    outcome, _ = web_api("chat.update", token, payload)
    return outcome


def _record(delivery: SlackDelivery, outcome: egress.Outcome) -> None:
    from notifications.delivery import backoff

    now = timezone.now()
    fields: dict[str, Any] = {
        "attempts": delivery.attempts + 1,
        "response_status": outcome.status,
        "last_error": outcome.error,
        "last_attempt_at": now,
    }
    if outcome.error is None:
        fields |= {"status": SlackDelivery.Status.DELIVERED, "delivered_at": now, "next_attempt_at": None}
    elif outcome.error == "never posted" or fields["attempts"] >= settings.AGENTRUN_WEBHOOK_MAX_ATTEMPTS:
        fields |= {"status": SlackDelivery.Status.FAILED, "next_attempt_at": None}
    else:
        fields["next_attempt_at"] = now + backoff(fields["attempts"])
    with transaction.atomic():
        if not SlackDelivery.objects.filter(pk=delivery.pk).update(**fields):
            return
        if fields["next_attempt_at"] is not None:
            attempt_slack.using(run_after=fields["next_attempt_at"]).enqueue(delivery.pk)
    if outcome.error is not None:
        logger.info(
            "Slack %s of %s failed (attempt %d): %s",
            delivery.action,
            delivery.message_id,
            fields["attempts"],
            outcome.error,
        )


@task(queue_name=QUEUE)
def attempt_slack(delivery_id: str) -> bool:
    """One attempt at a due Slack delivery, if this task claims it (as ``delivery.attempt_delivery``)."""
    from notifications.delivery import _claim_until

    claimed = SlackDelivery.objects.filter(
        pk=delivery_id, status=SlackDelivery.Status.PENDING, next_attempt_at__lte=timezone.now()
    ).update(next_attempt_at=_claim_until())
    if not claimed:
        return False
    delivery = SlackDelivery.objects.select_related("message__destination").filter(pk=delivery_id).first()
    if delivery is None:
        return False
    outcome = _attempt(delivery)
    _record(delivery, outcome)
    return outcome.error is None


def resend(delivery_ids: list[str]) -> int:
    count = SlackDelivery.objects.filter(pk__in=delivery_ids).update(
        status=SlackDelivery.Status.PENDING, next_attempt_at=timezone.now()
    )
    for delivery_id in delivery_ids:
        attempt_slack.enqueue(delivery_id)
    return count


def overdue(before: Any, limit: int) -> list[str]:
    due = SlackDelivery.objects.filter(status=SlackDelivery.Status.PENDING, next_attempt_at__lte=before)
    return list(due.order_by("next_attempt_at").values_list("id", flat=True)[:limit])


def any_destination(destinations: list[SlackDestination], type_: str, agent_id: str) -> bool:
    return type_ in SLACK_EVENTS and any(d.subscribes(agent_id) for d in destinations)

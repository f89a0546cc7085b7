"""Slack's requests (docs/slack.md): ``POST /integrations/slack/actions`` (interactivity: buttons and
modals) and ``POST /integrations/slack/commands`` (the ``/agentrun`` slash command).

Both answer 401 and change nothing unless the request carries Slack's valid, recent, unseen v0
signature (``slack.verify``). They answer within Slack's three seconds: a click is decided in one
short transaction by the decision service; what Slack is told afterwards (the outcome, an
explanation) goes through the task queue (``slack.respond``). Only a modal is opened at once
(``views.open``): its ``trigger_id`` expires in three seconds.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agentrun.core import access, secretbox
from agentrun.core.errors import AgentRunError
from agentrun.core.models import Decision
from approvals.public import thread_path
from notifications import slack
from notifications.models import SlackIdentity, SlackMessage
from notifications.payloads import escape, public_url

VIEWS_OPEN_TIMEOUT = 2.5  # seconds: within Slack's three, with the time the request took to arrive
CLOSED_CODES = {"RUN_NOT_FOUND", "RUN_NOT_SUSPENDED", "TOOL_CALL_NOT_SUSPENDED"}


def _verified(request: HttpRequest) -> tuple[QueryDict | None, HttpResponse | None]:
    raw = request.body
    problem = slack.verify(
        body=raw,
        timestamp=request.headers.get("X-Slack-Request-Timestamp"),
        signature=request.headers.get("X-Slack-Signature"),
    )
    if problem is not None:
        return None, JsonResponse({"error": {"code": "UNAUTHENTICATED", "message": problem}}, status=401)
    try:
        return QueryDict(raw.decode("utf-8")), None
    except UnicodeDecodeError:
        return None, JsonResponse({"error": {"code": "INVALID_REQUEST", "message": "not UTF-8"}}, status=400)


def _ids(payload: dict) -> tuple[str, str]:
    """(team id, Slack user id) of whoever clicked."""
    user = payload.get("user") if isinstance(payload.get("user"), dict) else {}
    team = payload.get("team") if isinstance(payload.get("team"), dict) else {}
    return str(team.get("id") or user.get("team_id") or ""), str(user.get("id") or "")


def _card(message: SlackMessage) -> str:
    return public_url(thread_path(message.thread_id))


AUTOMATIC = {"policy": "a policy", "system": "the system"}


def closed_text(decision: Decision) -> str:
    who = decision.decided_by_username or AUTOMATIC.get(decision.via, "someone")
    return f"Already {decision.kind}d by {escape(who)} (via {decision.via}). Nothing changed."


def explanation(exc: AgentRunError, message: SlackMessage) -> str:
    """What a click that decided nothing is told (Slack mrkdwn)."""
    details = exc.details or {}
    if exc.code == "TOOL_CALL_ALREADY_DECIDED":
        who = details.get("decidedBy") or AUTOMATIC.get(details.get("via") or "", "someone")
        return f"Already {details.get('decision')}d by {escape(who)} (via {details.get('via')}). Nothing changed."
    if exc.code == "ARGS_CHANGED":
        return (
            "This message is out of date: the call waits on something else now. Nothing changed; "
            f"<{_card(message)}|review it in agentrun>."
        )
    if exc.code in CLOSED_CODES:
        return "This call no longer waits. Nothing changed."
    if exc.code == "ALREADY_APPROVED":
        return "You already approved these arguments: another person must approve too. Nothing changed."
    return f"{escape(exc.message)} Nothing changed."


def _decide_and_answer(
    message: SlackMessage,
    *,
    user: Any,
    kind: str,
    reason: str | None,
    team_id: str,
    slack_user_id: str,
    response_url: str | None,
) -> str | None:
    """Decide, and answer at ``response_url``; returns the explanation when nothing was decided."""
    try:
        slack.decide(message, user=user, kind=kind, reason=reason, slack_user_id=slack_user_id, team_id=team_id)
    except AgentRunError as exc:
        text = explanation(exc, message)
        slack.respond(message, response_url, slack.ephemeral(text))
        return text
    text, blocks = slack.blocks(message)
    slack.respond(message, response_url, {"replace_original": True, "text": text, "blocks": blocks})
    return None


def _person(message: SlackMessage, team_id: str, slack_user_id: str) -> tuple[Any | None, str | None]:
    """The agentrun user behind a Slack user, or why they decide nothing."""
    user = slack.linked_user(team_id, slack_user_id)
    if user is None:
        return None, (
            "Your Slack account is not linked to agentrun, so this decides nothing. Copy your link code from "
            f"{slack.settings_url()} and type `/agentrun link <code>` here."
        )
    if not access.can_decide_agent(user, message.agent_id):
        who = escape(user.get_username())
        return None, f"You ({who} in agentrun) may not decide calls of {escape(message.agent_id)}. Nothing changed."
    return user, None


@csrf_exempt
@require_POST
def actions(request: HttpRequest) -> HttpResponse:
    form, refused = _verified(request)
    if form is None:
        return refused  # type: ignore[return-value]
    try:
        payload = json.loads(form.get("payload", ""))
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        return JsonResponse({"error": {"code": "INVALID_REQUEST", "message": "no payload"}}, status=400)
    if payload.get("type") == "block_actions":
        return _on_button(payload)
    if payload.get("type") == "view_submission":
        return _on_submission(payload)
    return HttpResponse(status=200)  # other interactions (a link button, a closed modal): nothing to do


def _on_button(payload: dict) -> HttpResponse:
    actions_ = payload.get("actions") if isinstance(payload.get("actions"), list) else []
    action = actions_[0] if actions_ and isinstance(actions_[0], dict) else {}
    if action.get("action_id") not in (slack.APPROVE, slack.DECLINE):
        return HttpResponse(status=200)
    value = str(action.get("value") or "")
    message = slack.message_for(value)
    if message is None:
        return HttpResponse(status=200)  # not a button of ours (or a deleted destination's)
    team_id, slack_user_id = _ids(payload)
    response_url = payload.get("response_url") if isinstance(payload.get("response_url"), str) else None
    user, refusal = _person(message, team_id, slack_user_id)
    if user is None:
        slack.respond(message, response_url, slack.ephemeral(refusal or ""))
        return HttpResponse(status=200)
    high_risk = message.call.get("risk") == "high"
    if action["action_id"] == slack.DECLINE or high_risk:
        final, ended, _ = slack.state(message)
        if final is not None or ended is not None:  # no form for what nobody can decide any more
            text = closed_text(final) if final is not None else "This call no longer waits. Nothing changed."
            slack.respond(message, response_url, slack.ephemeral(text))
            return HttpResponse(status=200)
        metadata = json.dumps({"m": value, "r": response_url})
        view = (
            slack.decline_view(message, metadata)
            if action["action_id"] == slack.DECLINE
            else slack.confirm_view(message, metadata)
        )
        try:
            token = message.destination.bot_token
        except secretbox.UnreadableSecret:
            token = ""
        outcome, _ = slack.web_api(
            "views.open",
            token,
            {"trigger_id": str(payload.get("trigger_id") or ""), "view": view},
            timeout=VIEWS_OPEN_TIMEOUT,
        )
        if outcome.error is not None:
            card = _card(message)
            text = f"Slack did not open the form ({outcome.error}). Nothing changed; <{card}|decide in agentrun>."
            slack.respond(message, response_url, slack.ephemeral(text))
        return HttpResponse(status=200)
    _decide_and_answer(
        message,
        user=user,
        kind="approve",
        reason=None,
        team_id=team_id,
        slack_user_id=slack_user_id,
        response_url=response_url,
    )
    return HttpResponse(status=200)


def _on_submission(payload: dict) -> HttpResponse:
    view = payload.get("view") if isinstance(payload.get("view"), dict) else {}
    callback = view.get("callback_id")
    if callback not in (slack.CONFIRM_VIEW, slack.DECLINE_VIEW):
        return HttpResponse(status=200)
    try:
        metadata = json.loads(view.get("private_metadata") or "{}")
    except ValueError:
        metadata = {}
    metadata = metadata if isinstance(metadata, dict) else {}
    message = slack.message_for(str(metadata.get("m") or ""))
    if message is None:
        return JsonResponse({"response_action": "update", "view": slack.notice_view("This form is no longer valid.")})
    team_id, slack_user_id = _ids(payload)
    response_url = metadata.get("r") if isinstance(metadata.get("r"), str) else None
    user, refusal = _person(message, team_id, slack_user_id)
    if user is None:
        return JsonResponse({"response_action": "update", "view": slack.notice_view(refusal or "")})
    reason = None
    if callback == slack.DECLINE_VIEW:
        state = (view.get("state") or {}).get("values") or {}
        typed = ((state.get(slack.REASON_BLOCK) or {}).get(slack.REASON_INPUT) or {}).get("value")
        reason = str(typed).strip()[:2000] or None if typed else None
    kind = "decline" if callback == slack.DECLINE_VIEW else "approve"
    problem = _decide_and_answer(
        message,
        user=user,
        kind=kind,
        reason=reason,
        team_id=team_id,
        slack_user_id=slack_user_id,
        response_url=response_url,
    )
    if problem is not None:
        return JsonResponse({"response_action": "update", "view": slack.notice_view(problem)})
    return HttpResponse(status=200)  # an empty 200 closes the modal


HELP = (
    "`/agentrun link <code>` links your Slack account to your agentrun account (your code is on {url}); "
    "`/agentrun unlink` undoes it."
)


@csrf_exempt
@require_POST
def commands(request: HttpRequest) -> HttpResponse:
    form, refused = _verified(request)
    if form is None:
        return refused  # type: ignore[return-value]
    words = form.get("text", "").split()
    team_id, slack_user_id = form.get("team_id", ""), form.get("user_id", "")
    if not team_id or not slack_user_id:
        return JsonResponse(
            {"error": {"code": "INVALID_REQUEST", "message": "team_id and user_id are required"}}, status=400
        )
    if len(words) == 2 and words[0] == "link":
        _, said = slack.link(code=words[1], team_id=team_id, slack_user_id=slack_user_id)
    elif words == ["unlink"]:
        removed, _ = SlackIdentity.objects.filter(team_id=team_id, slack_user_id=slack_user_id).delete()
        said = "Unlinked: your Slack clicks decide nothing now." if removed else "Your Slack account was not linked."
    else:
        said = HELP.format(url=slack.settings_url())
    return JsonResponse({"response_type": "ephemeral", "text": said})

"""Pages under /approvals/: signed decision links and email preferences.

- ``links/<token>/``: no sign-in needed (the link is the credential). GET shows the call in full and
  decides nothing; POST approves or declines it once, as the link's reviewer. A link that cannot
  decide any more says why: used (410), expired (410), the call no longer waits (409, and who decided
  it), sent to someone else than the signed-in user (403), not a link at all (404).
- ``settings/``: the signed-in user's email preference, their Slack link code and linked Slack
  accounts (docs/slack.md, "Linking").
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from agentrun.core.errors import AgentRunError
from agentrun.core.models import Run
from agentrun.engine.decisions import decision_for_call
from approvals.public import open_call_views, thread_path
from notifications import links, slack
from notifications.models import DecisionLink, NotificationPreference, SlackIdentity

ALREADY_DECIDED_CODES = {"TOOL_CALL_ALREADY_DECIDED", "RUN_NOT_SUSPENDED", "RUN_NOT_FOUND", "TOOL_CALL_NOT_SUSPENDED"}
LINK_STATUS = {"open": 200, "done": 200, "used": 410, "expired": 410, "closed": 409, "forbidden": 403, "invalid": 404}


# --- signed decision links ------------------------------------------------------------------------
@never_cache
@require_http_methods(["GET", "POST"])
def decision_link(request: HttpRequest, token: str) -> HttpResponse:
    link = links.resolve(token)
    if link is None:
        return _link_page(request, None, "invalid")
    if request.user.is_authenticated and request.user.pk != link.user_id:
        # Whoever is signed in here is not the person the link was sent to: it decides nothing for them.
        return _link_page(request, link, "forbidden", message=f"This link was sent to {link.user.get_username()}.")
    if request.method == "GET":
        return _link_page(request, link, _state(link))
    kind = request.POST.get("action", "")
    if kind not in links.LINK_DECISIONS:
        return HttpResponse("Unknown action.", status=400)
    try:
        outcome = links.decide(link, kind=kind, reason=request.POST.get("reason", "").strip() or None)
    except links.LinkUnusable as exc:
        link.refresh_from_db()
        return _link_page(request, link, exc.reason)
    except AgentRunError as exc:
        if exc.code == "PERMISSION_DENIED":
            return _link_page(request, link, "forbidden", message=exc.message)
        if exc.code in ALREADY_DECIDED_CODES or exc.code == "ARGS_CHANGED":
            return _link_page(request, link, "closed")
        return _link_page(request, link, "open", message=exc.message, status=400)
    return _link_page(request, link, "done", decision=outcome.decision)


def _state(link: DecisionLink) -> str:
    if link.used_at is not None:
        return "used"
    if link.expired:
        return "expired"
    return "open" if links.waiting_call(link) is not None else "closed"


def _link_page(
    request: HttpRequest,
    link: DecisionLink | None,
    state: str,
    *,
    message: str = "",
    decision: Any = None,
    status: int | None = None,
) -> HttpResponse:
    context: dict[str, Any] = {"link": link, "state": state, "message": message, "decision": decision}
    if link is not None:
        call = links.waiting_call(link) if state == "open" else None
        context["view"] = open_call_views([call])[0] if call is not None else None
        if state in ("used", "closed"):
            run = Run.objects.filter(pk=link.run_id).first()
            context["decision"] = link.decision or (decision_for_call(run, link.tool_call_id) if run else None)
            context["run"] = run
        if call is not None:
            context["thread_path"] = thread_path(call.run.thread_id)
    return render(request, "notifications/link.html", context, status=status or LINK_STATUS[state])


# --- email preference, Slack ---------------------------------------------------------------------
def _settings_context(request: HttpRequest, current: str, **extra: Any) -> dict[str, Any]:
    return {
        "choices": NotificationPreference.Email.choices,
        "current": current,
        # A fresh code at every visit: signed, it works for ten minutes, once (docs/slack.md).
        "slack_code": slack.link_code(request.user),
        "slack_identities": SlackIdentity.objects.filter(user=request.user),
        **extra,
    }


@never_cache  # it shows a fresh Slack link code: never from a cache
@login_required
@require_http_methods(["GET", "POST"])
def notification_settings(request: HttpRequest) -> HttpResponse:
    preference = NotificationPreference.objects.filter(user=request.user).first()
    current = preference.email if preference else NotificationPreference.Email.IMMEDIATELY
    if request.method == "POST" and "unlink_slack" in request.POST:
        SlackIdentity.objects.filter(user=request.user, pk=request.POST.get("unlink_slack") or None).delete()
        messages.success(request, "Slack account unlinked.")
        return redirect("notifications:settings")
    if request.method == "POST":
        choice = request.POST.get("email", "")
        if choice not in NotificationPreference.Email.values:
            context = _settings_context(request, current, error="Choose one.")
            return render(request, "notifications/settings.html", context, status=400)
        NotificationPreference.objects.update_or_create(user=request.user, defaults={"email": choice})
        messages.success(request, "Saved.")
        return redirect("notifications:settings")
    return render(request, "notifications/settings.html", _settings_context(request, current))

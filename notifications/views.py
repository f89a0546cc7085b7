"""Pages under /approvals/: signed decision links, email preferences, standing grants.

- ``links/<token>/``: no sign-in needed (the link is the credential). GET shows the call in full and
  decides nothing; POST approves or declines it once, as the link's reviewer. A link that cannot
  decide any more says why: used (410), expired (410), the call no longer waits (409, and who decided
  it), sent to someone else than the signed-in user (403), not a link at all (404).
- ``settings/``: the signed-in user's email preference.
- ``grants/``: standing grants (list, revoke); ``grants/new`` is the call card's "always approve" form.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from agentrun.access import can_decide_agent
from agentrun.engine.decisions import decision_for_call
from agentrun.errors import AgentRunError
from agentrun.models import Run, SuspendedToolCall
from approvals.selectors import open_call_views
from approvals.urls import thread_path
from approvals.views import HtmxHttpRequest, viewer_required
from notifications import grants, links
from notifications.models import DecisionLink, NotificationPreference

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


# --- email preference ---------------------------------------------------------------------------
@login_required
@require_http_methods(["GET", "POST"])
def notification_settings(request: HttpRequest) -> HttpResponse:
    preference = NotificationPreference.objects.filter(user=request.user).first()
    current = preference.email if preference else NotificationPreference.Email.IMMEDIATELY
    if request.method == "POST":
        choice = request.POST.get("email", "")
        if choice not in NotificationPreference.Email.values:
            context = {"choices": NotificationPreference.Email.choices, "current": current, "error": "Choose one."}
            return render(request, "notifications/settings.html", context, status=400)
        NotificationPreference.objects.update_or_create(user=request.user, defaults={"email": choice})
        messages.success(request, "Saved.")
        return redirect("notifications:settings")
    context = {"choices": NotificationPreference.Email.choices, "current": current}
    return render(request, "notifications/settings.html", context)


# --- standing grants ------------------------------------------------------------------------------
@require_POST
@viewer_required
def grant_create(request: HtmxHttpRequest) -> HttpResponse:
    """The call card's "always approve" form: approve this call and grant its tool from now on."""
    run_id, tool_call_id = request.POST.get("run_id", ""), request.POST.get("tool_call_id", "")
    agent_id = Run.objects.filter(pk=run_id).values_list("agent_id", flat=True).first()
    if agent_id is None or not can_decide_agent(request.user, agent_id):
        raise PermissionDenied("You may not decide this agent's tool calls.")
    call = SuspendedToolCall.objects.select_related("run").filter(run_id=run_id, tool_call_id=tool_call_id).first()
    expires_in = request.POST.get("expires_in", "")
    context: dict[str, Any] = {"tool_call_id": tool_call_id, "run_id": run_id}
    try:
        if call is None:
            raise AgentRunError("TOOL_CALL_NOT_SUSPENDED", "This call no longer waits.")
        seconds = float(expires_in) if expires_in else None
        grant, outcome = grants.grant_from_call(
            user=request.user,
            call=call,
            scope=request.POST.get("scope", ""),
            expires_in=seconds,
            args_fingerprint=request.POST.get("args_fingerprint") or None,
        )
    except ValueError:
        context["error"] = "Choose how long the grant lasts."
    except AgentRunError as exc:
        if exc.code == "PERMISSION_DENIED":
            raise PermissionDenied(exc.message) from exc
        context["error"] = f"Nothing was granted. {exc.message}"
    else:
        context |= {"grant": grant, "decision": outcome.decision}
    status = 409 if "error" in context else 200
    if request.htmx:
        return render(request, "notifications/_granted.html", context, status=status)
    if "error" in context:
        messages.error(request, context["error"])
    else:
        messages.success(request, f"Approved; from now on: {grant.describe()}.")
    return redirect("notifications:grants")


@require_http_methods(["GET"])
@vary_on_headers("HX-Request")
@viewer_required
def grant_list(request: HtmxHttpRequest) -> HttpResponse:
    rows = [(g, grants.can_revoke(request.user, g)) for g in grants.visible_grants(request.user)[:200]]
    return render(request, "notifications/grants.html", {"rows": rows})


@require_POST
@viewer_required
def grant_revoke(request: HtmxHttpRequest, grant_id: str) -> HttpResponse:
    grant = get_object_or_404(grants.visible_grants(request.user), pk=grant_id)
    if not grants.can_revoke(request.user, grant):
        raise PermissionDenied("You may not revoke this agent's grants.")
    grants.revoke(user=request.user, grant=grant)
    grant.refresh_from_db()
    if request.htmx:
        return render(request, "notifications/grants.html#row", {"grant": grant, "can_revoke": True})
    messages.success(request, f"Revoked: {grant.describe()}.")
    return redirect("notifications:grants")

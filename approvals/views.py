"""Reviewer pages (CONTRACT §6). Function views; htmx requests get the page's partial section.

Per-agent reviewers (``agentrun.access``): a hidden agent's runs are 404 and absent from the inbox,
thread pages and history; a decision on a call the user may not decide is 403.
"""

from __future__ import annotations

from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import F
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.middleware import HtmxDetails

from agentrun.access import can_decide, can_decide_agent, can_view, hidden_agent_ids
from agentrun.engine.service import decide_tool_call
from agentrun.errors import AgentRunError
from agentrun.models import Decision, Run, SuspendedToolCall
from agentrun.selectors import decision_history
from approvals import selectors
from approvals.resume_form import attach_engine_errors, parse_resume_form

HISTORY_PAGE_SIZE = 25
ALREADY_DECIDED_CODES = {"TOOL_CALL_ALREADY_DECIDED", "RUN_NOT_SUSPENDED", "RUN_NOT_FOUND"}
FORM_ERROR_CODES = {"ARGS_INVALID", "RESUME_DATA_INVALID", "INVALID_REQUEST"}


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def viewer_required(view: Any) -> Any:
    """Signed in (else the login page) and allowed to read (Viewers, Reviewers; else 403)."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not can_view(request.user):
            raise PermissionDenied("You may not read the reviewer dashboard.")
        return view(request, *args, **kwargs)

    return wrapper


def _page(request: HtmxHttpRequest, template: str, section: str, context: dict, status: int = 200) -> HttpResponse:
    """The whole page, or only ``section`` for an htmx request (responses vary on HX-Request)."""
    name = f"{template}#{section}" if request.htmx else template
    return render(request, name, context, status=status)


# --- inbox -----------------------------------------------------------------------------------------
@require_GET
@vary_on_headers("HX-Request")
@viewer_required
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    filters = {
        "agent_id": request.GET.get("agent", "").strip(),
        "resource_id": request.GET.get("resource", ""),  # ids are kept as they are: " x" is an id
        "tool_name": request.GET.get("tool", "").strip(),
        "risk": request.GET.get("risk", "").strip(),
    }
    sort = "newest" if request.GET.get("sort") == "newest" else "oldest"
    hidden = hidden_agent_ids(request.user)
    context = {
        "rows": selectors.inbox_rows(**filters, newest_first=sort == "newest", hidden=hidden),
        "filters": filters,
        "sort": sort,
        "choices": selectors.inbox_facets(**filters, hidden=hidden),
        "risks": SuspendedToolCall.Risk.choices,
        "query": request.GET.urlencode(),
    }
    return _page(request, "approvals/inbox.html", "threads", context)


# --- thread ----------------------------------------------------------------------------------------
@require_GET
@vary_on_headers("HX-Request")
@viewer_required
def thread_detail(request: HtmxHttpRequest, thread_id: str) -> HttpResponse:
    hidden = hidden_agent_ids(request.user)
    calls = selectors.open_call_views(selectors.thread_open_calls(thread_id, hidden))
    context = {
        "thread_id": thread_id,
        "calls": calls,
        "messages": selectors.recent_messages(thread_id, hidden=hidden),
        "can_decide": can_decide(request.user),
    }
    if request.htmx and "known" in request.GET:
        # The live refresh: the page says which calls it shows; answer with the new ones (appended)
        # and out-of-band notices replacing the ones that left (who decided them, if anyone did).
        known = [k for k in request.GET.get("known", "").split() if k]
        open_ids = {c.tool_call_id for c in calls}
        gone = [k for k in known if k not in open_ids]
        decisions = selectors.decisions_for_calls(gone, hidden)
        context |= {
            "calls": [c for c in calls if c.tool_call_id not in known],
            "gone": [{"tool_call_id": k, "decision": decisions.get(k)} for k in gone],
        }
        return render(request, "approvals/thread.html#live-delta", context)
    return _page(request, "approvals/thread.html", "calls", context)


@require_GET
def thread_by_query(request: HtmxHttpRequest) -> HttpResponse:
    """``threads/?id=<id>``: the thread page of an id that cannot be a path segment ("." and "..")."""
    thread_id = request.GET.get("id", "")
    if not thread_id:
        raise Http404("No such thread.")
    return thread_detail(request, thread_id)


@require_POST
@viewer_required
def decide_call(request: HtmxHttpRequest, run_id: str, tool_call_id: str) -> HttpResponse:
    """Approve / decline / edit & approve / resume one open call, then continue the run server-side."""
    if not can_decide(request.user):
        raise PermissionDenied("You may not decide tool calls.")
    agent_id = Run.objects.filter(pk=run_id).values_list("agent_id", flat=True).first()
    if agent_id is not None and not can_decide_agent(request.user, agent_id):
        # Before anything about the call is read: who decided it is none of this user's business.
        raise PermissionDenied("You may not decide this agent's tool calls.")
    action = request.POST.get("action", "")
    call = SuspendedToolCall.objects.select_related("run").filter(run_id=run_id, tool_call_id=tool_call_id).first()
    if call is None:
        decision = selectors.latest_decision(run_id, tool_call_id)
        if decision is None:
            return _decision_response(request, None, run_id, tool_call_id, status=404, error="No such tool call.")
        return _decision_response(request, decision, run_id, tool_call_id, status=409, already=True)
    view = selectors.open_call_views([call])[0]
    kwargs: dict[str, Any] = {"agent_id": call.run.agent_id, "run_id": run_id, "tool_call_id": tool_call_id}
    # A reason typed in the card goes with the decision, approve or decline (as over REST).
    view.reason = request.POST.get("reason", "")
    reason = view.reason.strip() or None
    if action == "approve":
        kwargs |= {"kind": "approve", "reason": reason}
    elif action == "decline":
        kwargs |= {"kind": "decline", "reason": reason}
    elif action == "edit":
        # Handed to the engine as text: it parses and validates (ARGS_INVALID), changing nothing on error.
        view.edit_text = request.POST.get("args", "")
        kwargs |= {"kind": "approve", "args": view.edit_text}
    elif action == "resume":
        view.resume_json = request.POST.get("resume_data", "")
        resume_data, fields, json_error = parse_resume_form(call.resume_schema, request.POST)
        view.resume_fields = fields
        if json_error or any(f.error for f in fields or []):
            view.error, view.failed_action = json_error or "Correct the fields below.", "resume"
            return _form_error(request, view)
        kwargs |= {"kind": "resume", "resume_data": resume_data}
    else:
        return HttpResponse("Unknown action.", status=400)
    try:
        outcome = decide_tool_call(**kwargs, decided_by=request.user, via=Decision.Via.DASHBOARD)
    except AgentRunError as exc:
        if exc.code == "PERMISSION_DENIED":  # e.g. a sub-agent's call this user may not decide
            raise PermissionDenied(exc.message) from exc
        if exc.code in ALREADY_DECIDED_CODES:
            decision = selectors.latest_decision(run_id, tool_call_id)
            if decision is not None:
                return _decision_response(request, decision, run_id, tool_call_id, status=409, already=True)
        view.failed_action = action
        view.error = exc.message
        errors = (exc.details or {}).get("errors") or []
        if action == "resume":
            view.error_items = attach_engine_errors(view.resume_fields, errors)
        else:
            view.error_items = [f"{e.get('loc', '$')}: {e.get('message', '')}" for e in errors]
        return _form_error(request, view, status=422 if exc.code in FORM_ERROR_CODES else 400)
    return _decision_response(request, outcome.decision, run_id, tool_call_id, status=200)


def _form_error(request: HtmxHttpRequest, view: selectors.OpenCallView, status: int = 422) -> HttpResponse:
    """The call again, with the error next to the form that failed; nothing was decided."""
    context = {"call": view, "can_decide": True}
    if request.htmx:
        return render(request, "approvals/thread.html#call", context, status=status)
    thread_id = view.call.run.thread_id
    hidden = hidden_agent_ids(request.user)
    calls = selectors.open_call_views(selectors.thread_open_calls(thread_id, hidden))
    calls = [view if c.tool_call_id == view.tool_call_id else c for c in calls]
    context = {
        "thread_id": thread_id,
        "calls": calls,
        "messages": selectors.recent_messages(thread_id, hidden=hidden),
        "can_decide": True,
    }
    return render(request, "approvals/thread.html", context, status=status)


def _decision_response(
    request: HtmxHttpRequest,
    decision: Decision | None,
    run_id: str,
    tool_call_id: str,
    *,
    status: int,
    already: bool = False,
    error: str = "",
) -> HttpResponse:
    context = {
        "decision": decision,
        "run_id": run_id,
        "tool_call_id": tool_call_id,
        "already": already,
        "error": error,
        "mine": decision is not None and decision.decided_by_id == request.user.pk and not already,
    }
    if request.htmx:
        return render(request, "approvals/thread.html#decided", context, status=status)
    if status == 200:
        return redirect("approvals:run", run_id=run_id)
    return render(request, "approvals/decided.html", context, status=status)


# --- run -------------------------------------------------------------------------------------------
@require_GET
@vary_on_headers("HX-Request")
@viewer_required
def run_detail(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    hidden = hidden_agent_ids(request.user)
    run = get_object_or_404(Run.objects.select_related("thread"), pk=run_id)
    if run.agent_id in hidden:
        raise Http404("No such run.")
    messages = list(run.messages.order_by("created_at", "id"))
    final_answer = next((m for m in reversed(messages) if m.role == "assistant" and m.content), None)
    last_seq = run.next_seq - 1
    decisions = list(run.decisions.annotate(resource_id=F("run__resource_id")).order_by("decided_at", "id"))
    context = {
        "run": run,
        "messages": messages,
        "final_answer": final_answer if run.is_final else None,
        "steps": selectors.timeline_steps(run, decisions),
        "decisions": decisions,
        "open_calls": list(run.suspended_calls.filter(status=SuspendedToolCall.Status.OPEN)),
        "child_runs": list(run.child_runs.exclude(agent_id__in=hidden).order_by("created_at", "id")),
        "stream_state": {"runId": run.id, "after": last_seq, "final": run.is_final, "status": run.status},
    }
    return _page(request, "approvals/run.html", "run-body", context)


# --- history ---------------------------------------------------------------------------------------
@require_GET
@vary_on_headers("HX-Request")
@viewer_required
def history(request: HtmxHttpRequest) -> HttpResponse:
    filters = {
        "agent_id": request.GET.get("agent", "").strip(),
        "decided_by": request.GET.get("decided_by", "").strip(),
        "kind": request.GET.get("kind", "").strip(),
        "thread_id": request.GET.get("thread", ""),
        "resource_id": request.GET.get("resource", ""),
    }
    hidden = hidden_agent_ids(request.user)
    decisions = selectors.history_decisions(hidden=hidden, **filters)
    page = Paginator(decisions, HISTORY_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    visible = decision_history(hidden=hidden).order_by()  # the filter menus' values
    context = {
        "page": page,
        "filters": filters,
        "kinds": Decision.Kind.choices,
        "agents": sorted(visible.values_list("agent_id", flat=True).distinct()),
        "deciders": sorted(u for u in visible.values_list("decided_by_username", flat=True).distinct() if u),
        "query": query.urlencode(),
    }
    return _page(request, "approvals/history.html", "decisions", context)

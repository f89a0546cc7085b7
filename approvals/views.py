"""Reviewer pages (docs/dashboard.md): the inbox, thread and run pages, history, standing grants. Function
views; htmx requests get the page's partial section.

Per-agent reviewers (``agentrun.core.access``): a hidden agent's runs are 404 and absent from the inbox,
thread pages and history; a decision on a call the user may not decide is 403.
"""

from __future__ import annotations

import json
import re
from datetime import date, datetime, time
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import F, Q
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import reswap, retarget
from django_htmx.middleware import HtmxDetails

from agentrun.core import claims, exports
from agentrun.core.access import can_decide, can_decide_agent, can_view, hidden_agent_ids
from agentrun.core.errors import AgentRunError
from agentrun.core.models import Decision, Run, SuspendedToolCall, Thread
from agentrun.core.selectors import decision_history
from agentrun.engine.service import Decider, DecisionCommand, DecisionRequest, decide
from approvals import grants, selectors
from approvals.resume_form import attach_engine_errors, json_error, parse_resume_form
from approvals.selectors import OpenCallView

HISTORY_PAGE_SIZE = 25
JSON_TYPE = "application/json"
DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
BATCH_KINDS = ("approve", "decline")
BATCH_ERRORS = {
    "ARGS_CHANGED": "The arguments of a listed call changed since you saw them.",
    "TOOL_CALL_ALREADY_DECIDED": "A listed call was decided meanwhile.",
    "RUN_NOT_SUSPENDED": "A listed call no longer waits.",
    "RUN_NOT_FOUND": "A listed call no longer waits.",
    "TOOL_CALL_NOT_SUSPENDED": "A listed call no longer waits.",
}
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
    mine = request.GET.get("mine") == "1"
    hidden = hidden_agent_ids(request.user)
    try:
        number = int(request.GET.get("page", "1"))
    except ValueError:
        number = 1
    page = selectors.inbox_page(
        **filters, newest_first=sort == "newest", page=number, hidden=hidden, mine=request.user if mine else None
    )
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "page": page,
        "rows": page.rows,
        "filters": filters,
        "sort": sort,
        "mine": mine,
        # An htmx request swaps the rows only (filters, pages, the live refresh): no menus to build.
        "choices": selectors.inbox_facets(resource_id=filters["resource_id"], hidden=hidden, menus=not request.htmx),
        "risks": SuspendedToolCall.Risk.choices,
        "query": request.GET.urlencode(),
        "page_query": query.urlencode(),  # the filters and sort, for the other pages' links
        "can_decide": can_decide(request.user),
    }
    return _page(request, "approvals/inbox.html", "threads", context)


# --- thread ----------------------------------------------------------------------------------------
def _thread_context(request: HttpRequest, thread_id: str, *, replace: OpenCallView | None = None) -> dict[str, Any]:
    """What the thread page shows; ``replace``: a card to show in its current form state."""
    hidden = hidden_agent_ids(request.user)
    calls = selectors.open_call_views(selectors.thread_open_calls(thread_id, hidden))
    if replace is not None:
        calls = [replace if c.tool_call_id == replace.tool_call_id else c for c in calls]
    return {
        "thread_id": thread_id,
        "resource_id": Thread.objects.filter(pk=thread_id).values_list("resource_id", flat=True).first(),
        "calls": calls,
        "approval_calls": [c for c in calls if c.is_approval],
        "messages": selectors.recent_messages(thread_id, hidden=hidden),
        "can_decide": can_decide(request.user),
        "hidden": hidden,
        "assignees": assignee_choices(),
    }


def _known_call_ids(raw: str) -> list[str]:
    """The live refresh's list of the calls a page shows (JSON: ids may hold any character)."""
    try:
        known = json.loads(raw)
    except ValueError:
        return []
    return [k for k in known if isinstance(k, str)] if isinstance(known, list) else []


def assignee_choices() -> dict[str, list[str]]:
    """Whom a call can be assigned to: active people who may decide, and the groups (two queries)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    people = (
        get_user_model()
        .objects.filter(is_active=True)
        .filter(
            Q(is_superuser=True)
            | Q(groups__permissions__codename="decide_toolcall")
            | Q(user_permissions__codename="decide_toolcall")
        )
    )
    return {
        "people": sorted(set(people.values_list("username", flat=True))),
        "groups": sorted(Group.objects.values_list("name", flat=True)),
    }


@require_GET
@vary_on_headers("HX-Request")
@viewer_required
def thread_detail(request: HtmxHttpRequest, thread_id: str) -> HttpResponse:
    context = _thread_context(request, thread_id)
    if request.htmx and request.GET.get("part") == "messages":  # a decided card's run finished: its words
        return render(request, "approvals/thread.html#recent-messages", context)
    claims.touch(user=request.user, calls=[c.call for c in context["calls"]])  # the claimer is still on them
    if request.htmx and "known" in request.GET:
        # The live refresh: the page says which calls it shows; answer with the new ones (appended)
        # and out-of-band notices replacing the ones that left (who decided them, if anyone did).
        # A re-sync after the page was offline gets the whole list, with the same notices on top.
        known = _known_call_ids(request.GET["known"])
        open_ids = {c.tool_call_id for c in context["calls"]}
        gone = [k for k in known if k not in open_ids]
        decisions = selectors.decisions_for_calls(gone, context["hidden"])
        context["gone"] = [{"tool_call_id": k, "decision": decisions.get(k)} for k in gone]
        if "resync" in request.GET:
            # Back from offline: every card afresh (the page's may be stale), and who decided the rest.
            return render(request, "approvals/thread.html#calls", context)
        context["claim_calls"] = [c for c in context["calls"] if c.tool_call_id in known]  # their claim bars, fresh
        context["calls"] = [c for c in context["calls"] if c.tool_call_id not in known]
        return render(request, "approvals/thread.html#live-delta", context)
    return _page(request, "approvals/thread.html", "calls", context)


@require_GET
def thread_by_query(request: HtmxHttpRequest) -> HttpResponse:
    """``threads/?id=<id>``: the thread page of an id that cannot be a path segment ("." and "..")."""
    thread_id = request.GET.get("id", "")
    if not thread_id:
        raise Http404("No such thread.")
    return thread_detail(request, thread_id)


def _parse_edited_args(text: str) -> Any:
    """The editor's text as JSON, or an error naming where it breaks (nothing is decided)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise AgentRunError("ARGS_INVALID", json_error(exc)) from None
    except (ValueError, RecursionError):
        raise AgentRunError("ARGS_INVALID", "This is not valid JSON: too deep or too large.") from None


def _same_args(text: str, args: Any) -> bool:
    try:
        return json.loads(text) == args
    except (ValueError, RecursionError):
        return False


@require_POST
@viewer_required
def decide_call(request: HtmxHttpRequest, run_id: str, tool_call_id: str) -> HttpResponse:
    """Approve / decline / edit & approve / resume one open call, then continue the run server-side.

    The card posts the fingerprint of the arguments it shows: if they changed since, the engine refuses
    (``ARGS_CHANGED``) and the card comes back with the current ones. A high-risk approval takes a
    second, deliberate step: the first click only asks for confirmation.
    """
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
    view.note = request.POST.get("reason", "")
    fingerprint = request.POST.get("args_fingerprint") or None
    kwargs: dict[str, Any] = {
        "agent_id": call.run.agent_id,
        "run_id": run_id,
        "tool_call_id": tool_call_id,
        "args_fingerprint": fingerprint,
    }
    # A reason typed in the card goes with the decision, approve or decline (as over REST).
    reason = view.note.strip() or None
    try:
        if action == "cancel":  # leave the confirmation step: the card as it was, nothing decided
            return card_response(request, view)
        if action == "approve":
            edited = request.POST.get("args")  # sent only while the editor is open
            if edited is not None and not _same_args(edited, view.args):
                view.edit_text = edited
                raise AgentRunError(
                    "INVALID_REQUEST",
                    "You changed the arguments: “Edit & approve” runs your version; “Cancel edit” goes back "
                    "to the ones shown.",
                )
            kwargs |= {"kind": "approve", "reason": reason}
        elif action == "decline":
            kwargs |= {"kind": "decline", "reason": reason}
        elif action == "edit":
            view.edit_text = request.POST.get("args", "")
            kwargs |= {"kind": "approve", "reason": reason, "args": _parse_edited_args(view.edit_text)}
            selectors.validate_edited_args(view, kwargs["args"])  # said now, not after a confirmation
        elif action == "decline_question":  # a question the reviewer will not answer: the agent is told so
            kwargs |= {"kind": "decline", "reason": reason, "declines_question": True}
        elif action == "resume":
            view.resume_json = request.POST.get("resume_data", "")
            resume_data, fields, json_error = parse_resume_form(call.resume_schema, request.POST)
            view.resume_fields = fields
            if json_error or any(f.error for f in fields or []):
                view.failed_action = "resume"
                view.error = json_error or "Please correct the fields marked below."
                return card_response(request, view, status=422)
            kwargs |= {"kind": "resume", "resume_data": resume_data}
        else:
            return HttpResponse("Unknown action.", status=400)
        if action in ("approve", "edit") and (asking := ask_high_risk_confirmation(request, view, action)):
            return asking
        outcome = decide(
            DecisionCommand.one(**kwargs, decider=Decider.person(request.user, via=Decision.Via.DASHBOARD))
        )
    except AgentRunError as exc:
        return _refused(request, view, action, exc)
    if not outcome.decision.completes:
        # An approval towards a quorum: the call still waits for another person. The card stays,
        # saying who approved so far ("1 of 2 approvals").
        fresh = selectors.open_call_views([SuspendedToolCall.objects.select_related("run").get(pk=call.pk)])[0]
        fresh.notice = "Your approval is recorded. Another person must approve the same arguments."
        if request.htmx:
            return card_response(request, fresh)
        from approvals.urls import thread_path  # the URLconf imports these views

        return redirect(thread_path(call.run.thread_id))
    return _decision_response(request, outcome.decision, run_id, tool_call_id, status=200, after=outcome.after_seq)


def _refused(request: HtmxHttpRequest, view: OpenCallView, action: str, exc: AgentRunError) -> HttpResponse:
    """The engine (or the form) refused: say why, next to the card; nothing was decided."""
    if exc.code == "PERMISSION_DENIED":  # e.g. a sub-agent's call this user may not decide
        raise PermissionDenied(exc.message) from exc
    run_id, tool_call_id = view.call.run_id, view.tool_call_id
    if exc.code in ALREADY_DECIDED_CODES:
        decision = selectors.latest_decision(run_id, tool_call_id)
        if decision is not None:
            return _decision_response(request, decision, run_id, tool_call_id, status=409, already=True)
    if exc.code == "ARGS_CHANGED":
        # Show the arguments as they are now: the reviewer decides again on what they see.
        call = SuspendedToolCall.objects.select_related("run").get(pk=view.call.pk)
        fresh = selectors.open_call_views([call])[0]
        fresh.failed_action, fresh.note, fresh.edit_text = action, view.note, view.edit_text
        fresh.error = "The arguments changed since this card was shown. Check them below and decide again."
        return card_response(request, fresh, status=409)
    view.failed_action = action
    errors = (exc.details or {}).get("errors") or []
    if action == "resume":
        view.error = "Please correct the fields marked below."
        view.error_items = attach_engine_errors(view.resume_fields, errors)
    else:
        view.error = exc.message
        view.error_items = [f"{e.get('loc', '$')}: {e.get('message', '')}" for e in errors]
    return card_response(request, view, status=422 if exc.code in FORM_ERROR_CODES else 400)


def ask_high_risk_confirmation(request: HtmxHttpRequest, view: OpenCallView, action: str) -> HttpResponse | None:
    """A high-risk approval takes a second, deliberate step, whichever button approves it (Approve, Edit
    & approve, "Always approve"): until the request carries the confirmation form's ``confirm=high-risk``,
    the answer is the card asking to confirm ``action`` and nothing is decided. None: go ahead.

    The arguments shown must still be the current ones (``ARGS_CHANGED``): the confirmation would
    otherwise ask about arguments that no longer run.
    """
    if not view.high_risk or request.POST.get("confirm") == "high-risk":
        return None
    fingerprint = request.POST.get("args_fingerprint") or None
    if fingerprint is not None and fingerprint != view.fingerprint:
        raise AgentRunError("ARGS_CHANGED", "The arguments changed since this card was shown.")
    view.confirming = action
    return card_response(request, view)


def card_response(request: HtmxHttpRequest, view: OpenCallView, status: int = 200) -> HttpResponse:
    """The card in its current state (htmx), or the thread page showing it: a confirmation step, or an
    error next to the form that failed (nothing was decided)."""
    if request.htmx:
        context = {"call": view, "can_decide": True, "assignees": assignee_choices()}
        return render(request, "approvals/thread.html#call", context, status=status)
    context = _thread_context(request, view.call.run.thread_id, replace=view)
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
    after: int | None = None,
) -> HttpResponse:
    context = {
        "decision": decision,
        "run_id": run_id,
        "tool_call_id": tool_call_id,
        "already": already,
        "error": error,
        "follow_after": after,  # the card then shows the outcome live, from the run's chunks past this seq
    }
    if request.htmx:
        return render(request, "approvals/thread.html#decided", context, status=status)
    if status == 200:
        return redirect("approvals:run", run_id=run_id)
    return render(request, "approvals/decided.html", context, status=status)


@require_POST
@viewer_required
def claim_call(request: HtmxHttpRequest, run_id: str, tool_call_id: str) -> HttpResponse:
    """Shared work on one open call (docs/dashboard.md#shared-work): ``action`` ``claim`` ("I'm on it"),
    ``release``, or ``assign`` with ``assignee`` = ``user:<name>``, ``group:<name>`` or empty (nobody).
    Anyone who may decide the call may do each; none of it stops anyone else from deciding."""
    agent_id = Run.objects.filter(pk=run_id).values_list("agent_id", flat=True).first()
    if agent_id is None or not can_decide(request.user) or not can_decide_agent(request.user, agent_id):
        raise PermissionDenied("You may not work on this agent's tool calls.")
    call = (
        SuspendedToolCall.objects.select_related(*claims.RELATED)
        .filter(run_id=run_id, tool_call_id=tool_call_id)
        .first()
    )
    if call is None:
        decision = selectors.latest_decision(run_id, tool_call_id)
        return _decision_response(
            request,
            decision,
            run_id,
            tool_call_id,
            status=409 if decision else 404,
            already=bool(decision),
            error="" if decision else "No such tool call.",
        )
    action, assignee = request.POST.get("action", ""), request.POST.get("assignee", "")
    try:
        if action == "claim":
            claims.claim(user=request.user, call=call)
        elif action == "release":
            claims.release(user=request.user, call=call)
        elif action == "assign":
            kind, _, name = assignee.partition(":")
            if assignee and (kind not in ("user", "group") or not name):
                return HttpResponse("assignee is user:<name>, group:<name> or empty.", status=400)
            claims.assign(
                by=request.user,
                call=call,
                username=name if kind == "user" else None,
                group=name if kind == "group" else None,
            )
        else:
            return HttpResponse("Unknown action.", status=400)
    except AgentRunError as exc:
        if exc.code in ALREADY_DECIDED_CODES | {"TOOL_CALL_NOT_SUSPENDED"}:
            decision = selectors.latest_decision(run_id, tool_call_id)
            if decision is not None:
                return _decision_response(request, decision, run_id, tool_call_id, status=409, already=True)
        return HttpResponse(exc.message, status=400)
    fresh = SuspendedToolCall.objects.select_related(*claims.RELATED).get(pk=call.pk)
    view = selectors.open_call_views([fresh])[0]
    if request.htmx:
        return card_response(request, view)
    from approvals.urls import thread_path  # the URLconf imports these views

    return redirect(thread_path(call.run.thread_id))


def _batch_items(request: HttpRequest) -> dict[str, list[DecisionRequest]] | None:
    """The calls the confirmation listed, grouped by run: ``run_id fingerprint tool_call_id`` each."""
    kind = request.POST.get("confirm", "")
    reason = (request.POST.get("reason", "").strip() or None) if kind == "decline" else None
    groups: dict[str, list[DecisionRequest]] = {}
    for item in request.POST.getlist("call"):
        parts = item.split(" ", 2)
        if len(parts) != 3:
            return None
        run_id, fingerprint, tool_call_id = parts
        groups.setdefault(run_id, []).append(
            DecisionRequest(kind=kind, tool_call_id=tool_call_id, reason=reason, args_fingerprint=fingerprint)
        )
    return groups or None


@require_POST
@viewer_required
def decide_all(request: HtmxHttpRequest) -> HttpResponse:
    """Approve all / Decline all of a thread's approval calls. The first click lists them; the second
    decides exactly the listed calls, bound to the arguments listed, all or nothing (the engine's batch
    service per run, in one transaction)."""
    if not can_decide(request.user):
        raise PermissionDenied("You may not decide tool calls.")
    thread_id = request.POST.get("thread_id", "")
    kind = request.POST.get("confirm", "")
    if "cancel" in request.POST or kind not in BATCH_KINDS:
        context = _thread_context(request, thread_id)
        if request.POST.get("ask") in BATCH_KINDS and "cancel" not in request.POST:
            if len(context["approval_calls"]) > 1:
                context["batch_confirm"] = request.POST["ask"]  # the list to confirm; nothing decided yet
            else:  # decided meanwhile: "Approve these 0 calls?" would be no question at all
                context["batch_error"] = "Fewer than two calls wait here now: decide them on their cards."
        return _batch_response(request, context, section="batch")
    groups = _batch_items(request)
    if groups is None:
        return HttpResponse("Name the calls to decide.", status=400)
    agents = dict(Run.objects.filter(pk__in=groups, thread_id=thread_id).values_list("id", "agent_id"))
    shown = selectors.thread_open_calls(thread_id, hidden_agent_ids(request.user))
    titles = {c.tool_call_id: c.title for c in selectors.open_call_views(shown)}
    try:
        with transaction.atomic():  # every listed call, or none
            decided = []
            for run_id, requests in groups.items():
                if run_id not in agents:
                    raise AgentRunError("RUN_NOT_FOUND", "A listed call is not in this thread any more.")
                outcome = decide(
                    DecisionCommand(
                        agent_id=agents[run_id],
                        run_id=run_id,
                        requests=tuple(requests),
                        decider=Decider.person(request.user, via=Decision.Via.DASHBOARD),
                        batch=True,
                    )
                )
                decided += outcome.decisions
    except AgentRunError as exc:
        if exc.code == "PERMISSION_DENIED":
            raise PermissionDenied(exc.message) from exc
        context = _thread_context(request, thread_id)
        context["batch_error"] = BATCH_ERRORS.get(exc.code, exc.message) + " The calls below are up to date."
        return _batch_response(request, context, section="calls", status=409)
    context = _thread_context(request, thread_id)
    names = ", ".join(titles.get(d.tool_call_id, d.tool_name) for d in decided)
    verb = "Approved" if kind == "approve" else "Declined"
    count = f"{len(decided)} call{pluralize(len(decided))}"
    context["batch_result"] = f"{verb} {count}: {names}. The runs continue on the server."
    return _batch_response(request, context, section="calls")


def _batch_response(request: HtmxHttpRequest, context: dict, *, section: str, status: int = 200) -> HttpResponse:
    if not request.htmx:
        return render(request, "approvals/thread.html", context, status=status)
    response = render(request, f"approvals/thread.html#{section}", context, status=status)
    if section == "calls":  # after deciding, every card is re-read, not only the batch bar
        response = reswap(retarget(response, "#calls"), "outerHTML")
    return response


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
def _history_filters(request: HttpRequest) -> dict[str, str]:
    """The history page's filters from its query (docs/dashboard.md#history); ids are kept as they are."""
    get = request.GET
    return {
        "agent_id": get.get("agent", "").strip(),
        "tool_name": get.get("tool", "").strip(),
        "via": get.get("via", "").strip(),
        "decided_by": get.get("decided_by", "").strip(),
        "kind": get.get("kind", "").strip(),
        "thread_id": get.get("thread", ""),
        "resource_id": get.get("resource", ""),
        "from_date": get.get("from", "").strip(),
        "to_date": get.get("to", "").strip(),
    }


def _filtered_history(request: HttpRequest, filters: dict[str, str]) -> Any:
    """The decisions the filters select, for this reader. A day (``2026-01-10``, what a date field sends)
    bounds inclusively: from its first moment, to its last; a date-time bounds as it says. Bad dates raise
    ``AgentRunError`` ``INVALID_DATE``."""
    bounds: dict[str, Any] = dict(filters)
    zone = timezone.get_current_timezone()  # the zone the page shows times in
    for name, moment in (("from_date", time.min), ("to_date", time.max)):
        if DAY.fullmatch(bounds[name]):
            try:
                bounds[name] = datetime.combine(date.fromisoformat(bounds[name]), moment, tzinfo=zone)
            except ValueError:
                raise AgentRunError("INVALID_DATE", f"{bounds[name]!r} is not a date.") from None
    return selectors.history_decisions(hidden=hidden_agent_ids(request.user), **bounds)


@require_GET
@vary_on_headers("HX-Request")
@viewer_required
def history(request: HtmxHttpRequest) -> HttpResponse:
    filters = _history_filters(request)
    hidden = hidden_agent_ids(request.user)
    error, status = "", 200
    try:
        decisions = _filtered_history(request, filters)
        page = Paginator(decisions, HISTORY_PAGE_SIZE).get_page(request.GET.get("page"))
    except AgentRunError as exc:  # a date that is no date: say so, list nothing (htmx swaps only a 200)
        error, status = exc.message, 200 if request.htmx else 400
        page = Paginator(Decision.objects.none(), HISTORY_PAGE_SIZE).get_page(1)
    query = request.GET.copy()
    query.pop("page", None)
    visible = decision_history(hidden=hidden).order_by()  # the filter menus' values
    tools = set(visible.values_list("tool_name", flat=True).distinct())
    tools |= {t for t in visible.values_list("inner_tool_name", flat=True).distinct() if t}
    context = {
        "page": page,
        "filters": filters,
        "error": error,
        "kinds": Decision.Kind.choices,
        "vias": Decision.Via.choices,
        "agents": sorted(visible.values_list("agent_id", flat=True).distinct()),
        "tools": sorted(tools),
        "deciders": sorted(u for u in visible.values_list("decided_by_username", flat=True).distinct() if u),
        "query": query.urlencode(),
    }
    return _page(request, "approvals/history.html", "decisions", context, status=status)


@require_GET
@viewer_required
def history_export(request: HttpRequest, fmt: str) -> HttpResponse | StreamingHttpResponse:
    """Every decision the history filters select, as CSV or JSON, streamed a batch at a time (any number)."""
    try:
        decisions = _filtered_history(request, _history_filters(request))
    except AgentRunError as exc:
        return HttpResponse(exc.message, status=400, content_type="text/plain; charset=utf-8")
    formats = {"csv": (exports.stream_csv, "text/csv; charset=utf-8"), "json": (exports.stream_json, JSON_TYPE)}
    if fmt not in formats:
        raise Http404("CSV or JSON")
    body, content_type = formats[fmt]
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response = StreamingHttpResponse(body(decisions), content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="decisions-{stamp}.{fmt}"'
    response["Cache-Control"] = "no-store"
    return response


# --- standing grants ------------------------------------------------------------------------------
@require_POST
@viewer_required
def grant_create(request: HtmxHttpRequest) -> HttpResponse:
    """The call card's "always approve" form: approve this call and grant its tool from now on. On a
    high-risk call this approval takes the same second step as the card's Approve (nothing is decided
    or granted until the confirmation comes back; "cancel" leaves it)."""
    run_id, tool_call_id = request.POST.get("run_id", ""), request.POST.get("tool_call_id", "")
    agent_id = Run.objects.filter(pk=run_id).values_list("agent_id", flat=True).first()
    if agent_id is None or not can_decide_agent(request.user, agent_id):
        raise PermissionDenied("You may not decide this agent's tool calls.")
    call = SuspendedToolCall.objects.select_related("run").filter(run_id=run_id, tool_call_id=tool_call_id).first()
    expires_in, scope = request.POST.get("expires_in", ""), request.POST.get("scope", "")
    context: dict[str, Any] = {"tool_call_id": tool_call_id, "run_id": run_id}
    try:
        if call is None:
            raise AgentRunError("TOOL_CALL_NOT_SUSPENDED", "This call no longer waits.")
        view = selectors.open_call_views([call])[0]
        if request.POST.get("action") == "cancel":  # leave the confirmation step: the card as it was
            return card_response(request, view)
        seconds = float(expires_in) if expires_in else None
        view.grant = grants.grant_for_call(user=request.user, call=call, scope=scope, expires_in=seconds)
        view.grant_expires_in = expires_in
        if asking := ask_high_risk_confirmation(request, view, "grant"):
            return asking
        grant, outcome = grants.grant_from_call(
            user=request.user,
            call=call,
            scope=scope,
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
        return render(request, "approvals/_granted.html", context, status=status)
    if "error" in context:
        messages.error(request, context["error"])
    else:
        messages.success(request, f"Approved; from now on: {grant.describe()}.")
    return redirect("approvals:grants")


@require_http_methods(["GET"])
@vary_on_headers("HX-Request")
@viewer_required
def grant_list(request: HtmxHttpRequest) -> HttpResponse:
    rows = [(g, grants.can_revoke(request.user, g)) for g in grants.visible_grants(request.user)[:200]]
    return render(request, "approvals/grants.html", {"rows": rows})


@require_POST
@viewer_required
def grant_revoke(request: HtmxHttpRequest, grant_id: str) -> HttpResponse:
    grant = get_object_or_404(grants.visible_grants(request.user), pk=grant_id)
    if not grants.can_revoke(request.user, grant):
        raise PermissionDenied("You may not revoke this agent's grants.")
    grants.revoke(user=request.user, grant=grant)
    grant.refresh_from_db()
    if request.htmx:
        return render(request, "approvals/grants.html#row", {"grant": grant, "can_revoke": True})
    messages.success(request, f"Revoked: {grant.describe()}.")
    return redirect("approvals:grants")

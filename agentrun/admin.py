"""Admin for every agentrun model. Decisions are the audit trail: read-only for everyone."""

from __future__ import annotations

import csv
import json
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.helpers import ActionForm
from django.contrib.admin.utils import quote as admin_quote
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.html import format_html

from agentrun.core import access, receipts
from agentrun.core.access import CANCEL_PERMISSION, can_decide, in_agent_scope
from agentrun.core.errors import AgentRunError
from agentrun.core.exports import CSV_COLUMNS, decision_csv_row
from agentrun.core.models import (
    AuditChainHead,
    AuditReceipt,
    BackgroundTask,
    Decision,
    Message,
    OutboxEvent,
    Run,
    RunChunk,
    RunStep,
    Snapshot,
    StandingGrant,
    SuspendedToolCall,
    Thread,
    ToolEffect,
)
from agentrun.engine.decisions import (
    DEFAULT_GRANT_DAYS,
    approvals_given,
    cancel_run,
    check_grant,
    create_grant,
    inner_call,
    revoke_grant,
    shown_args,
    shown_fingerprint,
)
from agentrun.engine.service import Decider, DecisionCommand, decide


def admin_link(model: str, pk: Any, text: Any = None) -> str:
    """A link to an object's change page; ids may hold any character ("/", "_2F", …): admin-quoted."""
    if pk is None:
        return "—"
    url = reverse(f"admin:agentrun_{model}_change", args=[admin_quote(pk)])
    return format_html('<a href="{}">{}</a>', url, text if text is not None else pk)


def changelist_link(model: str, text: str, **filters: Any) -> str:
    query = urlencode(filters)
    return format_html('<a href="{}?{}">{}</a>', reverse(f"admin:agentrun_{model}_changelist"), query, text)


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ScopedAdmin(admin.ModelAdmin):
    """Lists and pages only rows of agents the user may see (``agentrun.core.access``, the rule every
    other door applies): a staff user of one team does not read another team's runs, arguments or
    decisions here. ``agent_fields`` name the agent ids a row belongs to (a call surfaced from a
    sub-agent belongs to both agents)."""

    agent_fields: tuple[str, ...] = ("agent_id",)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request)
        hidden = access.hidden_agent_ids(request.user)
        for field in self.agent_fields if hidden else ():
            if field == "run_id":  # a run id kept as text (no foreign key): the run's agent
                queryset = queryset.exclude(run_id__in=Run.objects.filter(agent_id__in=hidden).values("pk"))
            else:
                queryset = queryset.exclude(**{f"{field}__in": hidden})
        return queryset


class ViewOnlyAdmin(ScopedAdmin):
    """What only the engine writes: runs, steps, snapshots, calls, chunks, messages, background tasks, the
    decisions (the audit trail), and the side records the engine keeps (outbox events, tool effects,
    idempotency keys, listing counters kept by triggers, heartbeats). Nobody adds, edits or deletes them
    here, superusers included; what a person may do to them goes through the engine (the actions below)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RunLinkMixin:
    """A ``run_link`` column for every model that belongs to a run."""

    @admin.display(description="run", ordering="run")
    def run_link(self, obj: Any) -> str:
        return admin_link("run", obj.run_id)


@admin.register(Thread)
class ThreadAdmin(ScopedAdmin):
    agent_fields = ("runs__agent_id",)
    list_display = ["id", "resource_id", "created_at", "runs_link", "messages_link"]
    search_fields = ["id", "resource_id"]
    date_hierarchy = "created_at"

    @admin.display(description="runs")
    def runs_link(self, obj: Thread) -> str:
        return changelist_link("run", "runs", thread__id__exact=obj.id)

    @admin.display(description="messages")
    def messages_link(self, obj: Thread) -> str:
        return changelist_link("message", "messages", thread__id__exact=obj.id)


class StepInline(ReadOnlyInline):
    model = RunStep
    fields = ["id", "type", "status", "created_at", "completed_at", "usage"]
    readonly_fields = fields


class SuspendedCallInline(ReadOnlyInline):
    model = SuspendedToolCall
    fields = ["tool_call_id", "tool_name", "status", "requires_approval", "decision", "created_at"]
    readonly_fields = fields


@admin.action(description="Cancel selected runs", permissions=["cancel"])
def cancel_selected_runs(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    """Cancel through the engine (as ``POST /api/runs/{id}/cancel``): its calls, open steps and snapshot go."""
    cancelled = 0
    for run_id, agent_id in queryset.values_list("id", "agent_id"):
        if not in_agent_scope(request.user, agent_id):
            messages.error(request, f"{run_id}: you may not cancel this agent's runs.")
            continue
        try:
            cancel_run(run_id=run_id, agent_id=agent_id)
            cancelled += 1
        except AgentRunError as exc:
            messages.error(request, f"{run_id}: {exc.message}")
    if cancelled:
        messages.success(request, f"Cancelled {cancelled} run(s).")


@admin.register(Run)
class RunAdmin(ViewOnlyAdmin):
    actions = [cancel_selected_runs]

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(CANCEL_PERMISSION)

    list_display = ["id", "agent_id", "status", "thread_link", "resource_id", "created_at", "completed_at"]
    list_filter = ["agent_id", "status"]
    search_fields = ["id", "thread__id", "resource_id", "suspended_calls__tool_call_id"]
    date_hierarchy = "created_at"
    list_select_related = ["thread"]
    raw_id_fields = ["thread", "parent_run"]
    readonly_fields = ["dashboard_link", "decisions_link", "chunks_link"]
    inlines = [StepInline, SuspendedCallInline]

    @admin.display(description="thread", ordering="thread")
    def thread_link(self, obj: Run) -> str:
        return admin_link("thread", obj.thread_id)

    @admin.display(description="dashboard")
    def dashboard_link(self, obj: Run) -> str:
        return format_html('<a href="{}">open in the reviewer dashboard</a>', reverse("approvals:run", args=[obj.pk]))

    @admin.display(description="decisions")
    def decisions_link(self, obj: Run) -> str:
        return changelist_link("decision", "decisions of this run", run__id__exact=obj.pk)

    @admin.display(description="chunks")
    def chunks_link(self, obj: Run) -> str:
        return changelist_link("runchunk", "chunk log", run__id__exact=obj.pk)


@admin.register(RunStep)
class RunStepAdmin(RunLinkMixin, ViewOnlyAdmin):
    list_display = ["id", "run_link", "agent_id", "type", "status", "created_at", "completed_at"]
    list_filter = ["agent_id", "type", "status"]
    search_fields = ["id", "run__id", "thread_id"]
    date_hierarchy = "created_at"
    raw_id_fields = ["run"]


@admin.register(Message)
class MessageAdmin(RunLinkMixin, ViewOnlyAdmin):
    agent_fields = ("run__agent_id",)
    list_display = ["id", "thread_link", "run_link", "role", "short_content", "tool_name", "created_at"]
    list_filter = ["role", "tool_status"]
    search_fields = ["id", "thread__id", "run__id", "tool_call_id", "content"]
    date_hierarchy = "created_at"
    raw_id_fields = ["thread", "run"]

    @admin.display(description="content")
    def short_content(self, obj: Message) -> str:
        return obj.content[:80]

    @admin.display(description="thread", ordering="thread")
    def thread_link(self, obj: Message) -> str:
        return admin_link("thread", obj.thread_id)


@admin.register(Snapshot)
class SnapshotAdmin(RunLinkMixin, ViewOnlyAdmin):
    list_display = ["run_link", "agent_id", "thread_id", "resource_id", "created_at", "suspended_at", "expires_at"]
    list_filter = ["agent_id"]
    search_fields = ["run__id", "thread_id", "resource_id"]
    date_hierarchy = "suspended_at"
    raw_id_fields = ["run", "step"]


class DecideActionForm(ActionForm):
    reason = forms.CharField(required=False, label="Reason", help_text="Shown to the model when declining.")


def _decide_selected(kind: str, modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> Any:
    """Approve / decline the selected open calls — after an intermediate page, as Django's "delete
    selected" does: it lists each call's tool, arguments, risk and approvals, and decides only on its
    confirmed POST, each call bound to the fingerprint of the arguments it showed; a high-risk call takes
    a second step (a box to tick). Every decision goes through the one decision service (the admin is
    one of its doors, with no rule of its own)."""
    calls = list(queryset.filter(status=SuspendedToolCall.Status.OPEN).select_related("run").order_by("created_at"))
    if not calls:
        messages.info(request, "None of the selected tool calls waits for a decision.")
        return None
    rows = [_confirmation_row(call) for call in calls]
    reason = (request.POST.get("reason") or "").strip() or None
    error = ""
    if request.POST.get("post") == "yes":
        if kind == "approve" and any(r["high"] for r in rows) and not request.POST.get("confirm_high_risk"):
            error = "Tick the box to confirm the high-risk calls, or go back."
        else:
            _decide_confirmed(kind, request, calls, reason)
            return None
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": f"{kind.capitalize()} {len(rows)} tool call{'s' if len(rows) != 1 else ''}?",
        "kind": kind,
        "rows": rows,
        "reason": reason or "",
        "error": error,
        "any_high": any(r["high"] for r in rows),
        "opts": modeladmin.model._meta,
        "action": f"{kind}_selected_calls",
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, "admin/agentrun/decide_confirmation.html", context)


def _confirmation_row(call: SuspendedToolCall) -> dict[str, Any]:
    inner = inner_call(call)
    given = approvals_given(call)
    return {
        "call": call,
        "tool": f"{call.inner_agent_id} → {inner.tool_name}" if inner is not None else call.tool_name,
        "args": json.dumps(shown_args(call, inner), indent=2, ensure_ascii=False, sort_keys=True),
        "fingerprint": shown_fingerprint(call),
        "high": call.risk == SuspendedToolCall.Risk.HIGH,
        "approvals": f"{len(given)} of {call.approvals_required} approvals" if call.approvals_required > 1 else "",
    }


def _decide_confirmed(kind: str, request: HttpRequest, calls: list[SuspendedToolCall], reason: str | None) -> None:
    decided = waiting = 0
    decider = Decider.person(request.user, via=Decision.Via.DASHBOARD)
    for call in calls:
        try:
            outcome = decide(
                DecisionCommand.one(
                    agent_id=call.run.agent_id,
                    run_id=call.run_id,
                    tool_call_id=call.tool_call_id,
                    kind=kind,
                    reason=reason,
                    # What the confirmation page showed; a call that changed since is refused.
                    args_fingerprint=request.POST.get(f"fingerprint-{call.pk}") or None,
                    decider=decider,
                )
            )
            if outcome.decision.completes:
                decided += 1
            else:
                waiting += 1
        except AgentRunError as exc:
            messages.error(request, f"{call.tool_call_id}: {exc.message}")
    if decided:
        messages.success(request, f"{kind.capitalize()}d {decided} tool call(s).")
    if waiting:
        messages.success(request, f"Recorded {waiting} approval(s); those calls wait for another person's approval.")


@admin.action(description="Approve selected open calls…", permissions=["decide"])
def approve_selected_calls(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> Any:
    return _decide_selected("approve", modeladmin, request, queryset)


@admin.action(description="Decline selected open calls…", permissions=["decide"])
def decline_selected_calls(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> Any:
    return _decide_selected("decline", modeladmin, request, queryset)


@admin.register(SuspendedToolCall)
class SuspendedToolCallAdmin(RunLinkMixin, ViewOnlyAdmin):
    agent_fields = ("run__agent_id", "inner_agent_id")
    action_form = DecideActionForm
    actions = [approve_selected_calls, decline_selected_calls]

    def has_decide_permission(self, request: HttpRequest) -> bool:
        return can_decide(request.user)

    list_display = [
        "tool_call_id",
        "tool_name",
        "status",
        "requires_approval",
        "run_link",
        "decision_link",
        "created_at",
    ]
    list_filter = ["status", "requires_approval", "tool_name", "run__agent_id"]
    search_fields = ["tool_call_id", "run__id", "run__thread__id", "run__resource_id"]
    date_hierarchy = "created_at"
    list_select_related = ["run"]
    raw_id_fields = ["run", "step", "decision"]

    @admin.display(description="decision")
    def decision_link(self, obj: SuspendedToolCall) -> str:
        return admin_link("decision", obj.decision_id)


RECEIPT_FIELDS = ["seq", "key_id", "prev_hash", "signature", "hash"]


@admin.action(description="Export selected decisions as CSV")
def export_decisions_csv(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="decisions-{stamp}.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for d in queryset.order_by("decided_at", "id"):
        writer.writerow(decision_csv_row(d))
    return response


JSON_SEARCH_COLUMNS = ("args", "edited_args", "inner_args", "resume_data")
REASON_SHOWN = 100
THREAD_SHOWN = 40


@admin.register(Decision)
class DecisionAdmin(RunLinkMixin, ViewOnlyAdmin):
    """The audit trail: nobody adds, edits or deletes a decision here, superusers included. A decision on
    a call surfaced from a sub-agent shows (and is found by) the inner tool the reviewer saw."""

    agent_fields = ("agent_id", "inner_agent_id")

    # Times to the second with their zone, the thread, the tool the reviewer saw, whether it was edited,
    # the reason and the door (docs/dashboard.md#the-admin). The time links to the record; ids wrap
    # (static/admin-decisions.css) so the list fits 1280 px and stacks, labelled, on a phone.
    list_display = [
        "decided",
        "kind",
        "agent",
        "thread_link",
        "seen_tool",
        "risk",
        "edited",
        "reason_text",
        "by",
        "via",
        "run_link",
    ]
    list_display_links = ["decided"]
    list_filter = ["kind", "via", "risk", "agent_id", "decided_by_username"]
    # Arguments (as the reviewer saw them, and an edit) and reasons are searched too: their JSON text.
    search_fields = [
        "id",
        "run__id",
        "thread_id",
        "tool_call_id",
        "tool_name",
        "inner_tool_name",
        "inner_agent_id",
        "decided_by_username",
        "run__resource_id",
        "reason",
        "args",
        "edited_args",
        "inner_args",
        "resume_data",
    ]
    date_hierarchy = "decided_at"
    actions = [export_decisions_csv]

    class Media:
        css = {"all": ["admin-decisions.css"]}

    def get_list_display(self, request: HttpRequest) -> list[str]:
        return [*self.list_display, "receipt"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields]

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        escaped = json.dumps(search_term.strip())[1:-1]
        if search_term.strip() and escaped != search_term.strip():
            # A database that keeps JSON as text with non-ASCII characters escaped (SQLite) stores "Zoë" as
            # "Zo\u00eb": look for that spelling in the argument columns as well.
            json_match = Q()
            for column in JSON_SEARCH_COLUMNS:
                json_match |= Q(**{f"{column}__icontains": escaped})
            results = results | queryset.filter(json_match)
        return results, may_have_duplicates

    @admin.display(description="decided", ordering="decided_at")
    def decided(self, obj: Decision) -> str:
        """To the second, in the admin's time zone, which it names (``2026-01-10 12:00:05 UTC``)."""
        return date_format(timezone.localtime(obj.decided_at), "Y-m-d H:i:s T")

    @admin.display(description="agent", ordering="agent_id")
    def agent(self, obj: Decision) -> str:
        return obj.agent_id

    @admin.display(description="by", ordering="decided_by_username")
    def by(self, obj: Decision) -> str:
        return obj.decided_by_username or "—"

    @admin.display(description="thread", ordering="thread_id")
    def thread_link(self, obj: Decision) -> str:
        # A long thread id is shortened in the middle (its start and its end tell threads apart); the full
        # id is the link's title and its target, and the search box finds it.
        shown = obj.thread_id
        if len(shown) > THREAD_SHOWN:
            shown = shown[: THREAD_SHOWN - 13] + "…" + shown[-12:]
        return format_html('<span title="{}">{}</span>', obj.thread_id, admin_link("thread", obj.thread_id, shown))

    @admin.display(description="edited", boolean=True)
    def edited(self, obj: Decision) -> bool:
        return obj.edited_args is not None

    @admin.display(description="reason", ordering="reason")
    def reason_text(self, obj: Decision) -> str:
        if not obj.reason:
            return "—"
        shown = obj.reason if len(obj.reason) <= REASON_SHOWN else obj.reason[: REASON_SHOWN - 1] + "…"
        return format_html('<span title="{}">{}</span>', obj.reason, shown)

    @admin.display(description="tool", ordering="tool_name")
    def seen_tool(self, obj: Decision) -> str:
        """The tool the reviewer saw: ``billing-agent → refund`` for a sub-agent's call."""
        return f"{obj.inner_agent_id} → {obj.inner_tool_name}" if obj.inner_run_id else obj.tool_name

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Each row's receipt and the hash of the receipt before it (receipt_check): one query for the page.
        receipt = AuditReceipt.objects.filter(decision_id=OuterRef("pk"))
        previous = AuditReceipt.objects.filter(seq=OuterRef("receipt_seq") - 1)
        return (
            super()
            .get_queryset(request)
            .annotate(**{f"receipt_{name}": Subquery(receipt.values(name)[:1]) for name in RECEIPT_FIELDS})
            .annotate(receipt_previous_hash=Subquery(previous.values("hash")[:1]))
        )

    @admin.display(description="receipt")
    def receipt(self, obj: Decision) -> str:
        """✓ when its receipt verifies (signature, record, link to the receipt before it); else why not."""
        problem = receipts.check_annotated(obj, receipts.trusted_keys())
        return format_html('<span title="{}">{}</span>', problem or "verifies", "✗ " + problem if problem else "✓")

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        if request.method == "GET":
            self._say_whether_the_chain_verifies(request)
        return super().changelist_view(request, extra_context)

    def _say_whether_the_chain_verifies(self, request: HttpRequest) -> None:
        """The whole chain while it is small enough to check on a page load; past that, the command does."""
        count = AuditReceipt.objects.count()
        if count > settings.AGENTRUN_AUDIT_ADMIN_VERIFY_MAX:
            messages.info(
                request,
                f"{count} receipts: too many to verify on this page (each row's is checked); "
                "`python manage.py agentrun_audit verify` checks the whole chain.",
            )
            return
        checker, failure = receipts.verify_database(receipts.trusted_keys())
        if failure is None:
            messages.success(request, f"Audit chain verifies: {checker.count} receipt(s), every decision signed.")
        else:
            messages.error(request, f"Audit chain does not verify: {failure.decision_id}: {failure.reason}")


@admin.register(AuditReceipt)
class AuditReceiptAdmin(ViewOnlyAdmin):
    """Receipts are append-only like the decisions they sign (``manage.py agentrun_audit`` verifies them)."""

    list_display = ["seq", "decision_id", "key_id", "hash", "created_at"]
    search_fields = ["decision_id", "hash"]


@admin.register(AuditChainHead)
class AuditChainHeadAdmin(ViewOnlyAdmin):
    list_display = ["seq", "decision_id", "hash"]


@admin.register(RunChunk)
class RunChunkAdmin(RunLinkMixin, ViewOnlyAdmin):
    agent_fields = ("run__agent_id",)
    list_display = ["id", "run_link", "seq", "type", "created_at"]
    list_filter = ["type"]
    search_fields = ["run__id"]
    date_hierarchy = "created_at"
    raw_id_fields = ["run"]


@admin.register(ToolEffect)
class ToolEffectAdmin(ViewOnlyAdmin):
    agent_fields = ("run_id",)
    list_display = ["tool_call_id", "tool_name", "run_id", "created_at"]
    list_filter = ["tool_name"]
    search_fields = ["tool_call_id", "run_id"]
    date_hierarchy = "created_at"


@admin.register(BackgroundTask)
class BackgroundTaskAdmin(RunLinkMixin, ViewOnlyAdmin):
    list_display = ["id", "tool_name", "status", "agent_id", "run_link", "attempts", "created_at", "completed_at"]
    list_filter = ["status", "agent_id", "tool_name"]
    search_fields = ["id", "run__id", "thread_id", "tool_call_id"]
    date_hierarchy = "created_at"
    list_select_related = ["run"]
    raw_id_fields = ["run"]


# --- standing grants ----------------------------------------------------------------------------
# A grant approves future calls without anyone seeing them: the admin makes and revokes them through
# the decision service's own rules (engine.decisions.check_grant / create_grant / revoke_grant), as the
# call card does — a staff user who may add a grant but not decide the agent gets nothing.
@admin.action(description="Revoke selected grants")
def revoke_grants(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    revoked = 0
    decider = Decider.person(request.user, via=Decision.Via.DASHBOARD)
    for grant in queryset.filter(revoked_at__isnull=True):
        try:
            revoked += revoke_grant(grant, decider)
        except AgentRunError as exc:
            messages.error(request, f"{grant.id}: {exc.message}")
    if revoked:
        messages.success(request, f"Revoked {revoked} grant(s).")


class GrantForm(forms.ModelForm):
    expires_at = forms.DateTimeField(
        required=False,
        help_text=f"Empty: {DEFAULT_GRANT_DAYS} days from now (at most AGENTRUN_GRANT_MAX_DAYS).",
    )

    class Meta:
        model = StandingGrant
        fields = ["agent_id", "tool_name", "scope", "scope_id", "expires_at"]

    request: HttpRequest

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.errors:
            return cleaned
        proposed = StandingGrant(**{name: cleaned.get(name) for name in self.Meta.fields})
        try:
            check_grant(proposed, Decider.person(self.request.user, via=Decision.Via.DASHBOARD))
        except AgentRunError as exc:
            raise forms.ValidationError(exc.message) from exc
        return cleaned


@admin.register(StandingGrant)
class StandingGrantAdmin(ScopedAdmin):
    """Grants are part of the audit trail: added here or from a call card, revoked, never edited or deleted."""

    form = GrantForm
    list_display = [
        "id",
        "tool_name",
        "agent_id",
        "scope",
        "scope_id",
        "created_by_username",
        "expires_at",
        "revoked_at",
    ]
    list_filter = ["agent_id", "tool_name", "scope"]
    search_fields = ["id", "scope_id", "tool_name", "created_by_username"]
    date_hierarchy = "created_at"
    fields = ["agent_id", "tool_name", "scope", "scope_id", "expires_at"]
    actions = [revoke_grants]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"request": request})

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in StandingGrant._meta.fields] if obj is not None else []

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in StandingGrant._meta.fields] if obj is not None else self.fields

    def save_model(self, request: HttpRequest, obj: StandingGrant, form: Any, change: bool) -> None:
        if change:  # nothing of a grant is edited (every field is read-only once it exists)
            return
        create_grant(obj, Decider.person(request.user, via=Decision.Via.DASHBOARD))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(OutboxEvent)
class OutboxEventAdmin(ViewOnlyAdmin):
    list_display = ["id", "type", "agent_id", "run_id", "created_at", "handled_at"]
    list_filter = ["type", "agent_id"]
    search_fields = ["id", "run_id"]
    date_hierarchy = "created_at"


def _register_the_rest() -> None:
    """The engine's side records without an admin of their own (idempotency keys, the listing counters
    kept by triggers, heartbeats) show up view-only: editing one breaks what it backs."""
    from django.apps import apps

    for model in apps.get_app_config("agentrun").get_models():
        if not admin.site.is_registered(model):
            names = [f.name for f in model._meta.fields]
            admin.site.register(
                model,
                type(
                    f"{model.__name__}Admin",
                    (ViewOnlyAdmin,),
                    {
                        "agent_fields": tuple(n for n in ("agent_id", "run_id") if n in names),
                        "list_display": names[:6],
                        "search_fields": [n for n in names if n in ("id", "key", "run", "run_id", "tool_call_id")],
                        "date_hierarchy": "created_at" if "created_at" in names else None,
                    },
                ),
            )


_register_the_rest()

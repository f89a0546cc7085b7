"""Admin for every agentrun model. Decisions are the audit trail: read-only for everyone."""

from __future__ import annotations

import csv
import json
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.contrib.admin.utils import quote as admin_quote
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from agentrun.core.access import CANCEL_PERMISSION, can_decide, can_decide_agent, in_agent_scope
from agentrun.core.errors import AgentRunError
from agentrun.core.models import (
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
from agentrun.engine.decisions import cancel_run
from agentrun.engine.service import decide_tool_call


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


class ViewOnlyAdmin(admin.ModelAdmin):
    """What only the engine writes: runs, steps, snapshots, calls, chunks, messages, background tasks, and
    the decisions (the audit trail). Nobody adds, edits or deletes them here, superusers included; what a
    person may do to them goes through the engine (the admin actions below)."""

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
class ThreadAdmin(admin.ModelAdmin):
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


def _decide_selected(kind: str, request: HttpRequest, queryset: QuerySet) -> None:
    """Decide each selected open call through the one decision service (the admin is one of its doors)."""
    reason = (request.POST.get("reason") or "").strip() or None
    decided = 0
    for call in queryset.filter(status=SuspendedToolCall.Status.OPEN).select_related("run"):
        try:
            decide_tool_call(
                agent_id=call.run.agent_id,
                run_id=call.run_id,
                tool_call_id=call.tool_call_id,
                kind=kind,
                reason=reason,
                decided_by=request.user,
                via=Decision.Via.DASHBOARD,
            )
            decided += 1
        except AgentRunError as exc:
            messages.error(request, f"{call.tool_call_id}: {exc.message}")
    if decided:
        messages.success(request, f"{kind.capitalize()}d {decided} tool call(s).")


@admin.action(description="Approve selected open calls", permissions=["decide"])
def approve_selected_calls(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _decide_selected("approve", request, queryset)


@admin.action(description="Decline selected open calls", permissions=["decide"])
def decline_selected_calls(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _decide_selected("decline", request, queryset)


@admin.register(SuspendedToolCall)
class SuspendedToolCallAdmin(RunLinkMixin, ViewOnlyAdmin):
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


CSV_COLUMNS = [
    "id",
    "decided_at",
    "kind",
    "agent_id",
    "run_id",
    "thread_id",
    "tool_call_id",
    "tool_name",
    "risk",
    "decided_by_username",
    "via",
    "reason",
    "args",
    "edited_args",
    "resume_data",
]


@admin.action(description="Export selected decisions as CSV")
def export_decisions_csv(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="decisions-{stamp}.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for d in queryset.order_by("decided_at", "id"):
        row = []
        for column in CSV_COLUMNS:
            value = getattr(d, column)
            if column in ("args", "edited_args", "resume_data"):
                value = "" if value is None else json.dumps(value, ensure_ascii=False)
            elif column == "decided_at":
                value = value.isoformat()
            row.append("" if value is None else value)
        writer.writerow(row)
    return response


@admin.register(Decision)
class DecisionAdmin(RunLinkMixin, ViewOnlyAdmin):
    """The audit trail: nobody adds, edits or deletes a decision here, superusers included."""

    list_display = [
        "id",
        "decided_at",
        "kind",
        "agent_id",
        "tool_name",
        "risk",
        "decided_by_username",
        "via",
        "run_link",
    ]
    list_filter = ["kind", "via", "risk", "agent_id", "decided_by_username"]
    search_fields = ["id", "run__id", "thread_id", "tool_call_id", "decided_by_username", "run__resource_id"]
    date_hierarchy = "decided_at"
    actions = [export_decisions_csv]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields]


@admin.register(RunChunk)
class RunChunkAdmin(RunLinkMixin, ViewOnlyAdmin):
    list_display = ["id", "run_link", "seq", "type", "created_at"]
    list_filter = ["type"]
    search_fields = ["run__id"]
    date_hierarchy = "created_at"
    raw_id_fields = ["run"]


@admin.register(ToolEffect)
class ToolEffectAdmin(admin.ModelAdmin):
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
@admin.action(description="Revoke selected grants")
def revoke_grants(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    revoked = 0
    for grant in queryset.filter(revoked_at__isnull=True):
        if not can_decide_agent(request.user, grant.agent_id):
            messages.error(request, f"{grant.id}: you may not decide {grant.agent_id}'s calls.")
            continue
        revoked += StandingGrant.objects.filter(pk=grant.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by_username=request.user.get_username()
        )
    if revoked:
        messages.success(request, f"Revoked {revoked} grant(s).")


@admin.register(StandingGrant)
class StandingGrantAdmin(admin.ModelAdmin):
    """Grants are part of the audit trail: added here or from a call card, revoked, never edited or deleted."""

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

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in StandingGrant._meta.fields] if obj is not None else []

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in StandingGrant._meta.fields] if obj is not None else self.fields

    def save_model(self, request: HttpRequest, obj: StandingGrant, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user
            obj.created_by_username = request.user.get_username()
        super().save_model(request, obj, form, change)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(OutboxEvent)
class OutboxEventAdmin(ViewOnlyAdmin):
    list_display = ["id", "type", "agent_id", "run_id", "created_at", "handled_at"]
    list_filter = ["type", "agent_id"]
    search_fields = ["id", "run_id"]
    date_hierarchy = "created_at"


def _register_the_rest() -> None:
    """Models added later (idempotency keys, …) still show up, with a plain read-mostly admin."""
    from django.apps import apps

    for model in apps.get_app_config("agentrun").get_models():
        if not admin.site.is_registered(model):
            names = [f.name for f in model._meta.fields]
            admin.site.register(
                model,
                type(
                    f"{model.__name__}Admin",
                    (admin.ModelAdmin,),
                    {
                        "list_display": names[:6],
                        "search_fields": [n for n in names if n in ("id", "key", "run", "run_id", "tool_call_id")],
                        "date_hierarchy": "created_at" if "created_at" in names else None,
                    },
                ),
            )


_register_the_rest()

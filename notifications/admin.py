"""Admin: webhook endpoints, the delivery log (with "resend"), standing grants (revocable), preferences,
and read-only views of the outbox, email notices and decision links."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from agentrun.access import can_decide_agent
from agentrun.events import EVENT_TYPES
from agentrun.models import OutboxEvent, StandingGrant
from notifications import delivery, signatures
from notifications.models import DecisionLink, EmailNotice, NotificationPreference, WebhookDelivery, WebhookEndpoint

# agentrun's admin registers every model of its app it has no admin for; these have theirs here.
for _model in (OutboxEvent, StandingGrant):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- webhook endpoints --------------------------------------------------------------------------
class EndpointForm(forms.ModelForm):
    secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Write-only. Leave empty to keep the current one (a new endpoint gets a generated whsec_ secret).",
    )
    events = forms.MultipleChoiceField(
        choices=[(t, t) for t in EVENT_TYPES],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None checked: all events.",
    )
    agents = forms.CharField(required=False, help_text="Agent ids, comma-separated; empty: all agents.")

    class Meta:
        model = WebhookEndpoint
        fields = ["url", "secret", "events", "agents", "format", "active"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial["agents"] = ", ".join(self.instance.agents or [])

    def clean_secret(self) -> str:
        secret = self.cleaned_data["secret"]
        if not secret:
            return self.instance.secret or signatures.new_secret()
        if problem := signatures.secret_problem(secret):
            raise forms.ValidationError(problem)
        return secret

    def clean_agents(self) -> list[str]:
        return [a.strip() for a in self.cleaned_data["agents"].split(",") if a.strip()]


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = EndpointForm
    list_display = ["id", "url", "format", "active", "events_list", "agents_list", "created_at"]
    list_filter = ["active", "format"]
    search_fields = ["id", "url"]

    @admin.display(description="events")
    def events_list(self, obj: WebhookEndpoint) -> str:
        return ", ".join(obj.events) or "all"

    @admin.display(description="agents")
    def agents_list(self, obj: WebhookEndpoint) -> str:
        return ", ".join(obj.agents) or "all"


@admin.action(description="Resend selected deliveries now", permissions=["resend"])
def resend_deliveries(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    count = delivery.resend(list(queryset.values_list("id", flat=True)))
    messages.success(request, f"Resending {count} deliver{'y' if count == 1 else 'ies'}.")


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    """The delivery log: status, attempts, response code, next retry."""

    list_display = [
        "id",
        "endpoint",
        "event_type",
        "status",
        "attempts",
        "response_status",
        "next_attempt_at",
        "last_attempt_at",
    ]
    list_filter = ["status", "endpoint"]
    search_fields = ["id", "event__id", "event__run_id"]
    list_select_related = ["endpoint", "event"]
    date_hierarchy = "created_at"
    actions = [resend_deliveries]

    @admin.display(description="event", ordering="event__type")
    def event_type(self, obj: WebhookDelivery) -> str:
        return obj.event.type

    def has_resend_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("notifications.change_webhookdelivery")


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


# --- the rest: read-only --------------------------------------------------------------------------
@admin.register(NotificationPreference)
class NotificationPreferenceAdmin(admin.ModelAdmin):
    list_display = ["user", "email", "updated_at"]
    list_filter = ["email"]
    search_fields = ["user__username", "user__email"]
    raw_id_fields = ["user"]


@admin.register(OutboxEvent)
class OutboxEventAdmin(ReadOnlyAdmin):
    list_display = ["id", "type", "agent_id", "run_id", "created_at", "handled_at"]
    list_filter = ["type", "agent_id"]
    search_fields = ["id", "run_id"]
    date_hierarchy = "created_at"


@admin.register(EmailNotice)
class EmailNoticeAdmin(ReadOnlyAdmin):
    list_display = ["id", "user", "event", "digest", "attempts", "sent_at", "next_attempt_at", "last_error"]
    list_filter = ["digest"]
    search_fields = ["user__username", "event__id"]
    list_select_related = ["user", "event"]


@admin.register(DecisionLink)
class DecisionLinkAdmin(ReadOnlyAdmin):
    list_display = ["id", "user", "agent_id", "run_id", "tool_call_id", "created_at", "expires_at", "used_at"]
    search_fields = ["id", "run_id", "tool_call_id", "user__username"]
    list_select_related = ["user"]
    date_hierarchy = "created_at"

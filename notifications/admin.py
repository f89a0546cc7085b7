"""Admin: webhook endpoints and Slack destinations, their delivery logs (with "resend"), preferences,
linked Slack accounts, and read-only views of email notices, decision links and Slack messages.
(Standing grants and the outbox are agentrun's models: ``agentrun.admin``.)"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from agentrun.admin import ScopedAdmin
from agentrun.core.outbox import EVENT_TYPES
from notifications import delivery, egress, signatures, slack
from notifications.models import (
    DecisionLink,
    EmailNotice,
    NotificationPreference,
    SlackDelivery,
    SlackDestination,
    SlackIdentity,
    SlackMessage,
    WebhookDelivery,
    WebhookEndpoint,
)


class ReadOnlyAdmin(ScopedAdmin):
    """Side records the notifications keep (deliveries, notices, links): view-only, and only those of
    the agents the user may see (``agentrun.admin.ScopedAdmin``, as every agentrun list)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
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

    def clean_url(self) -> str:
        url = self.cleaned_data["url"]
        if problem := egress.url_problem(url):  # loopback, private, link-local, … (docs/security.md)
            raise forms.ValidationError(problem)
        return url

    def clean_secret(self) -> str | None:
        """The new secret, or None to keep the current one (a new endpoint gets a generated one)."""
        secret = self.cleaned_data["secret"]
        if not secret:
            return None if self.instance.sealed_secret else signatures.new_secret()
        if problem := signatures.secret_problem(secret):
            raise forms.ValidationError(problem)
        return secret

    def clean_agents(self) -> list[str]:
        return [a.strip() for a in self.cleaned_data["agents"].split(",") if a.strip()]


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = EndpointForm
    list_display = ["id", "url", "format", "active", "events_list", "agents_list", "owner", "created_at"]
    readonly_fields = ["owner"]
    list_filter = ["active", "format"]
    search_fields = ["id", "url"]

    def save_model(self, request: HttpRequest, obj: WebhookEndpoint, form: EndpointForm, change: bool) -> None:
        secret = form.cleaned_data.get("secret")
        if secret is not None:
            obj.secret = secret
        obj.owner = request.user  # it shows what the person who last set it up may see
        super().save_model(request, obj, form, change)
        if secret is not None and not form.data.get("secret"):
            # Generated: shown this once, never again (the table holds it encrypted).
            messages.warning(request, f"The endpoint's signing secret, shown only now: {secret}")

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

    agent_fields = ("event__agent_id",)

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


# --- the rest: read-only --------------------------------------------------------------------------
@admin.register(NotificationPreference)
class NotificationPreferenceAdmin(admin.ModelAdmin):
    list_display = ["user", "email", "updated_at"]
    list_filter = ["email"]
    search_fields = ["user__username", "user__email"]
    raw_id_fields = ["user"]


@admin.register(EmailNotice)
class EmailNoticeAdmin(ReadOnlyAdmin):
    agent_fields = ("event__agent_id",)
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


# --- Slack (docs/slack.md) ------------------------------------------------------------------------------
class SlackDestinationForm(forms.ModelForm):
    bot_token = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Write-only. The app's bot token (xoxb-…). Leave empty to keep the current one.",
    )
    agents = forms.CharField(required=False, help_text="Agent ids, comma-separated; empty: all agents.")

    class Meta:
        model = SlackDestination
        fields = ["name", "bot_token", "channel", "agents", "active"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial["agents"] = ", ".join(self.instance.agents or [])

    def clean_bot_token(self) -> str | None:
        token = self.cleaned_data["bot_token"].strip()
        if not token and not self.instance.sealed_bot_token:
            raise forms.ValidationError("A new destination needs the app's bot token.")
        if any(ch.isspace() for ch in token):
            raise forms.ValidationError("A bot token has no spaces.")
        return token or None

    def clean_agents(self) -> list[str]:
        return [a.strip() for a in self.cleaned_data["agents"].split(",") if a.strip()]


@admin.register(SlackDestination)
class SlackDestinationAdmin(admin.ModelAdmin):
    form = SlackDestinationForm
    list_display = ["id", "name", "channel", "active", "agents_list", "owner", "created_at"]
    readonly_fields = ["owner"]
    list_filter = ["active"]
    search_fields = ["id", "name", "channel"]

    def save_model(self, request: HttpRequest, obj: SlackDestination, form: SlackDestinationForm, change: bool) -> None:
        token = form.cleaned_data.get("bot_token")
        if token is not None:
            obj.bot_token = token
        obj.owner = request.user  # it shows what the person who last set it up may see
        super().save_model(request, obj, form, change)

    @admin.display(description="agents")
    def agents_list(self, obj: SlackDestination) -> str:
        return ", ".join(obj.agents) or "all"


@admin.action(description="Resend selected Slack deliveries now", permissions=["resend"])
def resend_slack_deliveries(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    count = slack.resend(list(queryset.values_list("id", flat=True)))
    messages.success(request, f"Resending {count} Slack deliver{'y' if count == 1 else 'ies'}.")


@admin.register(SlackDelivery)
class SlackDeliveryAdmin(ReadOnlyAdmin):
    """The Slack delivery log: posts, updates and answers to clicks, with status and attempts."""

    agent_fields = ("message__agent_id",)
    list_display = ["id", "message", "action", "status", "attempts", "response_status", "last_error", "next_attempt_at"]
    list_filter = ["status", "action"]
    search_fields = ["id", "message__id", "message__run_id"]
    list_select_related = ["message"]
    date_hierarchy = "created_at"
    exclude = ["url", "body"]  # a response_url is a credential for a while; the body is rebuilt anyway
    actions = [resend_slack_deliveries]

    def has_resend_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("notifications.change_slackdelivery")


@admin.register(SlackMessage)
class SlackMessageAdmin(ReadOnlyAdmin):
    list_display = ["id", "destination", "agent_id", "run_id", "tool_call_id", "suspension", "ts", "created_at"]
    search_fields = ["id", "run_id", "tool_call_id"]
    list_select_related = ["destination"]


@admin.register(SlackIdentity)
class SlackIdentityAdmin(admin.ModelAdmin):
    """Linked Slack accounts: deleting one unlinks it (its Slack user decides nothing until linked again)."""

    list_display = ["team_id", "slack_user_id", "user", "linked_at"]
    search_fields = ["team_id", "slack_user_id", "user__username"]
    raw_id_fields = ["user"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # linked by the person, with their code: never on their behalf

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

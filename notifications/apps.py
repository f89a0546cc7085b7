from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_delete, post_save


class NotificationsConfig(AppConfig):
    """Webhooks, email to reviewers, signed decision links, standing grants' pages (issue 14), Slack (issue 22)."""

    name = "notifications"
    verbose_name = "Notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from agentrun.core import outbox, retention
        from notifications.delivery import notifier, retention_kinds
        from notifications.models import NotificationPreference, SlackDestination, WebhookEndpoint

        outbox.add_listener(notifier)
        for kind in retention_kinds():
            retention.add_kind(kind)
        # Who subscribes changed in this process: the listener's view is read again at once.
        for model in (WebhookEndpoint, SlackDestination, NotificationPreference, settings.AUTH_USER_MODEL):
            for signal in (post_save, post_delete):
                signal.connect(notifier.invalidate, sender=model, dispatch_uid=f"notifications.invalidate.{model}")

from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate, post_save


class CoreConfig(AppConfig):
    """agentrun's tables. The label stays ``agentrun`` (table names, migrations, permissions, admin URLs)."""

    name = "agentrun.core"
    label = "agentrun"
    verbose_name = "Agent runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from agentrun.core import authcache, outages
        from agentrun.core.access import ensure_groups, revoke_grants_of_deactivated
        from agentrun.core.receipts import install_triggers

        post_migrate.connect(ensure_groups, sender=self, dispatch_uid="agentrun.ensure_groups")
        # Decisions and receipts stay append-only whatever a migration did to their tables (SQLite drops a
        # table's triggers when it rebuilds it).
        post_migrate.connect(install_triggers, sender=self, dispatch_uid="agentrun.audit_triggers")
        post_save.connect(
            revoke_grants_of_deactivated, sender=settings.AUTH_USER_MODEL, dispatch_uid="agentrun.revoke_grants"
        )
        # Cached identities are forgotten when a token, user, group or permission changes (core/authcache.py).
        authcache.connect_signals()
        # One line per outage and one when it ends, not a traceback per operation (core/outages.py).
        connection_created.connect(outages.database_connected, dispatch_uid="agentrun.database_connected")
        outages.watch_libraries()

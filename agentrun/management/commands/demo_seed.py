"""Create the demo reviewer (and viewer) accounts and a few suspended runs to look at."""

from __future__ import annotations

import asyncio
import os
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from agentrun.core.access import REVIEWERS, VIEWERS, ensure_groups
from agentrun.core.models import Snapshot

SEED_THREAD_PREFIX = "demo-"
RESET_ENV = "AGENTRUN_RESET_DEMO_PASSWORD"


class Command(BaseCommand):
    help = "Create demo accounts (reviewer, viewer) and seed suspended runs for the demo agents."
    announce = True  # say how to sign in at the end (``manage.py demo`` says it itself, once the server listens)

    def handle(self, *args: object, **options: object) -> None:
        ensure_groups()
        # How to sign in, said last (after the seeded runs' emails): ``manage.py demo`` says it again
        # once the server listens, as the very last lines of ``make demo``.
        self.signin: list[str] = []
        # Staff only where the account needs the admin: the reviewer audits there (scoped to its
        # agents, view-only but for the decision actions); the viewer reads the dashboard only.
        for username, group, env, staff in (
            ("reviewer", REVIEWERS, "AGENTRUN_REVIEWER_PASSWORD", True),
            ("viewer", VIEWERS, "AGENTRUN_VIEWER_PASSWORD", False),
        ):
            self._account(username, group, env, staff)
        if Snapshot.objects.filter(thread_id__startswith=SEED_THREAD_PREFIX).exists():
            self.stdout.write("Demo runs already seeded.")
        else:
            asyncio.run(_seed_runs())
            count = Snapshot.objects.filter(thread_id__startswith=SEED_THREAD_PREFIX).count()
            self.stdout.write(self.style.SUCCESS(f"Seeded {count} suspended runs."))
        if self.announce:
            for line in self.signin:
                self.stdout.write(self.style.WARNING(line))

    def _account(self, username: str, group_name: str, env: str, staff: bool) -> None:
        """Create the account; say how to sign in with it on every run (a new password when asked)."""
        user_model = get_user_model()
        # An address, so that the console shows the email (with its decision links) reviewers get.
        defaults = {"is_staff": staff, "email": f"{username}@example.com"}
        user, created = user_model.objects.get_or_create(username=username, defaults=defaults)
        if user.is_staff != staff:
            user_model.objects.filter(pk=user.pk).update(is_staff=staff)
        password = os.environ.get(env)
        if created or password or os.environ.get(RESET_ENV, "").strip().lower() in ("1", "true", "yes"):
            password = password or secrets.token_urlsafe(12)
            user.set_password(password)
            user.save()
            self.signin.append(f"Sign in as {username!r} with password: {password}")
        else:
            # The password is only stored hashed: it cannot be shown again, only replaced.
            self.signin.append(
                f"Sign in as {username!r} with the password printed when it was created "
                f"(forgot it? {RESET_ENV}=1 make demo sets a new one, or {env}=<password> make demo)."
            )
        user.groups.add(Group.objects.get(name=group_name))


async def _seed_runs() -> None:
    from agentrun.engine.agents import get_agent

    support = get_agent("support-agent")
    supervisor = get_agent("support-supervisor")
    # Each run says what it is about to do (``/say``, docs/runs.md#the-offline-model): the card shows the
    # agent's own words above the call, as it would for a real model.
    seeds = [
        (
            support,
            "demo-orders",
            "customer-42",
            "/say Ada asked where her refund is; I will email her that it is on its way.\n"
            '/tool send-email {"to": "ada@example.com", "subject": "Your refund", "body": "It is on its way."}',
        ),
        (
            support,
            "demo-cleanup",
            "customer-7",
            "/say The customer asked us to delete order 1017; I will delete it and tell operations.\n"
            '/tool delete-record {"table": "orders", "id": 1017}\n/tool send-email {"to": "ops@example.com", '
            '"subject": "Deleted order 1017", "body": "Removed at the customer\'s request."}',
        ),
        (
            support,
            "demo-travel",
            "customer-42",
            "/say The address on file is incomplete, so I need to ask before shipping.\n"
            '/tool ask-user {"question": "Which city should we ship to?"}',
        ),
        (
            supervisor,
            "demo-billing",
            "customer-9",
            "/say Order A-881 arrived damaged; I will ask billing to refund it.\n"
            '/tool agent-billing-agent {"message": "/say Refunding order A-881 in full: 25.50.\\n'
            '/tool refund {\\"orderId\\": \\"A-881\\", \\"amount\\": 25.5}"}',
        ),
    ]
    for agent, thread, resource, message in seeds:
        stream = await agent.stream(message, memory={"thread": thread, "resource": resource})
        await stream.collect()

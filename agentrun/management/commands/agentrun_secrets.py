"""``manage.py agentrun_secrets rotate``: encrypt every stored secret again with the first key of
``AGENTRUN_ENCRYPTION_KEYS`` (docs/security.md, "Secrets at rest")."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from agentrun.core import secretbox
from notifications.models import WebhookEndpoint


def rotate_all() -> int:
    """Re-encrypt every webhook secret with the newest key; how many. All or nothing."""
    with transaction.atomic():
        endpoints = list(WebhookEndpoint.objects.select_for_update().only("id", "sealed_secret"))
        for endpoint in endpoints:
            endpoint.sealed_secret = secretbox.reseal(endpoint.sealed_secret)
        WebhookEndpoint.objects.bulk_update(endpoints, ["sealed_secret"])
    return len(endpoints)


class Command(BaseCommand):
    help = "Stored secrets (webhook signing secrets): `rotate` re-encrypts them with the newest key."

    def add_arguments(self, parser) -> None:  # noqa: ANN001 - argparse's parser
        parser.add_argument("action", choices=["rotate"])

    def handle(self, *args: object, **options: object) -> None:
        try:
            count = rotate_all()
        except secretbox.UnreadableSecret as exc:
            raise CommandError(f"{exc}: keep the old key in AGENTRUN_ENCRYPTION_KEYS until rotation is done") from None
        self.stdout.write(f"Re-encrypted {count} secret(s) with the first key of AGENTRUN_ENCRYPTION_KEYS.")

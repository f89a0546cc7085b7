"""``python manage.py agentrun_prune [--dry-run]``: remove now everything past its retention (docs/operations.md
"Retention"), kind by kind in bounded batches, and print what was removed (or would be)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from agentrun.core import retention


class Command(BaseCommand):
    help = "Remove what is past its retention (outbox events, deliveries, notices, keys, …); --dry-run: only say."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--dry-run", action="store_true", help="count what would be removed, remove nothing")

    def handle(self, *args: Any, dry_run: bool = False, **options: Any) -> None:
        results = retention.would_prune() if dry_run else retention.prune_all()
        verb = "would be removed" if dry_run else "removed"
        for pruned in results.values():
            if pruned.kept_forever:
                self.stdout.write(f"{pruned.name}: kept ({pruned.setting} is not set)")
            else:
                self.stdout.write(f"{pruned.name}: {pruned.removed} {verb}")

"""``manage.py agentrun_audit verify | export | public-key``: the audit trail proves itself
(docs/security.md, "Audit receipts").

- ``verify``: every receipt in the database against its decision and the receipt before it; every
  decision has a receipt; the chain's head names the last one. Exit 0, or exit 1 printing the id of the
  first decision that fails (after a removal: the one that followed it) and why.
- ``verify --file F --public-key K``: an exported file, with no database (``K``: base64 or PEM of a
  public key, or a file holding it; repeat it for every key that signed, after rotations).
- ``export --file F``: the receipts as JSON lines (each with its decision's signed record), and the
  public key to verify them with.
- ``public-key``: the signing key's public key and key id.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentrun.core import receipts


class Command(BaseCommand):
    help = "Verify or export the audit receipts of the decisions (docs/security.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["verify", "export", "public-key"])
        parser.add_argument("--file", help="export: where to write; verify: an exported file to check")
        parser.add_argument(
            "--public-key", action="append", default=[], help="verify: a trusted public key (base64, PEM or a file)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "public-key":
            self._public_key()
        elif action == "export":
            if not options["file"]:
                raise CommandError("export needs --file")
            self._export(Path(options["file"]))
        else:
            self._verify(options["file"], options["public_key"])

    def _public_key(self) -> None:
        key = receipts.signing_key().public_key()
        self.stdout.write(f"Ed25519 public key {receipts.key_id(key)}: {receipts.public_key_text(key)}")

    def _export(self, path: Path) -> None:
        count = 0
        with path.open("w", encoding="utf-8") as file:
            for receipt, decision in receipts.chain():
                signed = receipts.record(decision) if decision is not None else {"id": receipt.decision_id}
                line = receipts.export_line(receipt, signed)
                file.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
                count += 1
        self.stdout.write(f"Exported {count} receipt(s) to {path}.")
        self._public_key()

    def _verify(self, file: str | None, public_keys: list[str]) -> None:
        try:
            keys = receipts.trusted_keys(public_keys) if file is None else self._file_keys(public_keys)
        except (ValueError, OSError) as exc:
            raise CommandError(f"--public-key: {exc}") from None
        if file is None:
            if not receipts.guards_installed():
                self.stderr.write("warning: the append-only triggers on decisions and receipts are missing")
            checker, failure = receipts.verify_database(keys)
        else:
            with Path(file).open(encoding="utf-8") as lines:
                checker, failure = receipts.verify_lines(lines, keys)
        if failure is not None:
            self.stdout.write(f"FAILED {failure.decision_id}: {failure.reason}")
            self.stdout.write(f"({checker.count} receipt(s) verified before it)")
            sys.stdout.flush()
            sys.exit(1)
        self.stdout.write(
            f"OK: {checker.count} receipt(s) verify (keys: {', '.join(sorted(checker.key_ids)) or 'none needed'})."
        )

    @staticmethod
    def _file_keys(public_keys: list[str]) -> dict:
        if not public_keys:
            raise CommandError("verify --file needs --public-key (the key the receipts were signed with)")
        keys = [receipts.parse_public_key(value) for value in public_keys]
        return {receipts.key_id(key): key for key in keys}

"""Audit receipts: every decision signed and chained, so that the audit trail proves itself
(docs/security.md, "Audit receipts").

A **receipt** is an Ed25519 signature over the RFC 8785 canonical JSON of the payload
``{"v": 1, "seq": n, "keyId": k, "prevHash": h, "record": {...}}``: the decision's record (every
stored field but the deciding account's row id, which a deleted account empties; fields that are
null are left out, so a field added later does not change the records signed before it), its place
in the chain, and the hash of the receipt before it. A receipt's hash is the SHA-256 of the canonical
JSON of its payload with its ``signature``: the next receipt signs it. ``seal`` writes the receipt in
the decision's own transaction, so a decision exists with its receipt or not at all.

The private key never enters the database: ``AGENTRUN_AUDIT_SIGNING_KEY`` (PEM, or base64 of the
32-byte seed) or ``AGENTRUN_AUDIT_SIGNING_KEY_FILE``; without either, one is generated in the data
directory (``audit_signing_key``, 0600) — the embedded default. Its key id (the first 16 hex digits of
the SHA-256 of the raw public key) is in each receipt; former public keys, listed in
``AGENTRUN_AUDIT_PUBLIC_KEYS``, keep older receipts verifiable after a rotation.

What verifying proves, and what it does not: a decision changed, removed or inserted by SQL, or a
rewrite whose hashes were recomputed without the private key, fails verification, in the database
and in an exported file. Whoever holds the private key can sign a new history; the last receipts
removed together with the chain head leave no trace unless an export or the head's hash was kept
elsewhere. Decisions are also append-only in the database (``install_triggers``): a trigger refuses
UPDATE and DELETE on decision and receipt rows, except clearing the deciding account when it is
deleted (the record keeps the username).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction

from agentrun.core import prepared
from agentrun.core.models import AuditChainHead, AuditReceipt, Decision
from agentrun.core.timeutil import iso

VERSION = 1
GENESIS = "0" * 64  # the "previous hash" of the first receipt
HEAD = 1  # the chain head's row
_SAFE_INTEGER = 2**53 - 1
# Not part of the record: the deciding account's row id (SET_NULL when the account is deleted; the
# record names the person by ``decided_by_username``).
_NOT_SIGNED = {"decided_by"}


# --- keys ---------------------------------------------------------------------------------------
def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_key_text(public_key: Ed25519PublicKey) -> str:
    """The public key as base64 of its 32 raw bytes (what ``--public-key`` takes, and the URL shows)."""
    return base64.b64encode(
        public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    ).decode()


def _text_or_file(value: str) -> bytes:
    """A key given as itself (PEM, base64) or as the path of a file holding it."""
    value = value.strip()
    if not value.startswith("-----") and Path(value).expanduser().is_file():
        return Path(value).expanduser().read_bytes()
    return value.encode()


def parse_private_key(data: bytes) -> Ed25519PrivateKey:
    try:
        if data.strip().startswith(b"-----"):
            key = serialization.load_pem_private_key(data, password=None)
        else:
            key = Ed25519PrivateKey.from_private_bytes(base64.b64decode(data.strip(), validate=False))
    except (ValueError, TypeError, binascii.Error) as exc:
        raise ImproperlyConfigured(f"the audit signing key is not an Ed25519 private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ImproperlyConfigured("the audit signing key is not an Ed25519 key")
    return key


def parse_public_key(value: str) -> Ed25519PublicKey:
    """A public key from base64 of its raw bytes, PEM, or a file holding either."""
    data = _text_or_file(value)
    try:
        if data.strip().startswith(b"-----"):
            key = serialization.load_pem_public_key(data)
        else:
            key = Ed25519PublicKey.from_public_bytes(base64.b64decode(data.strip(), validate=False))
    except (ValueError, TypeError, binascii.Error) as exc:
        raise ValueError(f"not an Ed25519 public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("not an Ed25519 public key")
    return key


def _generated_key_file() -> Path:
    """The embedded default's key: made once in the data directory, readable by this user only."""
    path = Path(settings.DATA_DIR) / "audit_signing_key"
    if not path.exists():
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)  # two processes: one writes it
        except FileExistsError:
            return path
        with os.fdopen(fd, "wb") as file:
            file.write(pem)
    return path


@cache
def _signing_key(raw: str, path: str, data_dir: str) -> Ed25519PrivateKey:
    if raw:
        return parse_private_key(raw.encode())
    return parse_private_key(Path(path or _generated_key_file()).read_bytes())


@cache
def _signing_key_id(key: Ed25519PrivateKey) -> str:
    return key_id(key.public_key())


def signing_key() -> Ed25519PrivateKey:
    return _signing_key(
        settings.AGENTRUN_AUDIT_SIGNING_KEY, settings.AGENTRUN_AUDIT_SIGNING_KEY_FILE, str(settings.DATA_DIR)
    )


def trusted_keys(extra: Iterable[str] = ()) -> dict[str, Ed25519PublicKey]:
    """Key id → public key: the signing key's, the former ones of ``AGENTRUN_AUDIT_PUBLIC_KEYS``, and
    ``extra`` (``--public-key``). Never read from the database: whoever could write the receipts could
    write a key there too."""
    keys = [parse_public_key(value) for value in [*settings.AGENTRUN_AUDIT_PUBLIC_KEYS, *extra]]
    keys.insert(0, signing_key().public_key())
    return {key_id(key): key for key in keys}


# --- records and receipts -----------------------------------------------------------------------
def _jsonable(value: Any) -> Any:
    """Datetimes as ISO text (microseconds, Z); integers RFC 8785 cannot hold exactly as their text."""
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, bool) or value is None or isinstance(value, float | str):
        return value
    if isinstance(value, int):
        return value if abs(value) <= _SAFE_INTEGER else str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


def record(decision: Decision) -> dict[str, Any]:
    """What a receipt signs of a decision: every stored field that is not null (``decided_by`` aside)."""
    fields = {}
    for field in type(decision)._meta.concrete_fields:  # the model as it is now, or a migration's
        if field.name in _NOT_SIGNED:
            continue
        value = getattr(decision, field.attname)
        if value is not None:
            fields[field.attname] = _jsonable(value)
    return fields


def canonical(value: Any) -> bytes:
    return rfc8785.dumps(value)


def receipt_hash(payload: dict[str, Any], signature: str) -> str:
    return hashlib.sha256(canonical({**payload, "signature": signature})).hexdigest()


def _payload(seq: int, kid: str, prev_hash: str, signed_record: dict[str, Any]) -> dict[str, Any]:
    return {"v": VERSION, "seq": seq, "keyId": kid, "prevHash": prev_hash, "record": signed_record}


def _head_for_update(heads: type[AuditChainHead]) -> AuditChainHead:
    if heads is AuditChainHead:  # SQL written once (agentrun.core.prepared): every decision takes it
        found = prepared.table(heads).rows('"id" = %s', [HEAD], lock=True)
        head = found[0] if found else None
    else:  # a migration's model
        head = heads.objects.select_for_update().filter(pk=HEAD).first()
    if head is None:  # the row went (migrations and ``install_triggers`` make it): the chain starts again
        heads.objects.bulk_create([heads(pk=HEAD)], ignore_conflicts=True)
        head = heads.objects.select_for_update().get(pk=HEAD)
    return head


_sealing = threading.local()


@contextmanager
def sealed_last() -> Iterator[None]:
    """Decisions created in the block are sealed when it ends without an error, after everything else
    the block writes: inside a transaction, as the block's last statements, so the chain head is locked
    from there to the commit only — not while the rest of the decision's transaction runs (the rows it
    changes, its continuation's queue row). Decisions of unrelated runs wait on each other for that
    much less (docs/performance.md, "Decision cycle and topology (third pass)"). Nested: the outermost
    block seals."""
    if getattr(_sealing, "pending", None) is not None:
        yield
        return
    pending: list[Decision] = []
    _sealing.pending = pending
    try:
        yield
    finally:
        _sealing.pending = None
    for decision in pending:
        seal(decision)


def seal(
    decision: Decision, *, receipts: type[AuditReceipt] = AuditReceipt, heads: type[AuditChainHead] = AuditChainHead
) -> AuditReceipt | None:
    """Sign ``decision`` (just created) and append its receipt to the chain, in the caller's transaction
    (``receipts``, ``heads``: a migration's models). Two statements: the head row read and locked, the
    receipt inserted (a trigger moves the head to it in that statement). Inside ``sealed_last``: at
    the end of that block instead (returns None).

    Receipts are chained in commit order: the head row stays locked until the caller commits, so two
    decisions of different runs recorded at once take their places one after the other."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("a receipt is sealed in its decision's transaction")
    pending = getattr(_sealing, "pending", None)
    if pending is not None and receipts is AuditReceipt:
        pending.append(decision)
        return None
    key = signing_key()
    kid = _signing_key_id(key)
    head = _head_for_update(heads)
    payload = _payload(head.seq + 1, kid, head.hash, record(decision))
    signature = base64.b64encode(key.sign(canonical(payload))).decode()
    receipt = receipts(
        seq=payload["seq"],
        decision_id=decision.pk,
        key_id=kid,
        prev_hash=head.hash,
        signature=signature,
        hash=receipt_hash(payload, signature),
    )
    if receipts is AuditReceipt:
        prepared.table(receipts).insert([receipt])
    else:
        receipt.save(force_insert=True)
    return receipt


def export_line(receipt: AuditReceipt, signed_record: dict[str, Any]) -> dict[str, Any]:
    """A receipt as ``agentrun_audit export`` writes it (one JSON object per line): everything
    ``verify --file`` needs, the record included."""
    payload = _payload(receipt.seq, receipt.key_id, receipt.prev_hash, signed_record)
    return {**payload, "signature": receipt.signature, "hash": receipt.hash}


# --- verifying ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Failure:
    decision_id: str
    reason: str


class ChainChecker:
    """Checks receipts one after the other, in chain order (the database's, or a file's)."""

    def __init__(self, keys: dict[str, Ed25519PublicKey]) -> None:
        self.keys = keys
        self.seq = 0
        self.hash = GENESIS
        self.count = 0
        self.key_ids: set[str] = set()

    def check(self, line: dict[str, Any]) -> str | None:
        """Why this receipt (a line as ``export_line`` writes it) does not verify, or None."""
        payload = {k: line.get(k) for k in ("v", "seq", "keyId", "prevHash", "record")}
        if payload["seq"] != self.seq + 1:
            return f"receipt {payload['seq']} follows receipt {self.seq}: receipts are missing before it"
        if payload["prevHash"] != self.hash:
            return "it does not follow the receipt before it (that one was changed or removed)"
        key = self.keys.get(str(payload["keyId"]))
        if key is None:
            return f"it is signed with key {payload['keyId']}, which is not among the trusted public keys"
        try:
            key.verify(base64.b64decode(line.get("signature") or ""), canonical(payload))
        except (InvalidSignature, binascii.Error, ValueError):
            return "its signature does not verify: the record or the receipt was changed after signing"
        if receipt_hash(payload, line["signature"]) != line.get("hash"):
            return "its hash is not the hash of its contents"
        self.seq, self.hash = payload["seq"], line["hash"]
        self.count += 1
        self.key_ids.add(str(payload["keyId"]))
        return None


def chain(batch: int = 1000) -> Iterator[tuple[AuditReceipt, Decision | None]]:
    """Every receipt in chain order with its decision (None: the decision is gone), in batches."""
    last = 0
    while True:
        receipts = list(AuditReceipt.objects.filter(seq__gt=last).order_by("seq")[:batch])
        if not receipts:
            return
        decisions = Decision.objects.in_bulk([r.decision_id for r in receipts])
        for receipt in receipts:
            yield receipt, decisions.get(receipt.decision_id)
        last = receipts[-1].seq


def verify_database(keys: dict[str, Ed25519PublicKey]) -> tuple[ChainChecker, Failure | None]:
    """Every receipt against its decision and the one before it, every decision has a receipt, and the
    head names the last one. The first failure names its decision (after a removal: the one after it)."""
    checker = ChainChecker(keys)
    removed: str | None = None  # a receipt whose decision is gone: reported on the next receipt
    for receipt, decision in chain():
        if removed is not None:
            return checker, Failure(receipt.decision_id, f"the decision before it ({removed}) was removed")
        if decision is None:
            removed = receipt.decision_id
            checker.seq, checker.hash = receipt.seq, receipt.hash
            continue
        if reason := checker.check(export_line(receipt, record(decision))):
            return checker, Failure(receipt.decision_id, reason)
    if removed is not None:
        return checker, Failure(removed, "it was removed (its receipt is the last one)")
    head = AuditChainHead.objects.filter(pk=HEAD).first()
    if head is not None and (head.seq, head.hash) != (checker.seq, checker.hash):
        reason = f"the chain ends at receipt {checker.seq} but its head is at receipt {head.seq}: the last were removed"
        return checker, Failure(head.decision_id or "?", reason)
    unsealed = Decision.objects.exclude(pk__in=AuditReceipt.objects.values("decision_id")).order_by("decided_at", "id")
    if (first := unsealed.first()) is not None:
        return checker, Failure(first.pk, "it has no receipt (it was written around the engine)")
    return checker, None


def check_annotated(decision: Decision, keys: dict[str, Ed25519PublicKey]) -> str | None:
    """One decision's receipt (annotated on it as ``receipt_<field>`` and ``receipt_previous_hash``, as
    the admin's list does): why it does not verify, or None."""
    seq = getattr(decision, "receipt_seq", None)
    if seq is None:
        return "no receipt"
    annotated: Any = decision  # the receipt's fields come as annotations, not model attributes
    previous = GENESIS if seq == 1 else annotated.receipt_previous_hash
    if previous is None:
        return "the receipt before it was removed"
    receipt = AuditReceipt(
        seq=seq,
        key_id=annotated.receipt_key_id,
        prev_hash=annotated.receipt_prev_hash,
        signature=annotated.receipt_signature,
        hash=annotated.receipt_hash,
    )
    checker = ChainChecker(keys)
    checker.seq, checker.hash = seq - 1, previous
    return checker.check(export_line(receipt, record(decision)))


def verify_lines(lines: Iterable[str], keys: dict[str, Ed25519PublicKey]) -> tuple[ChainChecker, Failure | None]:
    """An exported file's receipts, with no database."""
    checker = ChainChecker(keys)
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
            decision_id = str(line["record"]["id"])
        except (ValueError, KeyError, TypeError):
            return checker, Failure(f"line {number}", "it is not a receipt")
        if reason := checker.check(line):
            return checker, Failure(decision_id, reason)
    return checker, None


# --- append-only guards -------------------------------------------------------------------------
GUARDED = ("agentrun_decision", "agentrun_auditreceipt")


def _sqlite_unchanged_but_account(columns: list[str]) -> str:
    same = " AND ".join(f'NEW."{c}" IS OLD."{c}"' for c in columns if c != "decided_by_id")
    return f'(OLD."decided_by_id" IS NOT NULL AND NEW."decided_by_id" IS NULL AND {same})'


def _guard_statements(conn: Any) -> list[str]:
    if conn.vendor == "postgresql":
        statements = [
            """CREATE OR REPLACE FUNCTION agentrun_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              -- The one change allowed: the deciding account was deleted (ON DELETE SET NULL).
              IF TG_OP = 'UPDATE' AND TG_TABLE_NAME = 'agentrun_decision' THEN
                IF to_jsonb(OLD) -> 'decided_by_id' <> 'null'::jsonb
                   AND to_jsonb(NEW) -> 'decided_by_id' = 'null'::jsonb
                   AND (to_jsonb(NEW) - 'decided_by_id') = (to_jsonb(OLD) - 'decided_by_id') THEN
                  RETURN NEW;
                END IF;
              END IF;
              RAISE EXCEPTION 'agentrun: % rows are append-only (% refused)', TG_TABLE_NAME, TG_OP;
            END $$""",
        ]
        for table in GUARDED:
            statements += [
                f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}",
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION agentrun_append_only()",
            ]
        return statements
    with conn.cursor() as cursor:
        columns = [c.name for c in conn.introspection.get_table_description(cursor, "agentrun_decision")]
    statements = []
    for table in GUARDED:
        allowed = _sqlite_unchanged_but_account(columns) if table == "agentrun_decision" else "0"
        statements += [
            f"DROP TRIGGER IF EXISTS {table}_no_update",
            f"DROP TRIGGER IF EXISTS {table}_no_delete",
            f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} WHEN NOT {allowed} "
            f"BEGIN SELECT RAISE(ABORT, 'agentrun: {table} rows are append-only (UPDATE refused)'); END",
            f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} "
            f"BEGIN SELECT RAISE(ABORT, 'agentrun: {table} rows are append-only (DELETE refused)'); END",
        ]
    return statements


_MOVE_HEAD = (
    "UPDATE agentrun_auditchainhead SET seq = NEW.seq, hash = NEW.hash, decision_id = NEW.decision_id WHERE id = 1"
)
_HEAD_ROW = f"INSERT INTO agentrun_auditchainhead (id, seq, hash) VALUES (1, 0, '{GENESIS}')"


def _head_statements(conn: Any) -> list[str]:
    """The head follows every receipt, in the statement that inserts it."""
    if conn.vendor == "postgresql":
        return [
            "CREATE OR REPLACE FUNCTION agentrun_audit_head() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN {_MOVE_HEAD}; RETURN NULL; END $$",
            "DROP TRIGGER IF EXISTS agentrun_auditreceipt_head ON agentrun_auditreceipt",
            "CREATE TRIGGER agentrun_auditreceipt_head AFTER INSERT ON agentrun_auditreceipt "
            "FOR EACH ROW EXECUTE FUNCTION agentrun_audit_head()",
            "INSERT INTO agentrun_auditchainhead (id, seq, hash) VALUES (1, 0, '"
            + GENESIS
            + "') ON CONFLICT DO NOTHING",
        ]
    return [
        "DROP TRIGGER IF EXISTS agentrun_auditreceipt_head",
        f"CREATE TRIGGER agentrun_auditreceipt_head AFTER INSERT ON agentrun_auditreceipt BEGIN {_MOVE_HEAD}; END",
        _HEAD_ROW.replace("INSERT", "INSERT OR IGNORE", 1),
    ]


def install_triggers(using: str | None = None, **_: Any) -> None:
    """(Re)create the triggers that keep the chain head and make decisions and receipts append-only, and
    the head row (idempotent). Run after every migration and flush (``post_migrate``): SQLite drops a
    table's triggers when a migration rebuilds it."""
    conn = connections[using or DEFAULT_DB_ALIAS]
    if conn.vendor not in ("postgresql", "sqlite"):
        return
    with conn.cursor() as cursor:
        for statement in [*_head_statements(conn), *_guard_statements(conn)]:
            cursor.execute(statement)


def remove_guards() -> None:
    """Drop the triggers (tests flushing a SQLite database; an administrator who must, knowingly)."""
    with connection.cursor() as cursor:
        for table in GUARDED:
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
            elif connection.vendor == "sqlite":
                cursor.execute(f"DROP TRIGGER IF EXISTS {table}_no_update")
                cursor.execute(f"DROP TRIGGER IF EXISTS {table}_no_delete")


def guards_installed() -> bool:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'agentrun_%%_append_only'")
            return cursor.fetchone()[0] == len(GUARDED)
        if connection.vendor == "sqlite":
            cursor.execute("SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'agentrun_%_no_%'")
            return cursor.fetchone()[0] == 2 * len(GUARDED)
    return False

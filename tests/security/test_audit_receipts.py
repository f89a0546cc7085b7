"""The audit trail proves itself (issue 24, docs/security.md "Audit receipts"): decisions are append-only in
the database, each carries an Ed25519 receipt chained to the one before, and ``agentrun_audit verify``
finds a decision changed by raw SQL, one deleted, and a rewrite whose hashes were recomputed without the
private key — in the database and in an exported file."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.test import Client

from agentrun.core import receipts
from agentrun.core.access import REVIEWERS, ensure_groups
from agentrun.core.models import AuditReceipt, Decision, StandingGrant
from agentrun.engine.types import Decider
from tests.helpers.decisions import decide_call, record_decision
from tests.helpers.runs import email_run, start, tool_line
from tests.helpers.users import make_user

# A test runs in a transaction rolled back at its end; those marked transaction=True need real commits
# (a grant's or a door's decision continues the run on commit, in another thread; racing deciders each have
# a connection).
pytestmark = pytest.mark.django_db


def audit(*args: str) -> tuple[int, str]:
    """``manage.py agentrun_audit …``: (exit code, stdout)."""
    from io import StringIO

    out = StringIO()
    try:
        call_command("agentrun_audit", *args, stdout=out, stderr=StringIO())
    except SystemExit as exit_:
        return int(exit_.code), out.getvalue()
    return 0, out.getvalue()


def decided(n: int, **kwargs) -> list[Decision]:  # noqa: ANN003
    """``n`` decisions recorded by the engine, in order."""
    made = []
    for i in range(n):
        run_id = email_run(thread=f"t-audit-{i}")
        made.append(record_decision(agent_id="support-agent", run_id=run_id, kind="decline", reason=f"r{i}").decision)
    return made


def raw(sql: str, params: list | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])


@pytest.fixture
def guards_lifted():
    """What a database administrator can do: drop the append-only triggers (put back afterwards)."""
    receipts.remove_guards()
    yield
    receipts.install_triggers()


def seed() -> str:
    return base64.b64encode(Ed25519PrivateKey.generate().private_bytes_raw()).decode()


# --- append-only --------------------------------------------------------------------------------
def test_every_decision_gets_a_receipt_and_the_chain_verifies():
    made = decided(3)
    assert list(AuditReceipt.objects.values_list("decision_id", flat=True)) == [d.pk for d in made]
    code, out = audit("verify")
    assert code == 0 and "OK: 3 receipt(s) verify" in out, out


@pytest.mark.django_db(transaction=True)
def test_a_standing_grants_decision_gets_a_receipt_too():
    ensure_groups()
    creator = make_user("gina-audit", group=None)  # a grant works while its creator may decide the agent
    creator.groups.add(Group.objects.get(name=REVIEWERS))
    StandingGrant.objects.create(
        agent_id="support-agent", tool_name="send-email", scope="thread", scope_id="t-gr", created_by=creator
    )
    async_to_sync(start)(
        "support-agent", tool_line("send-email", {"to": "a@b.c", "subject": "s", "body": "b"}), thread="t-gr"
    )
    decision = Decision.objects.get(via="policy")
    assert AuditReceipt.objects.get().decision_id == decision.pk
    assert audit("verify")[0] == 0


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE agentrun_decision SET reason = 'rewritten'",
        "UPDATE agentrun_decision SET kind = 'approve'",
        "DELETE FROM agentrun_decision",
        "UPDATE agentrun_auditreceipt SET signature = 'x'",
        "DELETE FROM agentrun_auditreceipt",
    ],
)
def test_the_database_refuses_to_change_or_delete_decisions_and_receipts(sql):
    [decision] = decided(1)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        raw(sql)
    assert Decision.objects.get(pk=decision.pk).reason == "r0"
    assert audit("verify")[0] == 0


@pytest.mark.django_db(transaction=True)
def test_deleting_the_account_that_decided_keeps_the_record_and_its_proof():
    ensure_groups()
    rita = make_user("rita-audit", group=None)
    rita.groups.add(Group.objects.get(name=REVIEWERS))
    run_id = email_run(thread="t-account")
    decide_call(agent_id="support-agent", run_id=run_id, kind="decline", decider=Decider.person(rita, via="api"))
    rita.delete()  # ON DELETE SET NULL: the one change the guard allows
    decision = Decision.objects.get(run_id=run_id)
    assert (decision.decided_by_id, decision.decided_by_username) == (None, "rita-audit")
    assert audit("verify")[0] == 0


# --- tampering ----------------------------------------------------------------------------------
def test_a_decision_changed_by_raw_sql_is_named(guards_lifted):
    made = decided(3)
    raw("UPDATE agentrun_decision SET reason = 'approved by the boss' WHERE id = %s", [made[1].pk])
    code, out = audit("verify")
    assert code == 1 and made[1].pk in out and made[0].pk not in out, out


def test_a_deleted_decision_is_found_by_the_one_that_followed(guards_lifted):
    made = decided(3)
    raw("UPDATE agentrun_suspendedtoolcall SET decision_id = NULL WHERE decision_id = %s", [made[1].pk])
    raw("DELETE FROM agentrun_decision WHERE id = %s", [made[1].pk])  # its receipt stays
    code, out = audit("verify")
    assert code == 1 and made[2].pk in out.split(":")[0], out
    raw("DELETE FROM agentrun_auditreceipt WHERE decision_id = %s", [made[1].pk])  # and then its receipt too
    code, out = audit("verify")
    assert code == 1 and made[2].pk in out.split(":")[0], out


def test_the_last_decisions_removed_with_their_receipts_are_seen_by_the_head(guards_lifted):
    made = decided(3)
    raw("UPDATE agentrun_suspendedtoolcall SET decision_id = NULL WHERE decision_id = %s", [made[2].pk])
    raw("DELETE FROM agentrun_decision WHERE id = %s", [made[2].pk])
    raw("DELETE FROM agentrun_auditreceipt WHERE decision_id = %s", [made[2].pk])
    code, out = audit("verify")
    assert code == 1 and made[2].pk in out and "removed" in out, out


def test_a_decision_written_around_the_engine_has_no_receipt(guards_lifted):
    [decision] = decided(1)
    forged = "dec_forged"
    columns = [f.column for f in Decision._meta.concrete_fields]
    raw(
        f"INSERT INTO agentrun_decision ({', '.join(columns)}) SELECT "
        + ", ".join({"id": "%s", "suspension": "suspension + 1"}.get(c, c) for c in columns)
        + " FROM agentrun_decision WHERE id = %s",
        [forged, decision.pk],
    )
    code, out = audit("verify")
    assert code == 1 and forged in out, out


def _rewrite_without_the_key(decision: Decision) -> None:
    """An attacker who can write the tables but has not the private key: changes a decision and
    re-signs and re-hashes the chain from there with a key of their own, under the real key id."""
    forger = Ed25519PrivateKey.generate()
    previous = None
    for receipt in AuditReceipt.objects.order_by("seq"):
        if receipt.decision_id == decision.pk:
            raw("UPDATE agentrun_decision SET kind = 'approve', reason = NULL WHERE id = %s", [decision.pk])
        if previous is None and receipt.decision_id != decision.pk:
            previous = receipt.hash
            continue
        row = Decision.objects.get(pk=receipt.decision_id)
        prev = previous or receipt.prev_hash
        payload = {
            "v": 1,
            "seq": receipt.seq,
            "keyId": receipt.key_id,
            "prevHash": prev,
            "record": receipts.record(row),
        }
        signature = base64.b64encode(forger.sign(receipts.canonical(payload))).decode()
        new_hash = receipts.receipt_hash(payload, signature)
        raw(
            "UPDATE agentrun_auditreceipt SET prev_hash = %s, signature = %s, hash = %s WHERE seq = %s",
            [prev, signature, new_hash, receipt.seq],
        )
        previous = new_hash
    raw("UPDATE agentrun_auditchainhead SET hash = %s", [previous])


def test_a_rewrite_with_recomputed_hashes_but_no_private_key_fails(guards_lifted):
    made = decided(3)
    _rewrite_without_the_key(made[1])
    code, out = audit("verify")
    assert code == 1 and made[1].pk in out and "signature" in out, out


# --- exported files, no database ------------------------------------------------------------------
def _export(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "receipts.jsonl"
    code, out = audit("export", "--file", str(path))
    assert code == 0, out
    public_key = out.strip().rsplit(" ", 1)[-1]  # "Ed25519 public key <id>: <base64>"
    return path, public_key


def _verify_file(path: Path, public_key: str) -> tuple[int, str]:
    return audit("verify", "--file", str(path), "--public-key", public_key)


def test_an_exported_file_verifies_without_a_database_and_shows_tampering(tmp_path):
    made = decided(3)
    path, public_key = _export(tmp_path)
    assert _verify_file(path, public_key) == (0, f"OK: 3 receipt(s) verify (keys: {_kid(public_key)}).\n")
    lines = path.read_text().splitlines()

    changed = json.loads(lines[1])
    changed["record"]["reason"] = "fine by me"
    path.write_text("\n".join([lines[0], json.dumps(changed), lines[2]]) + "\n")
    code, out = _verify_file(path, public_key)
    assert code == 1 and made[1].pk in out, out

    path.write_text("\n".join([lines[0], lines[2]]) + "\n")  # one removed
    code, out = _verify_file(path, public_key)
    assert code == 1 and made[2].pk in out, out

    # Recomputed hashes without the key: the signature gives it away.
    forged = json.loads(lines[1])
    forged["record"]["kind"] = "approve"
    payload = {k: forged[k] for k in ("v", "seq", "keyId", "prevHash", "record")}
    forged["hash"] = receipts.receipt_hash(payload, forged["signature"])
    path.write_text("\n".join([lines[0], json.dumps(forged), lines[2]]) + "\n")
    code, out = _verify_file(path, public_key)
    assert code == 1 and made[1].pk in out, out

    # Another key than the one that signed: nothing verifies.
    other = base64.b64encode(Ed25519PrivateKey.generate().public_key().public_bytes_raw()).decode()
    path.write_text("\n".join(lines) + "\n")
    code, out = _verify_file(path, other)
    assert code == 1 and made[0].pk in out, out


def _kid(public_key: str) -> str:
    return hashlib.sha256(base64.b64decode(public_key)).hexdigest()[:16]


# --- keys -----------------------------------------------------------------------------------------
def test_a_rotated_key_keeps_old_receipts_verifiable(settings, tmp_path):
    old, new = seed(), seed()
    settings.AGENTRUN_AUDIT_SIGNING_KEY = old
    decided(2)
    old_public = audit("public-key")[1].strip().rsplit(" ", 1)[-1]
    settings.AGENTRUN_AUDIT_SIGNING_KEY = new
    decided(1)
    assert len(set(AuditReceipt.objects.values_list("key_id", flat=True))) == 2
    code, out = audit("verify")
    assert code == 1 and "not among the trusted public keys" in out  # the old key is not known yet
    settings.AGENTRUN_AUDIT_PUBLIC_KEYS = [old_public]
    assert audit("verify")[0] == 0
    path, new_public = _export(tmp_path)
    assert audit("verify", "--file", str(path), "--public-key", new_public, "--public-key", old_public)[0] == 0


def test_a_key_file_works_and_the_public_keys_are_published(settings, tmp_path, client):
    key = Ed25519PrivateKey.generate()
    pem = tmp_path / "audit.pem"
    pem.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    settings.AGENTRUN_AUDIT_SIGNING_KEY_FILE = str(pem)
    decided(1)
    expected = base64.b64encode(key.public_key().public_bytes_raw()).decode()
    answer = Client().get("/api/audit/public-keys").json()  # public: anyone may check a receipt
    assert answer["data"][0] == {
        "keyId": _kid(expected),
        "algorithm": "Ed25519",
        "publicKey": expected,
        "current": True,
    }
    assert AuditReceipt.objects.get().key_id == _kid(expected)


def test_the_embedded_default_generates_its_key_in_the_data_directory(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    decided(1)
    key_file = tmp_path / "audit_signing_key"
    assert key_file.exists() and oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert audit("verify")[0] == 0


# --- the admin --------------------------------------------------------------------------------------
def test_the_admin_decision_list_says_whether_the_chain_verifies(guards_lifted):
    made = decided(2)
    client = Client()
    client.force_login(make_user("audit-root", group=None, is_staff=True, is_superuser=True))
    page = client.get("/admin/agentrun/decision/").content.decode()
    assert "Audit chain verifies: 2 receipt(s)" in page and page.count("✓") >= 2
    raw("UPDATE agentrun_decision SET reason = 'edited' WHERE id = %s", [made[0].pk])
    page = client.get("/admin/agentrun/decision/").content.decode()
    assert f"Audit chain does not verify: {made[0].pk}" in page and "✗" in page


# --- concurrency ------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_decisions_recorded_at_once_chain_one_after_the_other():
    run_ids = [email_run(thread=f"t-race-{i}") for i in range(8)]
    errors: list[BaseException] = []

    def decide(run_id: str) -> None:
        try:
            record_decision(agent_id="support-agent", run_id=run_id, kind="decline")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(run_id,)) for run_id in run_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert AuditReceipt.objects.count() == 8
    assert audit("verify")[0] == 0

"""Standard Webhooks signatures (https://www.standardwebhooks.com/), as
docs/notifications.md#22-signatures-standard-webhooks says.

Headers ``webhook-id`` (the event id, the same on every retry), ``webhook-timestamp`` (Unix seconds of
the attempt) and ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">``.

The HMAC key is the endpoint's secret: a ``whsec_<base64>`` secret (the form Standard Webhooks
libraries use, and the one agentrun generates) is the base64-decoded bytes after the prefix; any
other secret is its UTF-8 bytes. ``docs/notifications.md`` shows a receiver verifying a delivery.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
import time
from collections.abc import Mapping
from hashlib import sha256

SECRET_PREFIX = "whsec_"
TOLERANCE_SECONDS = 300  # a receiver refuses timestamps further off than this (replays)


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def secret_problem(secret: str) -> str | None:
    """Why a secret cannot sign, or None."""
    if not secret:
        return "the secret must not be empty"
    if secret.startswith(SECRET_PREFIX):
        try:
            if not base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True):
                return "a whsec_ secret must hold key bytes"
        except (binascii.Error, ValueError):
            return "a whsec_ secret must be base64 after the prefix"
    return None


def signing_key(secret: str) -> bytes:
    if secret.startswith(SECRET_PREFIX):
        return base64.b64decode(secret[len(SECRET_PREFIX) :])
    return secret.encode("utf-8")


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(signing_key(secret), f"{msg_id}.{timestamp}.".encode() + body, sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(secret: str, msg_id: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, msg_id, timestamp, body),
    }


def verify(secret: str, received: Mapping[str, str], body: bytes, *, now: float | None = None) -> bool:
    """What a receiver does: the signature matches one of the header's (space-separated) signatures,
    and the timestamp is recent."""
    lowered = {k.lower(): v for k, v in received.items()}
    msg_id, stamp = lowered.get("webhook-id", ""), lowered.get("webhook-timestamp", "")
    if not msg_id or not stamp.isdigit():
        return False
    if abs((time.time() if now is None else now) - int(stamp)) > TOLERANCE_SECONDS:
        return False
    expected = signature(secret, msg_id, int(stamp), body)
    return any(hmac.compare_digest(expected, given) for given in lowered.get("webhook-signature", "").split())

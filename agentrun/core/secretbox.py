"""Secrets kept encrypted at rest (webhook signing secrets): Fernet (AES-128-CBC + HMAC-SHA256) from
``cryptography``, with keys from the environment, never from the database.

``AGENTRUN_ENCRYPTION_KEYS``: comma-separated Fernet keys (``Fernet.generate_key()``, 32 url-safe base64
bytes), newest first. The first one encrypts; every one decrypts — rotation is: put a new key first,
run ``manage.py agentrun_secrets rotate`` (re-encrypts every stored secret with it), then drop the old
key. Unset, one key is derived from ``SECRET_KEY`` (and ``SECRET_KEY_FALLBACKS`` decrypt): fine on one
machine, but then whoever reads ``SECRET_KEY`` reads the secrets too. docs/security.md, "Secrets at rest".
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class UnreadableSecret(Exception):
    """A stored secret none of the configured keys decrypts (its key was dropped too early)."""


def _derived(secret_key: str) -> bytes:
    digest = hashlib.sha256(b"agentrun.secretbox:" + secret_key.encode()).digest()
    return base64.urlsafe_b64encode(digest)


def keys_in_force() -> list[bytes | str]:
    """The keys in force, newest first (another process sharing them reads what this one sealed)."""
    configured = [k.strip() for k in getattr(settings, "AGENTRUN_ENCRYPTION_KEYS", []) if k.strip()]
    return configured or [_derived(k) for k in [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]]


def _box() -> MultiFernet:
    try:
        return MultiFernet([Fernet(key) for key in keys_in_force()])
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"AGENTRUN_ENCRYPTION_KEYS holds a key that is not a Fernet key: {exc}") from None


def seal(plaintext: str) -> str:
    """The text to store for ``plaintext``."""
    return _box().encrypt(plaintext.encode()).decode()


def unseal(token: str) -> str:
    """The plaintext of a stored ``token`` (``UnreadableSecret`` if no configured key opens it)."""
    try:
        return _box().decrypt(token.encode()).decode()
    except InvalidToken:
        raise UnreadableSecret("no key of AGENTRUN_ENCRYPTION_KEYS decrypts this secret") from None


def reseal(token: str) -> str:
    """``token`` encrypted again with the first key (rotation)."""
    try:
        return _box().rotate(token.encode()).decode()
    except InvalidToken:
        raise UnreadableSecret("no key of AGENTRUN_ENCRYPTION_KEYS decrypts this secret") from None

"""``GET /api/audit/public-keys``: the public keys that verify the audit receipts (docs/security.md,
"Audit receipts"). Public: a public key proves nothing to whoever holds it but whether a receipt is
genuine. The current signing key first, then the former ones still trusted (``AGENTRUN_AUDIT_PUBLIC_KEYS``)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from agentrun.core import receipts


@require_GET
def public_keys(request: HttpRequest) -> JsonResponse:
    current = receipts.key_id(receipts.signing_key().public_key())
    keys = [
        {"keyId": kid, "algorithm": "Ed25519", "publicKey": receipts.public_key_text(key), "current": kid == current}
        for kid, key in receipts.trusted_keys().items()
    ]
    return JsonResponse({"object": "list", "data": keys})

"""REST decisions with ``Idempotency-Key``: a retried request gets the first answer, one decision exists.

The key row is written in the decision's transaction. Two requests racing with the same key: the
loser blocks on the run row (PostgreSQL) or at ``BEGIN IMMEDIATE`` (SQLite) until the winner commits,
then finds the winner's key and returns its answer (or, having raced past the lookup, fails the
decision and finds the key afterwards).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from agentrun.engine.decisions import decide
from agentrun.errors import AgentRunError
from agentrun.models import Decision, IdempotencyKey, Run

MAX_KEY_LENGTH = 255


@dataclass
class DecisionAnswer:
    status: int
    body: dict
    run_id: str
    stream_after: int
    replayed: bool
    outcome: Any = None  # the engine's DecisionOutcome when this request decided


def fingerprint(method: str, path: str, body: Any) -> str:
    canonical = json.dumps([method, path.rstrip("/"), body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _prior(user: Any, key: str, request_fingerprint: str) -> DecisionAnswer | None:
    row = IdempotencyKey.objects.filter(user=user, key=key).first()
    if row is None:
        return None
    if row.request_fingerprint != request_fingerprint:
        raise AgentRunError(
            "INVALID_REQUEST",
            "This Idempotency-Key was used for a different request.",
            details={"idempotencyKey": key},
        )
    return DecisionAnswer(row.response_status, row.response_body, row.run_id, row.stream_after, replayed=True)


def decide_via_api(
    *,
    user: Any,
    agent_id: str,
    run_id: str,
    kind: str,
    decision_kwargs: dict,
    idempotency_key: str | None,
    request_fingerprint: str,
) -> DecisionAnswer:
    """Record a decision made through REST (``via="api"``), or return the answer of the first try."""
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_KEY_LENGTH:
        raise AgentRunError("INVALID_REQUEST", f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters")
    try:
        with transaction.atomic():
            if idempotency_key is not None and (prior := _prior(user, idempotency_key, request_fingerprint)):
                return prior
            outcome = decide(
                agent_id=agent_id,
                run_id=run_id,
                kind=kind,
                decided_by=user,
                via=Decision.Via.API,
                **decision_kwargs,
            )
            next_seq = Run.objects.filter(pk=run_id).values_list("next_seq", flat=True).first() or 1
            answer = DecisionAnswer(202, outcome.to_dict(), run_id, next_seq - 1, replayed=False, outcome=outcome)
            if idempotency_key is not None:
                IdempotencyKey.objects.create(
                    user=user,
                    key=idempotency_key,
                    request_fingerprint=request_fingerprint,
                    run_id=run_id,
                    response_status=answer.status,
                    response_body=answer.body,
                    stream_after=answer.stream_after,
                )
            return answer
    except (AgentRunError, IntegrityError):
        # Lost a race to an identical request that committed first: its answer is ours.
        if idempotency_key is not None and (prior := _prior(user, idempotency_key, request_fingerprint)):
            return prior
        raise

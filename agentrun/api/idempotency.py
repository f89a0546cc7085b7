"""REST decisions with ``Idempotency-Key``: a retried request gets the first answer, one decision exists.

The decision goes through the one decision service; the key row is written inside its transaction
(``on_recorded``), so a key exists exactly when its decision does. Two requests racing with the same
key: the loser blocks on the run row (PostgreSQL) or at ``BEGIN IMMEDIATE`` (SQLite) until the winner
commits, then fails the decision (or the key's unique constraint) and finds the winner's answer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError

from agentrun.core.errors import AgentRunError
from agentrun.core.models import Decision, IdempotencyKey
from agentrun.engine.service import Decider, DecisionCommand, DecisionOutcome, DecisionRequest, decide

MAX_KEY_LENGTH = 255


@dataclass
class DecisionAnswer:
    status: int
    body: dict
    run_id: str
    stream_after: int
    replayed: bool


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
    requests: Sequence[DecisionRequest],
    batch: bool,
    idempotency_key: str | None,
    request_fingerprint: str,
) -> DecisionAnswer:
    """Record decisions made through REST (``via="api"``), or return the answer of the first try."""
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_KEY_LENGTH:
        raise AgentRunError("INVALID_REQUEST", f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters")
    if idempotency_key is not None and (prior := _prior(user, idempotency_key, request_fingerprint)):
        return prior

    def body(outcome: DecisionOutcome) -> dict:
        return outcome.batch_dict() if batch else outcome.to_dict()

    def remember(outcome: DecisionOutcome) -> None:
        IdempotencyKey.objects.create(
            user=user,
            key=idempotency_key,
            request_fingerprint=request_fingerprint,
            run_id=outcome.run_id,
            response_status=202,
            response_body=body(outcome),
            stream_after=outcome.after_seq,
        )

    try:
        command = DecisionCommand(
            agent_id=agent_id,
            run_id=run_id,
            requests=tuple(requests),
            decider=Decider.person(user, via=Decision.Via.API),
            batch=batch,
        )
        outcome = decide(command, on_recorded=remember if idempotency_key is not None else None)
    except (AgentRunError, IntegrityError):
        # Lost a race to an identical request that committed first: its answer is ours.
        if idempotency_key is not None and (prior := _prior(user, idempotency_key, request_fingerprint)):
            return prior
        raise
    return DecisionAnswer(202, body(outcome), outcome.run_id, outcome.after_seq, replayed=False)

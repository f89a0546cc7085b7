"""Time-ordered, prefixed identifiers (``run_…``, ``step_…``): sorting by id follows creation order."""

from __future__ import annotations

import secrets
import time


def new_id(prefix: str) -> str:
    return f"{prefix}_{time.time_ns() // 1000:014x}{secrets.token_hex(6)}"

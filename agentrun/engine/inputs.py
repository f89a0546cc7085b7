"""Validation of what callers hand to ``stream()``: messages, memory, metadata, options."""

from __future__ import annotations

import json
import math
import unicodedata
from typing import Any

from agentrun.core.errors import AgentRunError

# Deep enough for any real body or tool arguments, shallow enough that nothing downstream (pydantic,
# deepcopy, the JSON encoders, the databases' JSON functions) runs out of stack on it.
MAX_JSON_DEPTH = 64
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


def json_problem(value: Any) -> str | None:
    """Why a decoded JSON value cannot be kept as it is, or None.

    Refused: nesting deeper than ``MAX_JSON_DEPTH``, numbers that are not finite (``1e400`` decodes to
    infinity, which neither database stores as JSON), NUL characters and lone surrogates in strings or
    keys (PostgreSQL cannot store them, and they are not Unicode text). Iterative: any depth is safe.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "must not contain NUL characters"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "must be valid Unicode text"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "must not hold numbers out of range (infinite or NaN)"
        elif isinstance(item, dict | list | tuple):
            if depth >= MAX_JSON_DEPTH:
                return f"must not be nested more than {MAX_JSON_DEPTH} levels deep"
            if isinstance(item, dict):
                stack.extend((key, depth + 1) for key in item)
                stack.extend((child, depth + 1) for child in item.values())
            else:
                stack.extend((child, depth + 1) for child in item)
    return None


# Characters an id must not hold: control characters (C0, DEL, C1 — a CR LF in a thread id forged lines
# in the plain-text emails that name it), line and paragraph separators, and the bidirectional overrides
# and isolates that make text display in another order than it is ("Trojan source"). Ids are shown in
# emails, webhooks, CSV exports, logs and pages: docs/security.md, "Inputs that cannot forge output".
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def id_problem(value: str) -> str | None:
    """Why ``value`` cannot be an id (thread, resource, metadata key), or None."""
    for char in value:
        if unicodedata.category(char) in ("Cc", "Zl", "Zp") or char in _BIDI_CONTROLS:
            return f"must not contain control characters (found U+{ord(char):04X})"
    return None


def validate_metadata(metadata: Any) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise AgentRunError("INVALID_METADATA", "metadata must be an object of string pairs")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise AgentRunError("INVALID_METADATA", f"metadata holds at most {MAX_METADATA_PAIRS} pairs")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise AgentRunError("INVALID_METADATA", "metadata keys and values must be strings")
        if len(key) > MAX_METADATA_KEY:
            raise AgentRunError("INVALID_METADATA", f"metadata keys are at most {MAX_METADATA_KEY} characters")
        if len(value) > MAX_METADATA_VALUE:
            raise AgentRunError("INVALID_METADATA", f"metadata values are at most {MAX_METADATA_VALUE} characters")
        if problem := json_problem([key, value]):
            raise AgentRunError("INVALID_METADATA", f"metadata {problem}")
        if problem := id_problem(key):
            raise AgentRunError("INVALID_REQUEST", f"metadata key {key!r} {problem}")
    return dict(metadata)


def normalize_messages(messages: Any) -> list[dict]:
    """``str | [str] | [{role, content}]`` → ``[{role, content}]``."""
    if isinstance(messages, str):
        messages = [messages]
    if not isinstance(messages, list | tuple):
        raise AgentRunError("INVALID_REQUEST", "messages must be a string, a list of strings or of {role, content}")
    out = []
    for m in messages:
        if isinstance(m, str):
            out.append({"role": "user", "content": m})
        elif (
            isinstance(m, dict)
            and isinstance(m.get("content"), str)
            and m.get("role", "user")
            in (
                "user",
                "system",
                "assistant",
            )
        ):
            out.append({"role": m.get("role", "user"), "content": m["content"]})
        else:
            raise AgentRunError(
                "INVALID_REQUEST", "each message must be a string or {role: user|system|assistant, content: string}"
            )
    if problem := json_problem(out):  # the Python API too: a 400-kind error, never a database error
        raise AgentRunError("INVALID_REQUEST", f"messages {problem}")
    return out


def normalize_memory(memory: Any) -> tuple[str | None, str | None]:
    if memory is None:
        return None, None
    if not isinstance(memory, dict):
        raise AgentRunError("INVALID_REQUEST", "memory must be {thread, resource}")
    thread = memory.get("thread")
    if isinstance(thread, dict):
        thread = thread.get("id")
    resource = memory.get("resource")
    for name, value in (("memory.thread", thread), ("memory.resource", resource)):
        if value is not None and (not isinstance(value, str) or not value or len(value) > 255):
            raise AgentRunError("INVALID_REQUEST", f"{name} must be a non-empty string of at most 255 characters")
        if value is not None and (problem := json_problem(value) or id_problem(value)):
            raise AgentRunError("INVALID_REQUEST", f"{name} {problem}")
    return thread, resource


def normalize_max_steps(max_steps: Any) -> int | None:
    if max_steps is None:
        return None
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or not 1 <= max_steps <= 1000:
        raise AgentRunError("INVALID_REQUEST", "maxSteps must be an integer from 1 to 1000")
    return max_steps


def normalize_until_idle(until_idle: Any) -> dict | None:
    """``False``/None → None; ``True`` → defaults; ``{max_idle_ms}`` (or ``maxIdleMs``) → that."""
    if until_idle is None or until_idle is False:
        return None
    if until_idle is True:
        return {"max_idle_ms": 300_000}
    if isinstance(until_idle, dict):
        value = until_idle.get("max_idle_ms", until_idle.get("maxIdleMs", 300_000))
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise AgentRunError("INVALID_REQUEST", "untilIdle.maxIdleMs must be a positive number")
        return {"max_idle_ms": value}
    raise AgentRunError("INVALID_REQUEST", "untilIdle must be a boolean or {maxIdleMs}")


def decode_model_args(text: str) -> Any:
    """A model's tool arguments as an object, or the raw text when they are not JSON that can be kept
    (the tool's validation then turns the text into a tool-error the model sees)."""
    try:
        value = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):  # JSONDecodeError, over-long integers, deep nesting
        return text
    return text if json_problem(value) else value

"""Validation of what callers hand to ``stream()``: messages, memory, metadata, options."""

from __future__ import annotations

from typing import Any

from agentrun.errors import AgentRunError

MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


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
        elif isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role", "user") in (
            "user",
            "system",
            "assistant",
        ):
            out.append({"role": m.get("role", "user"), "content": m["content"]})
        else:
            raise AgentRunError(
                "INVALID_REQUEST", "each message must be a string or {role: user|system|assistant, content: string}"
            )
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
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise AgentRunError("INVALID_REQUEST", "untilIdle.maxIdleMs must be a positive number")
        return {"max_idle_ms": value}
    raise AgentRunError("INVALID_REQUEST", "untilIdle must be a boolean or {maxIdleMs}")

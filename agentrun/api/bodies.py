"""The JSON bodies of docs/api.md (camelCase) turned into the Python API's keyword arguments.

REST views and the ``ws/agents/`` consumer both use these, so a body means the same everywhere.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from agentrun.core.errors import AgentRunError
from agentrun.engine.decisions import DecisionRequest
from agentrun.engine.inputs import json_problem

STREAM_FIELDS = {"messages", "memory", "untilIdle", "requireToolApproval", "maxSteps", "metadata"}


def max_body_size() -> int:
    """Bodies and websocket frames: at most 1 MiB (docs/api.md#conventions)."""
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 1024 * 1024


def parse_json(text: str | bytes, *, where: str = "the body") -> Any:
    """Strict JSON (no NaN / Infinity), refused with INVALID_REQUEST when it is not, or holds what
    ``json_problem`` names. Never a RecursionError: deep nesting is bad input like any other."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        data = json.loads(text, parse_constant=_no_constants)
    except RecursionError:
        raise AgentRunError("INVALID_REQUEST", f"{where} is nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError included
        raise AgentRunError("INVALID_REQUEST", f"{where} is not valid JSON: {exc}") from None
    if problem := json_problem(data):
        raise AgentRunError("INVALID_REQUEST", f"{where} {problem}")
    return data


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode_frame(text_data: str | None, bytes_data: bytes | None) -> Any:
    """A websocket frame of ``ws/agents/`` → its JSON value, with the REST body's rules and limit."""
    if text_data is None:
        raise AgentRunError("INVALID_REQUEST", "send JSON text frames, not binary ones")
    limit = max_body_size()
    if len(text_data) > limit or len(text_data.encode("utf-8", "surrogatepass")) > limit:
        raise AgentRunError("PAYLOAD_TOO_LARGE", "A frame is at most 1 MiB.")
    return parse_json(text_data, where="the frame")


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise AgentRunError("INVALID_REQUEST", "the body must be a JSON object")
    return body


def _optional_str(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise AgentRunError("INVALID_REQUEST", f"{name} must be a string")
    return value


def stream_kwargs(body: Any) -> dict:
    """``{messages, memory?, untilIdle?, requireToolApproval?, maxSteps?, metadata?}`` → ``stream()`` kwargs."""
    body = _object(body)
    if "messages" not in body:
        raise AgentRunError("INVALID_REQUEST", "messages is required")
    require = body.get("requireToolApproval")
    if require is not None and not isinstance(require, bool):
        raise AgentRunError("INVALID_REQUEST", "requireToolApproval must be a boolean")
    return {
        "messages": body["messages"],
        "memory": body.get("memory"),
        "until_idle": body.get("untilIdle"),  # validated by stream(): 0 or "" is not false
        "require_tool_approval": require,
        "max_steps": body.get("maxSteps"),
        "metadata": body.get("metadata"),
    }


def decision_kwargs(kind: str, body: Any) -> dict:
    """An approve / decline / resume body → keyword arguments of the Agent's decision methods."""
    body = _object(body)
    kwargs: dict[str, Any] = {
        "tool_call_id": _optional_str(body, "toolCallId"),
        "args_fingerprint": _optional_str(body, "argsFingerprint"),
    }
    if kind == "approve":
        args = body.get("args")
        if args is not None and not isinstance(args, dict):
            raise AgentRunError("ARGS_INVALID", "args must be a JSON object (the full edited arguments)")
        kwargs |= {"args": args, "reason": _optional_str(body, "reason")}
    elif kind == "decline":
        kwargs["reason"] = _optional_str(body, "reason")
    elif kind == "resume":
        if "resumeData" not in body:
            raise AgentRunError("INVALID_REQUEST", "resumeData is required")
        kwargs["resume_data"] = body["resumeData"]
    else:
        raise AgentRunError("INVALID_REQUEST", f"unknown decision {kind!r}")
    return kwargs


MAX_BATCH = 100


def batch_requests(body: Any) -> list[DecisionRequest]:
    """``{"decisions": [{toolCallId, decision, args?, reason?, resumeData?, argsFingerprint?}, …]}``
    (docs/api.md#batch-decisions) → decision requests; a bad item is refused with its ``details.index``."""
    items = _object(body).get("decisions")
    if not isinstance(items, list) or not items:
        raise AgentRunError("INVALID_REQUEST", "decisions must be a non-empty list")
    if len(items) > MAX_BATCH:
        raise AgentRunError("INVALID_REQUEST", f"a batch holds at most {MAX_BATCH} decisions")
    requests = []
    for index, item in enumerate(items):
        try:
            item = _object(item)
            kind = item.get("decision")
            if kind not in ("approve", "decline", "resume"):
                raise AgentRunError("INVALID_REQUEST", "decision must be approve, decline or resume")
            if not isinstance(item.get("toolCallId"), str):
                raise AgentRunError("INVALID_REQUEST", "toolCallId is required")
            requests.append(DecisionRequest(kind=kind, **decision_kwargs(kind, item)))
        except AgentRunError as exc:
            exc.details = {**(exc.details or {}), "index": index}
            raise
    return requests

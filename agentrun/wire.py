"""The JSON bodies of CONTRACT §4 (camelCase) turned into the Python API's keyword arguments.

REST views and the ``ws/agents/`` consumer both use these, so a body means the same everywhere.
"""

from __future__ import annotations

from typing import Any

from agentrun.errors import AgentRunError

STREAM_FIELDS = {"messages", "memory", "untilIdle", "requireToolApproval", "maxSteps", "metadata"}


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
        "until_idle": body.get("untilIdle") or False,
        "require_tool_approval": require,
        "max_steps": body.get("maxSteps"),
        "metadata": body.get("metadata"),
    }


def decision_kwargs(kind: str, body: Any) -> dict:
    """An approve / decline / resume body → keyword arguments of the Agent's decision methods."""
    body = _object(body)
    kwargs: dict[str, Any] = {"tool_call_id": _optional_str(body, "toolCallId")}
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

"""The native API's request bodies (camelCase), declared once: pydantic models that parse every REST
body, every batch item and every ``ws/agents`` action frame, and that feed the OpenAPI schema (through
drf-spectacular's pydantic support) — one source of truth for a shape (docs/api.md#request-bodies).

Strict: a key a body does not declare is refused (400 ``INVALID_REQUEST`` with
``details.unknownFields``), never ignored — a misspelled ``reson`` or ``argsFingerprnt`` would
otherwise approve the unedited call or switch a check off. A value of the wrong JSON type names its
field. What the values mean (messages, memory, metadata, edited arguments, resume data) is checked
by the engine, whatever the door. The compatibility prefixes follow their upstreams' rules instead
(``lenient``: unknown keys are ignored, as Mastra's server does).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import pydantic
from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from agentrun.core.errors import AgentRunError
from agentrun.engine.inputs import json_problem
from agentrun.engine.types import DecisionRequest


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


# --- the models -----------------------------------------------------------------------------------
class Body(BaseModel):
    """A JSON object with exactly the declared keys; values of the declared JSON types (no coercion:
    ``"true"`` is not a boolean, ``5`` is not a string)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=False)


def _documented(schema: dict, description: str) -> Any:
    """A value the engine checks (whatever the door), documented in the schema as ``schema``."""
    return Annotated[Any, WithJsonSchema({**schema, "description": description})]


JsonObject = _documented({"type": "object"}, "A JSON object.")
Messages = _documented(
    {"oneOf": [{"type": "string"}, {"type": "array"}]},
    "A string, a list of strings, or a list of {role: user|system|assistant, content}.",
)
Memory = _documented(
    {"type": "object", "properties": {"thread": {"type": "string"}, "resource": {"type": "string"}}},
    "{thread, resource?}: the thread (and the resource) the run belongs to.",
)
UntilIdle = _documented({"oneOf": [{"type": "boolean"}, {"type": "object"}]}, "A boolean, or {maxIdleMs: number}.")
MaxSteps = _documented({"type": "integer", "minimum": 1, "maximum": 1000}, "At most this many model calls.")
Metadata = _documented({"type": "object"}, "At most 16 string pairs.")
AnyJson = _documented({}, "Any JSON value.")
ToolCallId = Annotated[str | None, Field(description="Required when the run has several open calls.")]
Fingerprint = Annotated[
    str | None,
    Field(
        description="sha256 (hex) of the arguments you saw (the listing's argsFingerprint): 409 ARGS_CHANGED if they "
        "changed. Required to approve, edit or resume a high-risk call (428 FINGERPRINT_REQUIRED)."
    ),
]


class StreamBody(Body):
    """``POST /api/agents/{agentId}/stream`` and ``/generate``."""

    messages: Messages
    memory: Memory = None
    untilIdle: UntilIdle = None  # noqa: N815 - the API's camelCase
    requireToolApproval: bool | None = None  # noqa: N815
    maxSteps: MaxSteps = None  # noqa: N815
    metadata: Metadata = None


class ApproveBody(Body):
    toolCallId: ToolCallId = None  # noqa: N815
    args: Annotated[JsonObject, Field(description="The full edited arguments.")] = None
    reason: str | None = None
    argsFingerprint: Fingerprint = None  # noqa: N815


class DeclineBody(Body):
    toolCallId: ToolCallId = None  # noqa: N815
    reason: Annotated[str | None, Field(description="What the model sees instead of the tool result.")] = None
    argsFingerprint: Fingerprint = None  # noqa: N815


class ResumeBody(Body):
    resumeData: Annotated[AnyJson, Field(description="Validated against the tool's resumeSchema.")]  # noqa: N815
    toolCallId: ToolCallId = None  # noqa: N815
    argsFingerprint: Fingerprint = None  # noqa: N815


class BatchItem(Body):
    toolCallId: str  # noqa: N815
    decision: Literal["approve", "decline", "resume"]
    args: Annotated[JsonObject, Field(description="approve: the full edited arguments.")] = None
    reason: str | None = None
    resumeData: Annotated[AnyJson, Field(description="resume: validated against the tool's resumeSchema.")] = None  # noqa: N815
    argsFingerprint: Fingerprint = None  # noqa: N815


MAX_BATCH = 100


class BatchBody(Body):
    decisions: Annotated[
        list[Any], Field(min_length=1, max_length=MAX_BATCH, json_schema_extra={"items": BatchItem.model_json_schema()})
    ]


class ClaimBody(Body):
    """``POST /api/agents/{agentId}/runs/{runId}/claim`` (docs/api.md#claims): who is on a call."""

    action: Annotated[
        Literal["claim", "release", "assign"],
        Field(description="claim: I'm on it; release: let go of my claim; assign: to a person or a group."),
    ]
    toolCallId: ToolCallId = None  # noqa: N815
    assignee: Annotated[str | None, Field(description="assign: a username (null: nobody).")] = None
    assigneeGroup: Annotated[str | None, Field(description="assign: a group name (null: none).")] = None  # noqa: N815


DECISION_BODIES: dict[str, type[Body]] = {"approve": ApproveBody, "decline": DeclineBody, "resume": ResumeBody}


class Frame(Body):
    """A ``ws/agents/<agentId>/`` frame: an action, and the fields of its REST body (``runId`` for a decision)."""

    action: Literal["stream", "approve", "decline", "resume"]
    runId: str | None = None  # noqa: N815


# --- parsing ---------------------------------------------------------------------------------------
_TYPE_NAMES = {
    "string_type": "a string",
    "bool_type": "a boolean",
    "int_type": "an integer",
    "list_type": "a list",
    "dict_type": "a JSON object",
    "literal_error": "one of the allowed values",
    "missing": None,
}


def parse[B: Body](model: type[B], body: Any, *, lenient: bool = False, index: int | None = None) -> B:
    """``body`` (a decoded JSON value) as ``model``, or ``INVALID_REQUEST`` naming what is wrong, having
    changed nothing. ``lenient``: unknown keys are dropped (the compatibility prefixes), not refused."""
    where = {"index": index} if index is not None else {}
    if not isinstance(body, dict):
        raise AgentRunError("INVALID_REQUEST", "the body must be a JSON object", details=where or None)
    unknown = sorted(key for key in body if key not in model.model_fields)
    if unknown:
        if not lenient:
            raise AgentRunError(
                "INVALID_REQUEST",
                f"unknown field{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}",
                details={"unknownFields": unknown, **where},
            )
        body = {key: value for key, value in body.items() if key in model.model_fields}
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as exc:
        raise _invalid(exc, where) from None


def _invalid(exc: pydantic.ValidationError, where: dict) -> AgentRunError:
    first = exc.errors(include_url=False)[0]
    field = ".".join(str(part) for part in first["loc"]) or "the body"
    expected = _TYPE_NAMES.get(first["type"], "")
    if first["type"] == "missing":
        message = f"{field} is required"
    elif expected:
        message = f"{field} must be {expected}"
    else:
        message = f"{field}: {first['msg']}"
    return AgentRunError("INVALID_REQUEST", message, details={"field": field, **where})


# --- bodies → engine arguments ------------------------------------------------------------------------
def stream_kwargs(body: Any, *, lenient: bool = False) -> dict:
    """``{messages, memory?, untilIdle?, requireToolApproval?, maxSteps?, metadata?}`` → ``stream()`` kwargs."""
    parsed = parse(StreamBody, body, lenient=lenient)
    return {
        "messages": parsed.messages,
        "memory": parsed.memory,
        "until_idle": parsed.untilIdle,  # validated by stream(): 0 or "" is not false
        "require_tool_approval": parsed.requireToolApproval,
        "max_steps": parsed.maxSteps,
        "metadata": parsed.metadata,
    }


def decision_request(kind: str, body: Any, *, lenient: bool = False, index: int | None = None) -> DecisionRequest:
    """An approve / decline / resume body → the decision request the engine checks."""
    model = DECISION_BODIES.get(kind)
    if model is None:
        raise AgentRunError("INVALID_REQUEST", f"unknown decision {kind!r}")
    parsed = parse(model, body, lenient=lenient, index=index)
    fields = parsed.model_dump()
    args = fields.get("args")
    if args is not None and not isinstance(args, dict):
        raise AgentRunError(
            "ARGS_INVALID",
            "args must be a JSON object (the full edited arguments)",
            details={"field": "args", **({"index": index} if index is not None else {})},
        )
    return DecisionRequest(
        kind=kind,  # type: ignore[arg-type]
        tool_call_id=fields.get("toolCallId"),
        args=args,
        reason=fields.get("reason"),
        resume_data=fields.get("resumeData"),
        args_fingerprint=fields.get("argsFingerprint"),
    )


def batch_requests(body: Any) -> list[DecisionRequest]:
    """``{"decisions": [{toolCallId, decision, args?, reason?, resumeData?, argsFingerprint?}, …]}`` →
    decision requests. Unknown top-level keys are reported first; a bad item with its ``details.index``."""
    batch = parse(BatchBody, body)
    requests = []
    for index, raw in enumerate(batch.decisions):
        item = parse(BatchItem, raw, index=index)
        fields = {key: value for key, value in raw.items() if key != "decision"}
        requests.append(decision_request(item.decision, fields, index=index))
    return requests


def frame_action(frame: Any) -> tuple[str, str | None, dict]:
    """A ``ws/agents`` frame → ``(action, runId, the fields of its REST body)``: the frame's keys are
    the action's body's plus ``action`` and ``runId``, nothing else."""
    if not isinstance(frame, dict):
        raise AgentRunError("INVALID_REQUEST", "a frame is a JSON object with an action")
    header = parse(Frame, {key: frame[key] for key in ("action", "runId") if key in frame})
    fields = {key: value for key, value in frame.items() if key not in ("action", "runId")}
    if header.action != "stream" and header.runId is None:
        raise AgentRunError("INVALID_REQUEST", "runId is required", details={"field": "runId"})
    return header.action, header.runId, fields

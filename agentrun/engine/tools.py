"""``@tool``: argument schemas from type hints, approval and timeout policies, risk, ``suspend()`` and resume data."""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import jsonschema
import pydantic

from agentrun.core.errors import AgentRunError
from agentrun.engine.inputs import json_problem

if TYPE_CHECKING:
    from agentrun.engine.types import Risk, Waiting

ApprovalPolicy = bool | Callable[["ToolContext", dict], bool | Awaitable[bool]]
RISKS = ("low", "medium", "high")
ON_TIMEOUT = ("decline", "approve", "cancel_run", "escalate")
# Without ``timeout_warning``, approval.timeout_warning goes out when this share of the timeout is left.
DEFAULT_WARNING_SHARE = 0.2


def _seconds(value: float | timedelta | None, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds or a timedelta, not {value!r}")
    return float(value)


@dataclass(frozen=True)
class TimeoutPolicy:
    """What happens to a call nobody approves in time (``@tool(approval_timeout=…, on_timeout=…)``)."""

    timeout: float  # seconds from the moment the call starts waiting
    on_timeout: str  # decline | approve | cancel_run | escalate
    warning: float  # seconds before the deadline: approval.timeout_warning
    escalate_to: tuple[str, ...] = ()  # groups told when on_timeout is "escalate"

    @classmethod
    def build(
        cls,
        approval_timeout: float | timedelta | None,
        on_timeout: str | None,
        timeout_warning: float | timedelta | None,
        escalate_to: str | list[str] | tuple[str, ...] | None,
    ) -> TimeoutPolicy | None:
        timeout = _seconds(approval_timeout, "approval_timeout")
        if timeout is None:
            if on_timeout is not None or timeout_warning is not None or escalate_to is not None:
                raise ValueError("on_timeout, timeout_warning and escalate_to need an approval_timeout")
            return None
        on_timeout = on_timeout or "decline"
        if on_timeout not in ON_TIMEOUT:
            raise ValueError(f"on_timeout must be one of {', '.join(ON_TIMEOUT)}, not {on_timeout!r}")
        groups = (escalate_to,) if isinstance(escalate_to, str) else tuple(escalate_to or ())
        if (on_timeout == "escalate") != bool(groups) or not all(isinstance(g, str) and g for g in groups):
            raise ValueError('on_timeout="escalate" needs escalate_to (group names), and only it takes them')
        warning = _seconds(timeout_warning, "timeout_warning") or timeout * DEFAULT_WARNING_SHARE
        if warning >= timeout:
            raise ValueError("timeout_warning must be shorter than approval_timeout")
        return cls(timeout=timeout, on_timeout=on_timeout, warning=warning, escalate_to=groups)

    def deadlines(self, now: datetime) -> dict:
        """The columns of a call that starts waiting ``now`` (``SuspendedToolCall``)."""
        timeout_at = now + timedelta(seconds=self.timeout)
        return {
            "timeout_at": timeout_at,
            "warn_at": timeout_at - timedelta(seconds=self.warning),
            "on_timeout": self.on_timeout,
        }


class ToolSuspended(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by ``ctx.suspend()``: the run waits for resume data; the tool re-runs from the top."""

    def __init__(self, payload: Any) -> None:
        super().__init__("tool suspended")
        self.payload = payload


class InnerRunSuspended(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by a sub-agent tool whose run waits for a person: the outer call surfaces its open call."""

    def __init__(self, waiting: Waiting) -> None:
        super().__init__("inner run suspended")
        self.waiting = waiting


@dataclass
class ToolContext:
    """What a tool knows about the call it serves. ``tool_call_id`` is the idempotency key."""

    run_id: str
    tool_call_id: str
    agent_id: str
    thread_id: str | None = None
    resource_id: str | None = None
    resume_data: Any = None
    metadata: dict = field(default_factory=dict)

    async def suspend(self, payload: Any = None) -> typing.NoReturn:
        raise ToolSuspended(payload)


def _error_details(exc: pydantic.ValidationError) -> list[dict]:
    return [
        {"loc": ".".join(str(p) for p in err["loc"]) or "$", "message": err["msg"], "type": err["type"]}
        for err in exc.errors(include_url=False, include_input=False, include_context=False)
    ]


class Tool:
    """A callable the model may use. Build one with ``@tool``."""

    def __init__(
        self,
        fn: Callable[..., Awaitable[Any]] | None,
        *,
        id: str,  # noqa: A002 - the contract's name
        description: str = "",
        requires_approval: ApprovalPolicy = False,
        resume_schema: type[pydantic.BaseModel] | dict | None = None,
        background: bool | dict = False,
        risk: str | None = None,
        args_model: type[pydantic.BaseModel] | None = None,
        approval_timeout: float | timedelta | None = None,
        on_timeout: str | None = None,
        timeout_warning: float | timedelta | None = None,
        escalate_to: str | list[str] | None = None,
        approvals_required: int | None = None,
    ) -> None:
        self.id = id
        self.fn = fn
        self.description = description or inspect.getdoc(fn) or ""
        self.requires_approval = requires_approval
        if risk is not None and risk not in RISKS:
            raise ValueError(f"risk must be one of {', '.join(RISKS)}, not {risk!r}")
        # How dangerous a call is, for the person deciding it (docs/runs.md#approval): an approval tool is
        # "medium" unless it says otherwise; a tool that runs on its own is "low".
        self.explicit_risk: Risk | None = risk  # type: ignore[assignment]  # checked above: one of RISKS
        self.risk: Risk = self.explicit_risk or ("medium" if requires_approval else "low")
        self.background = {} if background is True else (dict(background) if background else None)
        # What happens when nobody decides in time (agentrun.engine.timeouts); None: the call waits
        # until someone decides or the agent's suspended_run_ttl expires the run.
        self.timeout_policy = TimeoutPolicy.build(approval_timeout, on_timeout, timeout_warning, escalate_to)
        # How many distinct people approve a call before it runs (None: the agent's default, 1 unless
        # the agent says otherwise). docs/api.md#approvals
        self.approvals_required = check_approvals_required(approvals_required)
        if self.timeout_policy is not None and self.timeout_policy.on_timeout == "approve":
            # Nobody sees what a timeout approves: never a high-risk call, never one that needs people.
            if self.risk == "high":
                raise ValueError('on_timeout="approve" cannot approve a risk="high" tool: nobody would see it')
            if (approvals_required or 1) > 1:
                raise ValueError('on_timeout="approve" cannot stand in for approvals_required people')
        self._ctx_param: str | None = None
        self.args_model = args_model or self._args_model_from_hints()
        self._resume_model: type[pydantic.BaseModel] | None = None
        self._resume_validator: jsonschema.Validator | None = None
        self.resume_schema: dict | None = None
        if isinstance(resume_schema, type) and issubclass(resume_schema, pydantic.BaseModel):
            self._resume_model = resume_schema
            self.resume_schema = resume_schema.model_json_schema()
        elif isinstance(resume_schema, dict):
            jsonschema.Draft202012Validator.check_schema(resume_schema)
            self.resume_schema = resume_schema
            self._resume_validator = jsonschema.Draft202012Validator(resume_schema)
        elif resume_schema is not None:
            raise TypeError("resume_schema must be a pydantic model or a JSON Schema dict")

    def _args_model_from_hints(self) -> type[pydantic.BaseModel]:
        if self.fn is None:
            return pydantic.create_model(f"{self.id}_args", __config__=pydantic.ConfigDict(extra="forbid"))
        # include_extras: keep Annotated[..., Field(gt=0)] constraints (they are the tool's schema).
        hints = typing.get_type_hints(self.fn, include_extras=True)
        fields: dict[str, Any] = {}
        for name, param in inspect.signature(self.fn).parameters.items():
            annotation = hints.get(name, Any)
            if name == "ctx" or annotation is ToolContext:
                self._ctx_param = name
                continue
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[name] = (annotation, default)
        return pydantic.create_model(f"{self.id}_args", __config__=pydantic.ConfigDict(extra="forbid"), **fields)

    # --- schemas and validation -----------------------------------------------------------------
    @property
    def parameters_schema(self) -> dict:
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        return schema

    def validate_args(self, args: Any) -> dict:
        """Validated arguments (JSON-safe), or ``AgentRunError(ARGS_INVALID)``."""
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                raise AgentRunError("ARGS_INVALID", f"arguments are not valid JSON: {exc.msg}") from exc
            except (RecursionError, ValueError):
                raise AgentRunError("ARGS_INVALID", "arguments are not valid JSON") from None
        if not isinstance(args, dict):
            raise AgentRunError("ARGS_INVALID", "arguments must be a JSON object")
        if problem := json_problem(args):
            raise AgentRunError("ARGS_INVALID", f"arguments {problem}")
        try:
            model = self.args_model.model_validate(args)
        except pydantic.ValidationError as exc:
            raise AgentRunError(
                "ARGS_INVALID",
                f"arguments do not match the schema of tool {self.id!r}",
                details={"errors": _error_details(exc)},
            ) from exc
        return model.model_dump(mode="json")

    def validate_resume_data(self, data: Any) -> Any:
        if problem := json_problem(data):
            raise AgentRunError("RESUME_DATA_INVALID", f"resume data {problem}")
        if self._resume_model is not None:
            try:
                return self._resume_model.model_validate(data).model_dump(mode="json")
            except pydantic.ValidationError as exc:
                raise AgentRunError(
                    "RESUME_DATA_INVALID",
                    f"resume data does not match the resume schema of tool {self.id!r}",
                    details={"errors": _error_details(exc)},
                ) from exc
        if self._resume_validator is not None:
            errors = sorted(self._resume_validator.iter_errors(data), key=lambda e: list(e.path))
            if errors:
                raise AgentRunError(
                    "RESUME_DATA_INVALID",
                    f"resume data does not match the resume schema of tool {self.id!r}",
                    details={
                        "errors": [
                            {"loc": ".".join(str(p) for p in e.path) or "$", "message": e.message} for e in errors
                        ]
                    },
                )
        return data

    # --- policy and execution -------------------------------------------------------------------
    def call_risk(self, *, requires_approval: bool) -> Risk:
        """The risk of one call: the tool's own, else "medium" when this call waits for approval
        (a callable policy, or ``require_tool_approval``), else "low"."""
        return self.explicit_risk or ("medium" if requires_approval else "low")

    async def needs_approval(self, ctx: ToolContext, args: dict) -> bool:
        policy = self.requires_approval
        if not callable(policy):
            return bool(policy)
        try:
            verdict = policy(ctx, args)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            return bool(verdict)
        except Exception:
            return True  # a policy that cannot decide fails closed

    async def execute(self, args: dict, ctx: ToolContext) -> Any:
        assert self.fn is not None
        kwargs = dict(args)
        if self._ctx_param:
            kwargs[self._ctx_param] = ctx
        result = self.fn(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    def describe(self) -> dict:
        return {
            "id": self.id,
            # A callable policy may require approval for some calls: advertise it as requiring approval.
            "requiresApproval": True if callable(self.requires_approval) else bool(self.requires_approval),
            "background": self.background is not None,
            "resumeSchema": self.resume_schema,
            "risk": self.risk,
        }

    def __repr__(self) -> str:
        return f"<Tool {self.id}>"


def check_approvals_required(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10):
        raise ValueError(f"approvals_required must be a whole number from 1 to 10, not {value!r}")
    return value


def tool(
    fn: Callable | None = None,
    *,
    id: str | None = None,  # noqa: A002
    description: str = "",
    requires_approval: ApprovalPolicy = False,
    resume_schema: type[pydantic.BaseModel] | dict | None = None,
    background: bool | dict = False,
    risk: str | None = None,
    approval_timeout: float | timedelta | None = None,
    on_timeout: str | None = None,
    timeout_warning: float | timedelta | None = None,
    escalate_to: str | list[str] | None = None,
    approvals_required: int | None = None,
) -> Any:
    """Declare a tool: ``@tool(id="send-email", requires_approval=True, risk="high")`` on an async function.

    ``approvals_required``: how many distinct people must approve the same arguments before a call
    runs (default: the agent's, 1); an edit starts the count again, one decline ends it.

    ``approval_timeout`` (seconds or a timedelta): a call waiting for approval that long gets
    ``on_timeout`` — ``"decline"`` (the default), ``"approve"``, ``"cancel_run"`` or ``"escalate"``
    (the ``escalate_to`` groups are told; the call waits on). ``timeout_warning`` before the deadline
    (default a fifth of the timeout) the ``approval.timeout_warning`` event goes out.
    """

    def wrap(f: Callable) -> Tool:
        return Tool(
            f,
            id=id or f.__name__.replace("_", "-"),
            description=description,
            requires_approval=requires_approval,
            resume_schema=resume_schema,
            background=background,
            risk=risk,
            approval_timeout=approval_timeout,
            on_timeout=on_timeout,
            timeout_warning=timeout_warning,
            escalate_to=escalate_to,
            approvals_required=approvals_required,
        )

    return wrap(fn) if fn is not None else wrap

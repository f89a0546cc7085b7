"""The engine's vocabulary, as types: what crosses its modules and its edge.

- ``AgentSpec``: what the loop, sub-agents, decisions and timeouts need of an agent. ``Agent`` (the
  façade, at the top of the engine) implements it; the layers below type against the protocol and
  never import the façade.
- ``OpenCall`` / ``Waiting`` / ``InnerCall``: a tool call about to wait for people, as the loop hands it
  to the store (``store.record_suspension``).
- ``OutcomeStatus``: how one tool call ended.
- ``Decider``, ``DecisionRequest``, ``DecisionCommand``: who decides, and what — the one typed
  command every door builds and the decision service checks (``engine/service.py``).

This module sits at the bottom of the engine: it imports only the core (and, for type checking, the
tool and model classes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from agentrun.core.models import Decision

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

    from agentrun.engine.providers import LanguageModel
    from agentrun.engine.tools import Tool

Risk = Literal["low", "medium", "high"]
OutcomeStatus = Literal["ok", "error", "denied", "suspended"]
DecisionKind = Literal["approve", "decline", "resume"]
DECISION_KINDS: tuple[DecisionKind, ...] = ("approve", "decline", "resume")


class AgentSpec(Protocol):
    """An agent as the engine's lower layers see it."""

    id: str
    name: str
    description: str
    instructions: str
    suspended_run_ttl: float | None
    background_concurrency: int | None
    approvals_required: int

    @property
    def tools(self) -> Mapping[str, Tool]: ...

    @property
    def model(self) -> LanguageModel: ...

    @property
    def max_steps(self) -> int: ...


# --- calls that wait ------------------------------------------------------------------------------
@dataclass(frozen=True)
class InnerCall:
    """A sub-agent's open call, surfaced on the supervisor's call that started the sub-agent's run."""

    agent_id: str
    run_id: str
    tool_call_id: str
    tool_name: str
    args: Any


@dataclass(frozen=True)
class Waiting:
    """Why a call waits, as its tool (or the approval rule) says: for approval, or for resume data."""

    requires_approval: bool
    suspend_payload: Any = None
    resume_schema: dict | None = None
    risk: Risk | None = None  # None: the risk of the call's own tool
    approvals_required: int = 1
    inner: InnerCall | None = None


@dataclass(frozen=True)
class OpenCall:
    """A call the store records as open (``SuspendedToolCall``), waiting for a person."""

    tool_call_id: str
    tool_name: str
    args: Any
    position: int
    risk: Risk
    waiting: Waiting
    approvals_required: int = 1
    # The number of this call's first suspension: 1 for a call a standing grant approved (its
    # suspension 0 is the grant's decision) that then suspended itself.
    first_suspension: int = 0
    # A timeout policy's deadlines (approval calls of a tool with ``approval_timeout``).
    timeout_at: datetime | None = None
    warn_at: datetime | None = None
    on_timeout: str | None = None

    @classmethod
    def of(
        cls, *, tool_call_id: str, tool_name: str, args: Any, position: int, risk: Risk, waiting: Waiting, **rest: Any
    ) -> OpenCall:
        """A call waiting as ``waiting`` says: its risk and quorum are the inner call's for a call surfaced
        from a sub-agent, else those given."""
        return cls(
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            args=args,
            position=position,
            risk=waiting.risk or risk,
            waiting=waiting,
            approvals_required=waiting.approvals_required if waiting.inner else rest.pop("approvals_required", 1),
            **rest,
        )


# --- decisions ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Decider:
    """Who or what decides. Trust is said, never inferred from a type:

    - ``Decider.person(user, via=…)``: a person at a door (REST, the dashboard, a link, a socket, the
      admin, a Slack message, or Python on a person's behalf). Their permission and agent scope are checked, and a
      high-risk approval needs proof of sight (the ``argsFingerprint`` of what they saw) unless ``via``
      is ``python``.
    - ``Decider.policy(details)``: a standing grant or a timeout policy (``via`` policy).
    - ``Decider.system(name)``: trusted server code — in-process Python by default (``via`` python),
      or the system itself (expiry, ``via`` system). Not checked.
    """

    kind: Literal["person", "policy", "system"]
    via: str
    user: AbstractBaseUser | AnonymousUser | None = None
    name: str | None = None  # recorded as decidedBy when there is no user
    details: Mapping[str, Any] | None = field(default=None)

    @classmethod
    def person(
        cls, user: AbstractBaseUser | AnonymousUser, *, via: str, details: Mapping[str, Any] | None = None
    ) -> Decider:
        """A person at a door. An anonymous user may be named: every check refuses them. ``details``:
        what the door knows of them besides their account (Slack: ``{"slack": {"userId", "teamId"}}``),
        recorded on the decision."""
        return cls(kind="person", via=via, user=user, details=dict(details) if details is not None else None)

    @classmethod
    def policy(cls, details: Mapping[str, Any]) -> Decider:
        return cls(kind="policy", via=Decision.Via.POLICY, details=dict(details))

    @classmethod
    def system(cls, name: str | None = None, *, via: str = Decision.Via.PYTHON) -> Decider:
        return cls(kind="system", via=via, name=name)

    @property
    def checked(self) -> bool:
        """A person: their permissions are checked, and they may see only what their scope allows."""
        return self.kind == "person"

    @property
    def username(self) -> str | None:
        return self.user.get_username() if self.user is not None else self.name

    @property
    def identity(self) -> str:
        """Who counts as one approver towards a quorum (a person, or a named piece of server code)."""
        return f"user:{self.user.pk}" if self.user is not None else f"name:{self.name}"


PYTHON = Decider.system()


@dataclass(frozen=True)
class DecisionRequest:
    """One decision on one open call."""

    kind: DecisionKind
    tool_call_id: str | None = None  # None: the run's only open call
    args: dict | None = None  # approve only: the edited arguments (a full replacement)
    reason: str | None = None
    resume_data: Any = None  # resume only
    # What the decider saw: the fingerprint of the arguments shown (the inner call's, for a call
    # surfaced from a sub-agent) and, for a door that showed it earlier (a signed link, a chat
    # message), the suspension shown then. A call that changed since is refused.
    args_fingerprint: str | None = None
    suspension: int | None = None
    # A decline of a ``suspend()`` call (a question): the tool is not run again, the model is told the
    # person declined to answer, with the reason (docs/dashboard.md#cards). Only a door that offers it
    # sets this; elsewhere a decline of such a call stays WRONG_DECISION_KIND.
    declines_question: bool = False


@dataclass(frozen=True)
class DecisionCommand:
    """Decisions on open calls of one run, all or nothing, by one decider: what every door hands the
    decision service (``engine.service.decide``)."""

    agent_id: str
    run_id: str
    requests: tuple[DecisionRequest, ...]
    decider: Decider
    batch: bool = False  # a batch's errors name the failing request's index

    @classmethod
    def one(cls, *, agent_id: str, run_id: str, decider: Decider, **request: Any) -> DecisionCommand:
        return cls(agent_id=agent_id, run_id=run_id, requests=(DecisionRequest(**request),), decider=decider)

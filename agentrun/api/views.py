"""The REST API of docs/api.md: thin views over the engine's services and selectors.

JSON endpoints are ordinary DRF views. The event-stream endpoints are DRF views too (same
authentication, permissions and error envelope) that answer with a ``StreamingHttpResponse`` over an
async iterator, which Django serves without a thread under ASGI. Engine coroutines are started with
``async_to_sync``: under ASGI that runs them on the server's event loop, so the run they start
outlives the request.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from asgiref.sync import async_to_sync
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from agentrun.api import bodies
from agentrun.api import serializers as s
from agentrun.api.bodies import batch_requests, decision_request, stream_kwargs
from agentrun.api.http import ApiView, EventStreamRenderer, choice_param, int_param, wants_event_stream
from agentrun.api.idempotency import decide_via_api, fingerprint
from agentrun.api.pagination import cursor_page, list_envelope
from agentrun.api.sse import event_stream_response
from agentrun.core import access, claims
from agentrun.core.errors import AgentRunError
from agentrun.core.fanout import subscribe, subscribe_batches
from agentrun.core.models import BackgroundTask, Decision, Message, Run, RunStep, SuspendedToolCall, Thread
from agentrun.core.selectors import (
    SuspendedRun,
    SuspendedRunsStream,
    decision_history,
    encoded_suspended_runs,
    list_suspended_runs,
    stream_suspended_runs,
)
from agentrun.engine import background
from agentrun.engine.agents import Agent, all_agents, generate_result, get_agent
from agentrun.engine.decisions import cancel_run, expire_run_if_due
from agentrun.engine.service import DecisionRequest

JSON = "application/json"


def errors(*statuses: int) -> dict:
    """The error envelope for each status an endpoint can answer with."""
    return {status: OpenApiResponse(s.ErrorSerializer, description="Error envelope") for status in statuses}


READ_ERRORS = (400, 401, 403, 404)
WRITE_ERRORS = (400, 401, 403, 404, 413)
SSE_RESPONSE = OpenApiResponse(
    OpenApiTypes.STR,
    description="Server-sent events: `id: <seq>`, `event: chunk`, `data: <chunk JSON>`; "
    "the stream ends with `event: done` / `data: [DONE]`.",
)


def _param(name: str, description: str, type_: Any = str, **kwargs: Any) -> OpenApiParameter:
    return OpenApiParameter(name, type_, OpenApiParameter.QUERY, required=False, description=description, **kwargs)


CURSOR_PARAMS = [
    _param("limit", "1..100, default 20", int),
    _param("order", "by creation time, default desc", str, enum=["asc", "desc"]),
    _param("after", "an object id: the page after it in this order"),
    _param("before", "an object id: the page before it in this order"),
]


def run_or_404(run_id: str, user: Any) -> Run:
    """The run, or ``RUN_NOT_FOUND`` when it does not exist or its agent is hidden from ``user``."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or not access.in_agent_scope(user, run.agent_id):
        raise AgentRunError("RUN_NOT_FOUND", f"No run {run_id}.")
    return run


def agent_or_404(agent_id: str, user: Any) -> Agent:
    """The registered agent, or ``AGENT_NOT_FOUND`` when it is not registered or hidden from ``user``."""
    agent = get_agent(agent_id)
    if not access.in_agent_scope(user, agent.id):
        raise AgentRunError("AGENT_NOT_FOUND", f"No agent {agent_id!r} is registered.")
    return agent


def _seq_param(value: str | None, name: str) -> int:
    return int_param(value, name=name, default=0, minimum=0, maximum=2**31 - 1)


# --- agents --------------------------------------------------------------------------------------
class AgentListView(ApiView):
    @extend_schema(
        operation_id="agents_list", tags=["agents"], responses={200: s.AgentListSerializer, **errors(401, 403)}
    )
    def get(self, request: Request) -> Response:
        hidden = access.hidden_agent_ids(request.user)
        return Response(list_envelope([agent.to_dict() for agent in all_agents() if agent.id not in hidden]))


class AgentStreamView(ApiView):
    renderer_classes = [*ApiView.renderer_classes, EventStreamRenderer]
    required_permissions = {"POST": access.START_PERMISSION}

    @extend_schema(
        operation_id="agents_stream",
        tags=["agents"],
        request={JSON: bodies.StreamBody},
        responses={(200, "text/event-stream"): SSE_RESPONSE, **errors(*WRITE_ERRORS)},
    )
    def post(self, request: Request, agentId: str) -> Any:  # noqa: N803 - the contract's path parameter
        agent = agent_or_404(agentId, request.user)
        kwargs = stream_kwargs(self.body())
        stream = start_detached(agent.stream, **kwargs, started_by=request.user, dispatch=True)
        return event_stream_response(stream.full_stream)


class AgentGenerateView(ApiView):
    required_permissions = {"POST": access.START_PERMISSION}

    @extend_schema(
        operation_id="agents_generate",
        tags=["agents"],
        request={JSON: bodies.StreamBody},
        responses={200: s.GenerateResponseSerializer, **errors(*WRITE_ERRORS)},
    )
    def post(self, request: Request, agentId: str) -> Response:  # noqa: N803
        agent = agent_or_404(agentId, request.user)
        kwargs = stream_kwargs(self.body()) | {"started_by": request.user}
        return Response(async_to_sync(_generate)(agent, kwargs))


async def _generate(agent: Agent, kwargs: dict) -> dict:
    stream = await agent.stream(**kwargs, dispatch=True)
    await stream.collect()
    return await generate_result(stream)


LISTING_PARAMS = [
    _param("threadId", "only runs of this thread"),
    _param("resourceId", "only runs of this resource"),
    _param("fromDate", "createdAt ≥ this ISO 8601 date-time", OpenApiTypes.DATETIME),
    _param("toDate", "createdAt ≤ this ISO 8601 date-time", OpenApiTypes.DATETIME),
    _param("perPage", "1..1000; pages only when page is given too", int),
    _param("page", "≥ 0, zero-based; pages only when perPage is given too", int),
]


def listing_response(
    request: Request, agents: dict[str, Any], *, with_claims: bool = False
) -> Response | HttpResponse | StreamingHttpResponse:
    """The listing contract's answer for ``agents`` (``agent_id`` or ``agent_ids``): one path for the
    per-agent route and ``GET /api/suspended-runs``, so both filter, order, page and count alike.
    ``with_claims``: each call also carries ``claim`` (docs/api.md#claims)."""
    q = request.query_params
    filters = {
        **agents,
        "thread_id": q.get("threadId") or None,
        "resource_id": q.get("resourceId") or None,
        "from_date": q.get("fromDate"),
        "to_date": q.get("toDate"),
        "with_claims": with_claims,  # who is on each call (docs/api.md#claims); the contract's routes: no
    }
    per_page, page = q.get("perPage"), q.get("page")
    if per_page and page:
        if with_claims:
            return Response(list_suspended_runs(**filters, per_page=per_page, page=page).to_dict())
        # The bytes DRF would render (on PostgreSQL the items kept as JSON at write time: the same JSON).
        del filters["with_claims"]
        encoded = encoded_suspended_runs(_items, **filters, per_page=per_page, page=page)
        return HttpResponse(encoded, content_type=JSON)
    # Unpaged: every match. One batch or less: a plain answer; more: streamed, batch by batch.
    stream = stream_suspended_runs(**filters, per_page=per_page, page=page)
    first, count = stream.next_encoded(_items)
    if stream.done:
        return HttpResponse(b'{"runs":[%s],"total":%d}' % (first, count), content_type=JSON)
    return StreamingHttpResponse(StreamedListing(first, count, stream), content_type=JSON)


class SuspendedRunsView(ApiView):
    @extend_schema(
        operation_id="agents_suspended_runs",
        tags=["agents"],
        parameters=LISTING_PARAMS,
        responses={200: s.SuspendedRunsSerializer, **errors(*READ_ERRORS)},
    )
    def get(self, request: Request, agentId: str) -> Response | HttpResponse | StreamingHttpResponse:  # noqa: N803
        agent = agent_or_404(agentId, request.user)
        return listing_response(request, {"agent_id": agent.id})


class AllSuspendedRunsView(ApiView):
    """docs/api.md#across-agents: the listing over every registered agent the caller may see."""

    @extend_schema(
        operation_id="suspended_runs",
        tags=["agents"],
        parameters=[
            _param("agentId", "only runs of this agent (404 AGENT_NOT_FOUND when hidden)"),
            _param("include", '"claims": each tool call also carries claim (who is on it, who it is assigned to)'),
            *LISTING_PARAMS,
        ],
        responses={200: s.SuspendedRunsSerializer, **errors(*READ_ERRORS)},
    )
    def get(self, request: Request) -> Response | HttpResponse | StreamingHttpResponse:
        include = request.query_params.get("include") or ""
        if include not in ("", "claims"):
            raise AgentRunError(
                "INVALID_REQUEST", f'include takes "claims", not {include!r}.', details={"field": "include"}
            )
        with_claims = include == "claims"
        if agent_id := request.query_params.get("agentId"):
            agent = agent_or_404(agent_id, request.user)
            return listing_response(request, {"agent_id": agent.id}, with_claims=with_claims)
        visible = access.visible_agent_ids(request.user, [agent.id for agent in all_agents()])
        if not visible:
            raise AgentRunError("PERMISSION_DENIED", "You may view no agent.")
        return listing_response(request, {"agent_ids": visible}, with_claims=with_claims)


class StreamedListing:
    """An unpaged listing's body, batch by batch: the answer DRF's JSONRenderer makes of the whole page
    (on PostgreSQL the items come as JSON kept at write time: the same JSON, with PostgreSQL's spacing inside
    nested values; docs/performance.md).

    Memory holds one batch. Django calls ``close()`` when the response ends, also when the client went
    away half-way: the cursor is closed then. ``total`` (every match: nothing is paged) ends the body.
    """

    def __init__(self, first: bytes, count: int, stream: SuspendedRunsStream) -> None:
        self.first, self.count, self.stream = first, count, stream

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._body()

    async def _body(self) -> AsyncIterator[bytes]:
        yield b'{"runs":[' + self.first
        total = self.count
        async for encoded, count in self.stream.encoded_batches(_items):
            yield b"," + encoded
            total += count
        yield b'],"total":%d}' % total

    def close(self) -> None:
        self.stream.close()


def _items(runs: list[SuspendedRun]) -> bytes:
    """The runs' listing items as DRF renders them, comma-separated (no brackets)."""
    return JSONRenderer().render([run.to_dict() for run in runs])[1:-1]


# --- decisions -----------------------------------------------------------------------------------
class DecisionView(ApiView):
    """approve / decline / resume: 202 and a server-side continuation, or the continuation as SSE."""

    kind = ""
    renderer_classes = [*ApiView.renderer_classes, EventStreamRenderer]
    required_permissions = {"POST": access.DECIDE_PERMISSION}

    def requests(self, body: Any) -> list[DecisionRequest]:
        return [decision_request(self.kind, body)]

    def decide(self, request: Request, agent_id: str, run_id: str, *, batch: bool = False) -> Any:
        agent = agent_or_404(agent_id, request.user)
        body = self.body()
        answer = decide_via_api(
            user=request.user,
            agent_id=agent.id,
            run_id=run_id,
            requests=self.requests(body),
            batch=batch,
            idempotency_key=request.headers.get("Idempotency-Key"),
            request_fingerprint=fingerprint(request.method, request.path, body),
        )
        if wants_event_stream(request):
            # The continuation runs server-side (queued with the decision); follow it in the chunk log.
            # An approval that does not complete its call's quorum queued none: the stream ends at once.
            chunks = subscribe(answer.run_id, answer.stream_after, until="rest", after_a_finish=True)
            return event_stream_response(chunks if _continues(answer.body) else _nothing())
        return Response(answer.body, status=answer.status)


def _continues(body: dict) -> bool:
    """Whether a 202 body's decisions queued a continuation: a decision completed its call (an approval
    that does not complete a quorum shows fewer ``approvals.given`` than ``required``)."""
    items = body.get("decisions") or [body]
    return any(
        "approvals" not in item or len(item["approvals"]["given"]) >= item["approvals"]["required"] for item in items
    )


async def _nothing() -> AsyncIterator[dict]:
    return
    yield


def start_detached(start: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """Start a run's producer from this sync view, on the server's loop, for a streamed response.

    The task gets a fresh context: it must not inherit the request's thread-sensitive executor (asgiref
    refuses calls through it once the request has ended), because the run outlives the request — a
    client that hangs up does not stop it. (Callers that wait for the run to end in this thread must
    not do this: the fresh context's database calls would queue behind this very thread.)
    """

    async def detached() -> Any:
        return await asyncio.get_running_loop().create_task(start(*args, **kwargs), context=contextvars.Context())

    return async_to_sync(detached)()


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="A retried request with the same key (per user) gets the first answer.",
)


def _decision_schema(kind: str, request: type) -> Any:
    return extend_schema(
        operation_id=f"runs_{kind}",
        tags=["decisions"],
        request={JSON: request},
        parameters=[IDEMPOTENCY_KEY],
        responses={
            (202, JSON): s.DecisionAcceptedSerializer,
            (200, "text/event-stream"): SSE_RESPONSE,
            **errors(*WRITE_ERRORS, 409),
        },
        description=f"{kind.capitalize()} a suspended tool call. `Accept: text/event-stream` streams the "
        "continuation in the response; otherwise 202 and the continuation runs server-side.",
    )


class ApproveView(DecisionView):
    kind = "approve"

    @_decision_schema("approve", bodies.ApproveBody)
    def post(self, request: Request, agentId: str, runId: str) -> Any:  # noqa: N803
        return self.decide(request, agentId, runId)


class DeclineView(DecisionView):
    kind = "decline"

    @_decision_schema("decline", bodies.DeclineBody)
    def post(self, request: Request, agentId: str, runId: str) -> Any:  # noqa: N803
        return self.decide(request, agentId, runId)


class ResumeView(DecisionView):
    kind = "resume"

    @_decision_schema("resume", bodies.ResumeBody)
    def post(self, request: Request, agentId: str, runId: str) -> Any:  # noqa: N803
        return self.decide(request, agentId, runId)


class BatchDecisionView(DecisionView):
    """Several calls of one run decided all-or-nothing in one transaction (docs/api.md#batch-decisions)."""

    def requests(self, body: Any) -> list[DecisionRequest]:
        return batch_requests(body)

    @extend_schema(
        operation_id="runs_decisions",
        tags=["decisions"],
        request={JSON: bodies.BatchBody},
        parameters=[IDEMPOTENCY_KEY],
        responses={
            (202, JSON): s.BatchDecisionAcceptedSerializer,
            (200, "text/event-stream"): SSE_RESPONSE,
            **errors(*WRITE_ERRORS, 409),
        },
        description="Decide several open calls of a run at once, all or nothing: the first failing "
        "decision's error (with `details.index`) and nothing recorded, or 202 and one continuation.",
    )
    def post(self, request: Request, agentId: str, runId: str) -> Any:  # noqa: N803
        return self.decide(request, agentId, runId, batch=True)


# --- runs ----------------------------------------------------------------------------------------
class ClaimView(ApiView):
    """Shared work on an open call (docs/api.md#claims): claim, release, assign. Never decides anything
    and never stops anyone else from deciding."""

    required_permissions = {"POST": access.DECIDE_PERMISSION}

    # Out of the OpenAPI schema, which describes the contract's routes exactly; docs/api.md#claims has it.
    @extend_schema(exclude=True)
    def post(self, request: Request, agentId: str, runId: str) -> Response:  # noqa: N803
        agent = agent_or_404(agentId, request.user)
        body = bodies.parse(bodies.ClaimBody, self.body())
        if not access.can_decide_agent(request.user, agent.id):
            raise AgentRunError("PERMISSION_DENIED", "You may not work on this agent's tool calls.")
        run = Run.objects.filter(pk=runId, agent_id=agent.id).first()
        if run is None:
            raise AgentRunError("RUN_NOT_FOUND", f"No run {runId}.")
        calls = SuspendedToolCall.objects.select_related(*claims.RELATED).filter(
            run=run, status=SuspendedToolCall.Status.OPEN
        )
        if body.toolCallId is not None:
            calls = calls.filter(tool_call_id=body.toolCallId)
        found = list(calls[:2])
        if not found:
            raise AgentRunError("TOOL_CALL_NOT_SUSPENDED", "No such open tool call in this run.")
        if len(found) > 1:
            raise AgentRunError("AMBIGUOUS_TOOL_CALL", "The run has several open calls: name the toolCallId.")
        call = found[0]
        if body.action == "claim":
            state = claims.claim(user=request.user, call=call)
        elif body.action == "release":
            state = claims.release(user=request.user, call=call)
        else:
            state = claims.assign(by=request.user, call=call, username=body.assignee, group=body.assigneeGroup)
        return Response({"runId": run.id, "toolCallId": call.tool_call_id, "claim": state.to_dict()})


class RunDetailView(ApiView):
    @extend_schema(
        operation_id="runs_retrieve", tags=["runs"], responses={200: s.RunSerializer, **errors(*READ_ERRORS)}
    )
    def get(self, request: Request, runId: str) -> Response:  # noqa: N803
        run = run_or_404(runId, request.user)
        if expire_run_if_due(run.id):  # a run past its time to live reads as expired, sweeper or not
            run.refresh_from_db()
        return Response(run.to_dict())


class RunCancelView(ApiView):
    required_permissions = {"POST": access.CANCEL_PERMISSION}

    @extend_schema(
        operation_id="runs_cancel",
        tags=["runs"],
        request=None,
        responses={200: s.RunSerializer, **errors(*WRITE_ERRORS, 409)},
    )
    def post(self, request: Request, runId: str) -> Response:  # noqa: N803
        run = run_or_404(runId, request.user)
        return Response(cancel_run(run_id=run.id, agent_id=run.agent_id).to_dict())


class RunStepListView(ApiView):
    @extend_schema(
        operation_id="runs_steps_list",
        tags=["runs"],
        parameters=CURSOR_PARAMS,
        responses={200: s.StepListSerializer, **errors(*READ_ERRORS)},
    )
    def get(self, request: Request, runId: str) -> Response:  # noqa: N803
        run = run_or_404(runId, request.user)
        return Response(cursor_page(RunStep.objects.filter(run=run), request.query_params))


class RunStepDetailView(ApiView):
    @extend_schema(
        operation_id="runs_steps_retrieve", tags=["runs"], responses={200: s.StepSerializer, **errors(*READ_ERRORS)}
    )
    def get(self, request: Request, runId: str, stepId: str) -> Response:  # noqa: N803
        run = run_or_404(runId, request.user)
        step = RunStep.objects.filter(run=run, pk=stepId).first()
        if step is None:
            raise AgentRunError("NOT_FOUND", f"Run {run.id} has no step {stepId}.")
        return Response(step.to_dict())


class RunStreamView(ApiView):
    renderer_classes = [*ApiView.renderer_classes, EventStreamRenderer]

    @extend_schema(
        operation_id="runs_stream",
        tags=["runs"],
        parameters=[
            _param("after", "replay chunks with seq > after (default 0; Last-Event-ID wins)", int),
            OpenApiParameter(
                "Last-Event-ID",
                int,
                OpenApiParameter.HEADER,
                required=False,
                description="the last seq received: the stream resumes after it",
            ),
        ],
        responses={(200, "text/event-stream"): SSE_RESPONSE, **errors(*READ_ERRORS)},
    )
    def get(self, request: Request, runId: str) -> Any:  # noqa: N803
        run = run_or_404(runId, request.user)
        last_event_id = request.headers.get("Last-Event-ID")
        if last_event_id:
            after = _seq_param(last_event_id, "Last-Event-ID")
        else:
            after = _seq_param(request.query_params.get("after"), "after")
        return event_stream_response(batches=subscribe_batches(run.id, after, until="rest", resync=True))


# --- threads, decisions, background tasks --------------------------------------------------------
class ThreadMessageListView(ApiView):
    @extend_schema(
        operation_id="threads_messages_list",
        tags=["threads"],
        parameters=CURSOR_PARAMS,
        responses={200: s.MessageListSerializer, **errors(*READ_ERRORS)},
    )
    def get(self, request: Request, threadId: str) -> Response:  # noqa: N803
        if not Thread.objects.filter(pk=threadId).exists():
            raise AgentRunError("NOT_FOUND", f"No thread {threadId}.")
        messages = Message.objects.filter(thread_id=threadId)
        if hidden := access.hidden_agent_ids(request.user):
            # A thread's messages belong to its runs: those of hidden agents are left out, and a thread
            # whose runs are all hidden does not exist for this user.
            runs = Run.objects.filter(thread_id=threadId)
            if runs.exists() and not runs.exclude(agent_id__in=hidden).exists():
                raise AgentRunError("NOT_FOUND", f"No thread {threadId}.")
            messages = messages.exclude(run__agent_id__in=hidden)
        return Response(cursor_page(messages, request.query_params))


class DecisionListView(ApiView):
    @extend_schema(
        operation_id="decisions_list",
        tags=["decisions"],
        parameters=[
            _param("agentId", "only decisions on this agent's runs"),
            _param("threadId", "only decisions on this thread"),
            _param("runId", "only decisions on this run"),
            _param("decidedBy", "username of the person who decided"),
            _param("toolName", "only decisions on this tool (a sub-agent's tool surfaced on its supervisor's too)"),
            _param("via", "only decisions made this way", str, enum=list(Decision.Via.values)),
            _param("kind", "only decisions of this kind", str, enum=list(Decision.Kind.values)),
            _param("fromDate", "decidedAt ≥ this ISO 8601 date-time", OpenApiTypes.DATETIME),
            _param("toDate", "decidedAt ≤ this ISO 8601 date-time", OpenApiTypes.DATETIME),
            *CURSOR_PARAMS,
        ],
        responses={200: s.DecisionListSerializer, **errors(*READ_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        q = request.query_params
        decisions = decision_history(
            hidden=access.hidden_agent_ids(request.user),
            agent_id=q.get("agentId"),
            thread_id=q.get("threadId"),
            run_id=q.get("runId"),
            decided_by=q.get("decidedBy"),
            tool_name=q.get("toolName"),
            via=choice_param(q.get("via"), name="via", choices=tuple(Decision.Via.values), default=None),
            kind=choice_param(q.get("kind"), name="kind", choices=tuple(Decision.Kind.values), default=None),
            from_date=q.get("fromDate"),
            to_date=q.get("toDate"),
        )
        return Response(cursor_page(decisions, q, time_field="decided_at"))


BACKGROUND_TASK_STATUSES = ("pending", "running", "completed", "failed", "cancelled", "timed_out")


class BackgroundTaskListView(ApiView):
    @extend_schema(
        operation_id="background_tasks_list",
        tags=["background tasks"],
        parameters=[
            _param("agentId", "only tasks of this agent"),
            _param("threadId", "only tasks of this thread"),
            _param("runId", "only tasks of this run"),
            _param("status", "only tasks in this state", str, enum=list(BACKGROUND_TASK_STATUSES)),
            *CURSOR_PARAMS,
        ],
        responses={200: s.BackgroundTaskListSerializer, **errors(*READ_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        q = request.query_params
        tasks = access.only_visible(BackgroundTask.objects.all(), request.user)
        if status := choice_param(q.get("status"), name="status", choices=BACKGROUND_TASK_STATUSES, default=None):
            tasks = tasks.filter(status=status)
        for param, field in (("agentId", "agent_id"), ("threadId", "thread_id"), ("runId", "run_id")):
            if value := q.get(param):
                tasks = tasks.filter(**{field: value})
        return Response(cursor_page(tasks, q))


class BackgroundTaskCancelView(ApiView):
    required_permissions = {"POST": access.CANCEL_PERMISSION}

    @extend_schema(
        operation_id="background_tasks_cancel",
        tags=["background tasks"],
        request=None,
        responses={200: s.BackgroundTaskSerializer, **errors(*WRITE_ERRORS, 409)},
    )
    def post(self, request: Request, taskId: str) -> Response:  # noqa: N803
        task = BackgroundTask.objects.filter(pk=taskId).values_list("agent_id", flat=True).first()
        if task is not None and not access.in_agent_scope(request.user, task):
            raise AgentRunError("NOT_FOUND", f"No background task {taskId}.")
        return Response(async_to_sync(background.cancel)(taskId).to_dict())

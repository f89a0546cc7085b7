"""Mastra's agent routes under ``/api/mastra/`` (docs/api.md#compatibility-prefixes), so
``@mastra/client-js`` works with ``apiPrefix: "/api/mastra"``: a thin adapter over the native API's engine,
permissions and decisions.

Shapes are those of ``@mastra/server`` (verified against 1.69.0, and ``@mastra/client-js`` 1.47.0):

- Event streams are Mastra's: one ``data: <chunk JSON>`` event per chunk (no ``id:`` / ``event:``
  lines, which the client's parser drops), ending with ``data: [DONE]``. A stream that continues a
  run (approve, decline, resume) sends each call's ``tool-call`` chunk before its result, as the
  client requires; ``finish`` also carries Mastra's ``stepResult.reason`` and ``output.usage``.
- Decisions name the run and call in the body: ``{runId, toolCallId}`` (+ ``reason`` to decline;
  ``{runId, resumeData, toolCallId?}`` to resume; beyond Mastra, the native ``argsFingerprint``, and
  ``args`` to approve with edited arguments) and answer with the continuation's stream (or, for
  ``…-generate``, its result as JSON). They go through the one decision service with ``via = "api"``,
  like the native decision routes: the task runner continues the run and these views follow its chunk
  log.
- Errors are Mastra's envelope, ``{"error": "<message>"}``, plus the contract's ``code`` (and
  ``details``) so a client can still tell ``TOOL_CALL_ALREADY_DECIDED`` from ``RUN_NOT_FOUND``.

Authentication and authorization are the native API's (``Token`` / ``Bearer`` / session; the groups and
per-agent scope of ``agentrun.core.access``). Mastra's ``requestContext``, ``runId`` chosen by the client,
client tools and model overrides are not supported and are ignored.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from django.http import JsonResponse, StreamingHttpResponse
from django.urls import re_path
from rest_framework.request import Request
from rest_framework.response import Response

from agentrun.api import views
from agentrun.api.bodies import decision_request, stream_kwargs
from agentrun.api.exceptions import exception_handler
from agentrun.api.http import ApiView
from agentrun.api.openai_compat import model_name
from agentrun.api.urls import both
from agentrun.core import access
from agentrun.core.errors import AgentRunError
from agentrun.core.fanout import release_connection, subscribe
from agentrun.core.models import Decision, Run
from agentrun.engine.agents import Agent, all_agents
from agentrun.engine.service import Decider, DecisionCommand, DecisionOutcome, decide

logger = logging.getLogger("agentrun.api")

DONE = b"data: [DONE]\n\n"
RESULT_TYPES = ("tool-result", "tool-error", "tool-output-denied", "tool-call-approval", "tool-call-suspended")


# --- errors --------------------------------------------------------------------------------------
def mastra_error(body: dict) -> dict:
    """The contract's ``{"error": {code, message, details?}}`` in Mastra's spelling."""
    error = body["error"]
    return {
        "error": error["message"],
        "code": error["code"],
        **({"details": error["details"]} if "details" in error else {}),
    }


def mastra_exception_handler(exc: Exception, context: dict) -> Any:
    response = exception_handler(exc, context)
    if response is not None:
        response.data = mastra_error(response.data)
    return response


class MastraView(ApiView):
    """The native API's view (auth, permissions, bounded JSON) answering errors as Mastra does."""

    schema = None  # Mastra's routes are documented by Mastra; /api/schema/ describes the contract's

    def get_exception_handler(self) -> Callable:
        return mastra_exception_handler


def mastra_not_found(request: Any, *args: Any, **kwargs: Any) -> JsonResponse:
    return JsonResponse({"error": f"No endpoint {request.path}.", "code": "NOT_FOUND"}, status=404)


# --- event streams -------------------------------------------------------------------------------
def mastra_chunks(
    chunks: AsyncIterator[dict], *, continuation: bool = False, one_segment: bool = False
) -> AsyncIterator[dict]:
    """Chunks as a Mastra client expects them (see the module's docstring). ``continuation``: the stream
    of a decision, which announces each call again before its result; ``one_segment``: end after the
    first ``finish``, as Mastra ends a stream with its execution."""

    async def adapt() -> AsyncIterator[dict]:
        announced: set[str] = set()
        async with aclosing(chunks) as source:
            async for chunk in source:
                payload = chunk["payload"]
                if chunk["type"] == "tool-call":
                    announced.add(payload["toolCallId"])
                elif continuation and chunk["type"] in RESULT_TYPES and payload.get("toolCallId") not in announced:
                    # A continuation starts after the call was announced (in an earlier stream).
                    announced.add(payload["toolCallId"])
                    yield {
                        "type": "tool-call",
                        "runId": chunk["runId"],
                        "from": chunk["from"],
                        "payload": {k: payload[k] for k in ("toolCallId", "toolName", "args") if k in payload},
                    }
                if chunk["type"] == "finish":
                    usage = payload.get("usage") or {}
                    chunk = dict(
                        chunk,
                        payload={
                            **payload,
                            "stepResult": {"reason": payload.get("finishReason")},
                            "output": {
                                "usage": {
                                    "inputTokens": usage.get("promptTokens"),
                                    "outputTokens": usage.get("completionTokens"),
                                    "totalTokens": usage.get("totalTokens"),
                                }
                            },
                        },
                    )
                yield chunk
                if one_segment and chunk["type"] == "finish":
                    return

    return adapt()


def _event(data: dict) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _events(chunks: AsyncIterator[dict], run_id: str | None) -> AsyncIterator[bytes]:
    async with aclosing(chunks) as source:
        try:
            async for chunk in source:
                yield _event(chunk)
        except AgentRunError as exc:
            # The response has started: the error travels as Mastra's error chunk, then the stream ends.
            yield _event({"type": "error", "runId": run_id, "from": "AGENT", "payload": exc.to_dict()})
        except Exception:
            logger.exception("a Mastra event stream failed")
            error = {"error": {"code": "server_error", "message": "the stream failed"}}
            yield _event({"type": "error", "runId": run_id, "from": "AGENT", "payload": error})
    yield DONE


def mastra_event_stream(chunks: AsyncIterator[dict], run_id: str | None = None) -> StreamingHttpResponse:
    release_connection()  # the view's: the stream may last long (see agentrun.core.fanout)
    response = StreamingHttpResponse(_events(chunks, run_id), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: send each event at once
    return response


# --- bodies --------------------------------------------------------------------------------------
def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise AgentRunError("INVALID_REQUEST", "the body must be a JSON object")
    return body


def _required_str(body: dict, name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise AgentRunError("INVALID_REQUEST", f"{name} is required (a string)")
    return value


def _messages(messages: Any) -> Any:
    """Mastra's messages: a string, or messages whose ``content`` is a string or a list of text parts."""
    if not isinstance(messages, list):
        return messages
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
            ):
                raise AgentRunError(
                    "INVALID_REQUEST", "only text parts ({type: 'text', text}) are supported in messages"
                )
            message = {**message, "content": "".join(p["text"] for p in content)}
        out.append(message)
    return out


def _stream_kwargs(body: Any, *, until_idle: bool = False) -> dict:
    """Mastra's ``agentExecutionBodySchema`` → ``Agent.stream()`` keyword arguments."""
    body = _object(body)
    native = {key: body[key] for key in ("memory", "requireToolApproval", "maxSteps", "untilIdle") if key in body}
    if "messages" in body:
        native["messages"] = _messages(body["messages"])
    if until_idle:  # /stream-until-idle: untilIdle is implied; maxIdleMs may also come at the top level
        given = body.get("untilIdle")
        max_idle = body.get("maxIdleMs", given.get("maxIdleMs") if isinstance(given, dict) else None)
        native["untilIdle"] = {"maxIdleMs": max_idle} if max_idle is not None else True
    memory = native.get("memory")
    if isinstance(memory, dict):
        native["memory"] = {"thread": memory.get("thread"), "resource": memory.get("resource")}
    return stream_kwargs(native, lenient=True)


# --- decisions -----------------------------------------------------------------------------------
def _continuation(outcome: DecisionOutcome) -> AsyncIterator[dict]:
    if not outcome.continue_run_id:  # an approval towards a quorum: nothing runs yet
        return mastra_chunks(_nothing(), continuation=True, one_segment=True)
    chunks = subscribe(outcome.run_id, outcome.after_seq, until="rest", after_a_finish=True)
    return mastra_chunks(chunks, continuation=True, one_segment=True)


async def _nothing() -> AsyncIterator[dict]:
    return
    yield


class DecisionView(MastraView):
    """approve-tool-call / decline-tool-call / resume-stream, and the ``-generate`` variants."""

    kind = ""
    required_permissions = {"POST": access.DECIDE_PERMISSION}
    generate = False

    def post(self, request: Request, agentId: str) -> Any:  # noqa: N803 - Mastra's path parameter
        agent = views.agent_or_404(agentId, request.user)
        body = self.body()
        # The native body's fields (toolCallId, reason, resumeData, argsFingerprint; args to approve with
        # edited arguments), plus Mastra's: runId always, toolCallId to approve or decline. Keys Mastra's
        # server would ignore are ignored (docs/api.md#compatibility-prefixes); the engine's rules are the same.
        decision = decision_request(self.kind, body, lenient=True)
        run_id = _required_str(body, "runId")
        if self.kind != "resume":
            _required_str(body, "toolCallId")
        # The one decision service: recorded with via="api", its continuation queued for the task
        # runner in the same transaction; this view only follows the run's chunk log.
        outcome = decide(
            DecisionCommand(
                agent_id=agent.id,
                run_id=run_id,
                requests=(decision,),
                decider=Decider.person(request.user, via=Decision.Via.API),
            )
        )
        chunks = _continuation(outcome)
        if self.generate:
            return _json_stream(_generate_result, outcome.run_id, chunks)
        return mastra_event_stream(chunks, outcome.run_id)


class ApproveToolCallView(DecisionView):
    kind = "approve"


class DeclineToolCallView(DecisionView):
    kind = "decline"


class ResumeStreamView(DecisionView):
    kind = "resume"


class ApproveToolCallGenerateView(ApproveToolCallView):
    generate = True


class DeclineToolCallGenerateView(DeclineToolCallView):
    generate = True


async def _generate_result(run_id: str, chunks: AsyncIterator[dict]) -> dict:
    """What Mastra's ``generate`` answers, from the continuation's chunks."""
    collected = [chunk async for chunk in chunks]
    finish = next((c["payload"] for c in reversed(collected) if c["type"] == "finish"), {})
    return {
        "runId": run_id,
        "text": "".join(c["payload"]["text"] for c in collected if c["type"] == "text-delta"),
        "finishReason": finish.get("finishReason"),
        "usage": finish.get("usage"),
        "toolCalls": [c for c in collected if c["type"] == "tool-call"],
        "toolResults": [c for c in collected if c["type"] == "tool-result"],
        "status": (await Run.objects.filter(pk=run_id).values_list("status", flat=True).aget()),
    }


def _json_stream(make: Callable[..., Awaitable[dict]], *args: Any) -> StreamingHttpResponse:
    """A JSON body produced on the event loop once the run rests: the request's thread is not held
    while the continuation (which may need that thread's database executor) runs."""

    async def body() -> AsyncIterator[bytes]:
        try:
            data = await make(*args)
        except AgentRunError as exc:
            data = mastra_error(exc.to_dict())
        yield json.dumps(data).encode()

    release_connection()  # the view's: the run may take long to rest (see agentrun.core.fanout)
    return StreamingHttpResponse(body(), content_type="application/json")


# --- runs ----------------------------------------------------------------------------------------
class StreamView(MastraView):
    """``POST /agents/{agentId}/stream`` (and ``/stream-until-idle``): start a run, stream its chunks."""

    required_permissions = {"POST": access.START_PERMISSION}
    until_idle = False

    def post(self, request: Request, agentId: str) -> Any:  # noqa: N803
        agent = views.agent_or_404(agentId, request.user)
        kwargs = _stream_kwargs(self.body(), until_idle=self.until_idle)
        stream = views.start_detached(agent.stream, **kwargs, started_by=request.user, dispatch=True)
        return mastra_event_stream(mastra_chunks(stream.full_stream), stream.run_id)


class StreamUntilIdleView(StreamView):
    until_idle = True


class ObserveView(MastraView):
    """``POST /agents/{agentId}/observe`` ``{runId, offset?}``: replay from the 0-based event ``offset``
    (= chunks with ``seq > offset``), then live, until the segment's ``finish``."""

    def post(self, request: Request, agentId: str) -> Any:  # noqa: N803
        agent = views.agent_or_404(agentId, request.user)
        body = _object(self.body())
        run_id = _required_str(body, "runId")
        offset = body.get("offset", 0)
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 2**31:
            raise AgentRunError("INVALID_REQUEST", "offset must be a non-negative integer")
        if not Run.objects.filter(pk=run_id, agent_id=agent.id).exists():
            raise AgentRunError("RUN_NOT_FOUND", f"No run {run_id} for agent {agent.id}.")
        chunks = mastra_chunks(subscribe(run_id, offset, until="rest"), one_segment=True)
        return mastra_event_stream(chunks, run_id)


def mastra_agent(agent: Agent) -> dict:
    """Mastra's serialized agent (``GET /agents/{agentId}``): what agentrun knows of it."""
    provider, _, model_id = model_name(agent).rpartition(":")
    return {
        "id": agent.id,
        "name": agent.name,
        "description": agent.description,
        "instructions": agent.instructions,
        "tools": {
            t.id: {
                "id": t.id,
                "description": t.description,
                "inputSchema": json.dumps(t.parameters_schema),
                "requireApproval": t.describe()["requiresApproval"],
            }
            for t in agent.tools.values()
        },
        "agents": {a.id: {"id": a.id, "name": a.name} for a in agent.sub_agents},
        "workflows": {},
        "skills": [],
        "workspaceTools": [],
        "browserTools": [],
        "hasBrowser": False,
        "inputProcessors": [],
        "outputProcessors": [],
        "provider": provider or "agentrun",
        "modelId": model_id,
        "supportsMemory": True,
    }


class AgentListView(MastraView):
    """``GET /agents``: Mastra's record of agent id → serialized agent (the agents this user may see)."""

    def get(self, request: Request) -> Response:
        hidden = access.hidden_agent_ids(request.user)
        return Response({a.id: mastra_agent(a) for a in all_agents() if a.id not in hidden})


class AgentDetailView(MastraView):
    def get(self, request: Request, agentId: str) -> Response:  # noqa: N803
        return Response(mastra_agent(views.agent_or_404(agentId, request.user)))


class SuspendedRunsView(MastraView, views.SuspendedRunsView):
    """``GET /agents/{agentId}/suspended-runs``: the listing contract is Mastra's shape already."""


# --- routes (``/api/mastra/`` + Mastra's paths; each with and without its trailing slash) -----------
urlpatterns = [
    *both("agents", AgentListView.as_view(), "mastra-agents"),
    *both("agents/<str:agentId>", AgentDetailView.as_view(), "mastra-agent"),
    *both("agents/<str:agentId>/stream", StreamView.as_view(), "mastra-stream"),
    *both("agents/<str:agentId>/stream-until-idle", StreamUntilIdleView.as_view(), "mastra-stream-until-idle"),
    *both("agents/<str:agentId>/observe", ObserveView.as_view(), "mastra-observe"),
    *both("agents/<str:agentId>/suspended-runs", SuspendedRunsView.as_view(), "mastra-suspended-runs"),
    *both("agents/<str:agentId>/approve-tool-call", ApproveToolCallView.as_view(), "mastra-approve"),
    *both("agents/<str:agentId>/decline-tool-call", DeclineToolCallView.as_view(), "mastra-decline"),
    *both("agents/<str:agentId>/resume-stream", ResumeStreamView.as_view(), "mastra-resume"),
    *both(
        "agents/<str:agentId>/approve-tool-call-generate",
        ApproveToolCallGenerateView.as_view(),
        "mastra-approve-generate",
    ),
    *both(
        "agents/<str:agentId>/decline-tool-call-generate",
        DeclineToolCallGenerateView.as_view(),
        "mastra-decline-generate",
    ),
    re_path(r"^.*$", mastra_not_found),
]

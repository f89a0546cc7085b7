"""The Azure AI Agents / OpenAI Assistants read API under ``/api/openai/v1/`` (docs/api.md#compatibility-prefixes).

Point an Assistants client at ``<server>/api/openai/v1`` (the ``openai`` SDK's ``base_url``, the
``azure-ai-agents`` SDK's ``endpoint``) with an API token as its key (sent as ``Authorization: Bearer``)
and it reads agentrun's threads, runs, run steps and messages in its own wire shape:

- snake_case fields, Unix-second timestamps, ``assistant_id`` (the agent's id);
- lists ``{object: "list", data, first_id, last_id, has_more}`` with ``limit`` (1..100, 20), ``order``
  (asc | desc, desc), ``after`` and ``before`` (object ids), as the native lists;
- a suspended run reads as ``requires_action``, its ``required_action`` a ``submit_tool_outputs``
  naming each open call (``{id, type: "function", function: {name, arguments}}``); deciding those
  calls happens through the native or Mastra routes, the dashboard or Python (this API only reads);
- errors ``{"error": {code, message, details?, type, param}}``: the contract's envelope plus the
  OpenAI error object's ``type`` and ``param``.

Ids in the path are read from the path as sent (``raw_path``), segment by segment (``path_segments``):
a thread id holding ``/runs/`` reaches its thread when the client percent-encodes it, as both SDKs do.

Authorization is the native API's: the read permission and the per-agent scope of ``agentrun.core.access``
(a hidden agent's run is ``RUN_NOT_FOUND``, a thread with no visible run ``NOT_FOUND``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import unquote_to_bytes

from django.db.models import Prefetch, Q, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.request import Request
from rest_framework.response import Response

from agentrun.api import views
from agentrun.api.exceptions import envelope, exception_handler
from agentrun.api.http import ApiView
from agentrun.api.pagination import cursor_page
from agentrun.core import access
from agentrun.core.errors import AgentRunError
from agentrun.core.models import Message, Run, RunStep, SuspendedToolCall, Thread
from agentrun.engine.agents import Agent, get_agent
from agentrun.engine.decisions import expire_run_if_due

# Run statuses are the Assistants ones already, except the one a person is waiting on.
RUN_STATUS = {Run.Status.SUSPENDED: "requires_action"}


def unix(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def _usage(usage: dict | None) -> dict | None:
    if not usage:
        return None
    return {
        "prompt_tokens": usage.get("promptTokens", 0),
        "completion_tokens": usage.get("completionTokens", 0),
        "total_tokens": usage.get("totalTokens", 0),
    }


# --- objects -------------------------------------------------------------------------------------
def thread_object(thread: Thread) -> dict:
    return {
        "id": thread.id,
        "object": "thread",
        "created_at": unix(thread.created_at),
        "metadata": thread.metadata or {},
        "tool_resources": {},
    }


def _registered(agent_id: str) -> Agent | None:
    try:
        return get_agent(agent_id)
    except AgentRunError:  # a run of an agent no longer registered still reads
        return None


def model_name(agent: Agent | None) -> str:
    """The agent's model (``directive``, ``openai:<model>``), as Assistants' ``model`` and Mastra's ``modelId``."""
    try:
        return agent.model.name if agent else ""
    except Exception:  # a provider that cannot start (no API key here) must not break a read
        return ""


def _function_call(call_id: str, name: str, arguments: Any) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def run_object(run: Run) -> dict:
    """An Assistants ``thread.run``. ``run.open_calls``: its open calls, prefetched (see ``_runs``)."""
    agent = _registered(run.agent_id)
    required_action = None
    if run.status == Run.Status.SUSPENDED:
        calls = [_function_call(c.tool_call_id, c.tool_name, c.args) for c in run.open_calls]
        required_action = {"type": "submit_tool_outputs", "submit_tool_outputs": {"tool_calls": calls}}
    return {
        "id": run.id,
        "object": "thread.run",
        "created_at": unix(run.created_at),
        "assistant_id": run.agent_id,
        "thread_id": run.thread_id,
        "status": RUN_STATUS.get(run.status, run.status),
        "required_action": required_action,
        "last_error": run.last_error,
        "started_at": unix(run.started_at),
        "expires_at": unix(run.expires_at),
        "cancelled_at": unix(run.cancelled_at),
        "failed_at": unix(run.failed_at),
        "completed_at": unix(run.completed_at),
        "incomplete_details": None,
        "model": model_name(agent),
        "instructions": agent.instructions if agent else "",
        "tools": [
            {
                "type": "function",
                "function": {"name": t.id, "description": t.description, "parameters": t.parameters_schema},
            }
            for t in (agent.tools.values() if agent else ())
        ],
        "metadata": run.metadata or {},
        "usage": _usage(run.usage),
        "temperature": None,
        "top_p": None,
        "max_prompt_tokens": None,
        "max_completion_tokens": None,
        "truncation_strategy": {"type": "auto", "last_messages": None},
        "tool_choice": "auto",
        "response_format": "auto",
        "parallel_tool_calls": True,
    }


def step_details(details: dict) -> dict:
    if details.get("type") == "tool_calls":
        return {
            "type": "tool_calls",
            "tool_calls": [
                {"id": c["id"], "type": "function", "function": c["function"]} for c in details["toolCalls"]
            ],
        }
    return {"type": "message_creation", "message_creation": {"message_id": details["messageCreation"]["messageId"]}}


def step_object(step: RunStep) -> dict:
    """An Assistants ``thread.run.step``: ``function {name, arguments, output}``, output null until known."""
    return {
        "id": step.id,
        "object": "thread.run.step",
        "created_at": unix(step.created_at),
        "assistant_id": step.agent_id,
        "thread_id": step.thread_id,
        "run_id": step.run_id,
        "type": step.type,
        "status": step.status,
        "step_details": step_details(step.step_details),
        "last_error": step.last_error,
        "expired_at": unix(step.expired_at),
        "cancelled_at": unix(step.cancelled_at),
        "failed_at": unix(step.failed_at),
        "completed_at": unix(step.completed_at),
        "metadata": step.metadata or {},
        "usage": None if step.status == RunStep.Status.IN_PROGRESS else _usage(step.usage),
    }


def message_object(message: Message) -> dict:
    return {
        "id": message.id,
        "object": "thread.message",
        "created_at": unix(message.created_at),
        "thread_id": message.thread_id,
        "status": "completed",
        "incomplete_details": None,
        "completed_at": unix(message.created_at),
        "incomplete_at": None,
        "role": message.role,
        "content": [{"type": "text", "text": {"value": message.content, "annotations": []}}],
        "assistant_id": message.run.agent_id if message.run_id and message.role == Message.Role.ASSISTANT else None,
        "run_id": message.run_id,
        "attachments": [],
        "metadata": {},
    }


def openai_page(queryset: QuerySet, params: Any, to_dict: Callable[[Any], dict]) -> dict:
    """The native cursor page (same parameters and rules) with the Assistants envelope's keys."""
    page = cursor_page(queryset, params, to_dict=to_dict)
    return {
        "object": "list",
        "data": page["data"],
        "first_id": page["firstId"],
        "last_id": page["lastId"],
        "has_more": page["hasMore"],
    }


# --- errors --------------------------------------------------------------------------------------
def _error_type(status: int) -> str:
    return {401: "authentication_error", 403: "permission_error"}.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )


def openai_exception_handler(exc: Exception, context: dict) -> Any:
    response = exception_handler(exc, context)
    if response is not None:
        response.data["error"] |= {"type": _error_type(response.status_code), "param": None}
    return response


def openai_not_found(request: Any, *args: Any, **kwargs: Any) -> JsonResponse:
    body = envelope("NOT_FOUND", f"No endpoint {request.method} {request.path}.")
    body["error"] |= {"type": "invalid_request_error", "param": None}
    return JsonResponse(body, status=404)


# --- reads ---------------------------------------------------------------------------------------
def _thread_or_404(thread_id: str, user: Any) -> Thread:
    """The thread, unless it does not exist or every run on it belongs to agents hidden from ``user``."""
    thread = Thread.objects.filter(pk=thread_id).first()
    if thread is not None and (hidden := access.hidden_agent_ids(user)):
        runs = Run.objects.filter(thread=thread)
        if runs.exists() and not runs.exclude(agent_id__in=hidden).exists():
            thread = None
    if thread is None:
        raise AgentRunError("NOT_FOUND", f"No thread {thread_id}.")
    return thread


def _runs(user: Any) -> QuerySet:
    """Runs this user may see, with their open calls (for ``required_action``) in one more query."""
    open_calls = SuspendedToolCall.objects.filter(status=SuspendedToolCall.Status.OPEN).order_by("position", "id")
    runs = Run.objects.prefetch_related(Prefetch("suspended_calls", queryset=open_calls, to_attr="open_calls"))
    return access.only_visible(runs, user)


def _run_or_404(thread_id: str, run_id: str, user: Any) -> Run:
    run = views.run_or_404(run_id, user)  # the native rule: hidden agents' runs do not exist
    if run.thread_id != thread_id:
        raise AgentRunError("RUN_NOT_FOUND", f"No run {run_id} on thread {thread_id}.")
    expire_run_if_due(run.id)  # a run past its time to live reads as expired, sweeper or not
    return _runs(user).get(pk=run.id)


class OpenAIView(ApiView):
    """The native API's view (auth, permissions, bounded JSON) with the Assistants error object."""

    schema = None  # documented by OpenAI / Azure; /api/schema/ describes the contract's routes

    def get_exception_handler(self) -> Callable:
        return openai_exception_handler


class ThreadView(OpenAIView):
    def get(self, request: Request, thread_id: str) -> Response:
        return Response(thread_object(_thread_or_404(thread_id, request.user)))


class ThreadRunListView(OpenAIView):
    def get(self, request: Request, thread_id: str) -> Response:
        thread = _thread_or_404(thread_id, request.user)
        return Response(openai_page(_runs(request.user).filter(thread=thread), request.query_params, run_object))


class RunView(OpenAIView):
    def get(self, request: Request, thread_id: str, run_id: str) -> Response:
        return Response(run_object(_run_or_404(thread_id, run_id, request.user)))


class RunStepListView(OpenAIView):
    def get(self, request: Request, thread_id: str, run_id: str) -> Response:
        run = _run_or_404(thread_id, run_id, request.user)
        return Response(openai_page(RunStep.objects.filter(run=run), request.query_params, step_object))


class RunStepView(OpenAIView):
    def get(self, request: Request, thread_id: str, run_id: str, step_id: str) -> Response:
        run = _run_or_404(thread_id, run_id, request.user)
        step = RunStep.objects.filter(run=run, pk=step_id).first()
        if step is None:
            raise AgentRunError("NOT_FOUND", f"Run {run.id} has no step {step_id}.")
        return Response(step_object(step))


class MessageListView(OpenAIView):
    """The thread's conversation as Assistants messages: what users and agents said (tool traffic is in
    the run steps, as in the Assistants API)."""

    def get(self, request: Request, thread_id: str) -> Response:
        thread = _thread_or_404(thread_id, request.user)
        said = Q(role=Message.Role.USER) | (Q(role=Message.Role.ASSISTANT) & ~Q(content=""))
        messages = Message.objects.filter(said, thread=thread).select_related("run")
        if hidden := access.hidden_agent_ids(request.user):
            messages = messages.exclude(run__agent_id__in=hidden)
        return Response(openai_page(messages, request.query_params, message_object))


# --- routes (``/api/openai/v1/`` + the Assistants paths) ------------------------------------------
# What may follow ``threads/<thread id>/``, the most specific first: literal segments, None for an id.
ROUTES: list[tuple[tuple[str | None, ...], Callable[..., HttpResponse], tuple[str, ...]]] = [
    (("runs", None, "steps", None), RunStepView.as_view(), ("run_id", "step_id")),
    (("runs", None, "steps"), RunStepListView.as_view(), ("run_id",)),
    (("runs", None), RunView.as_view(), ("run_id",)),
    (("runs",), ThreadRunListView.as_view(), ()),
    (("messages",), MessageListView.as_view(), ()),
    ((), ThreadView.as_view(), ()),
]


def path_segments(request: HttpRequest, rest: str) -> list[str]:
    """``rest``, the path after the prefix, as segments, each percent-decoded on its own.

    Django routes on the decoded path, where a thread id's encoded ``/`` (``a%2Fruns%2Fb``, as the
    openai and azure SDKs send path parameters) reads like a separator. An ASGI server hands over the
    path as sent too (``raw_path``): split before decoding, its segments are exact. Without it (WSGI)
    the decoded path's segments are the best there is.
    """
    raw = getattr(request, "scope", {}).get("raw_path")
    if raw:
        segments = [unquote_to_bytes(s).decode("utf-8", "replace") for s in raw.split(b"/")]
        # The tail Django routed as ``rest`` (the prefix, or a root path above it, is not ours to split).
        for count in range(1, len(segments) + 1):
            if "/".join(segments[-count:]) == rest:
                return segments[-count:]
    return rest.split("/")


def resolve_segments(segments: list[str]) -> tuple[Callable[..., HttpResponse], dict[str, str]] | None:
    """The view and its arguments for ``threads/<thread id>/...``. The thread id is every segment the
    route's fixed tail leaves: one when the client encoded it, several joined by ``/`` when it did not
    (the longest reading, as before). A trailing slash is the same route."""
    if len(segments) > 1 and segments[-1] == "":
        segments = segments[:-1]
    if len(segments) < 2 or segments[0] != "threads":
        return None
    after = segments[1:]
    for tail, view, names in ROUTES:
        split = len(after) - len(tail)
        thread, fixed = after[:split], after[split:]
        if split < 1 or not all(got if want is None else got == want for want, got in zip(tail, fixed, strict=True)):
            continue
        thread_id = "/".join(thread)
        if thread_id:
            ids = [got for want, got in zip(tail, fixed, strict=True) if want is None]
            return view, {"thread_id": thread_id, **dict(zip(names, ids, strict=True))}
    return None


@csrf_exempt  # the views are DRF's: they check CSRF for session users themselves
def assistants_route(request: HttpRequest, rest: str) -> HttpResponse:
    resolved = resolve_segments(path_segments(request, rest))
    if resolved is None:
        return openai_not_found(request)
    view, kwargs = resolved
    return view(request, **kwargs)


urlpatterns = [re_path(r"^(?P<rest>[\s\S]*)$", assistants_route)]  # any character, newlines too

"""Routes of docs/api.md#routes. Every path answers with and without its trailing slash; the schema shows
the contract's spelling only (``agentrun.api.schema.drop_slash_aliases``)."""

from __future__ import annotations

from typing import Any

from django.urls import path, re_path

import agentrun.core.converters  # noqa: F401 - registers <anyid:>
from agentrun.api import views
from agentrun.api.exceptions import api_not_found
from agentrun.api.schema import SchemaPageView, SchemaView

ALIAS_SUFFIX = "-alias"


def both(route: str, view: Any, name: str) -> list:
    """``route`` as the contract spells it, plus its twin with (or without) the trailing slash."""
    twin = route[:-1] if route.endswith("/") else f"{route}/"
    return [path(route, view, name=name), path(twin, view, name=f"{name}{ALIAS_SUFFIX}")]


app_name = "api"
urlpatterns = [
    *both("agents/", views.AgentListView.as_view(), "agents"),
    # An agent id may hold "/" (sent as %2F, decoded before routing): <anyid:> takes it whole; the run id
    # after it has none, so each route's fixed ending says where the agent id stops.
    *both("agents/<anyid:agentId>/stream", views.AgentStreamView.as_view(), "agent-stream"),
    *both("agents/<anyid:agentId>/generate", views.AgentGenerateView.as_view(), "agent-generate"),
    *both("agents/<anyid:agentId>/suspended-runs", views.SuspendedRunsView.as_view(), "suspended-runs"),
    *both("suspended-runs", views.AllSuspendedRunsView.as_view(), "all-suspended-runs"),
    *both("agents/<anyid:agentId>/runs/<str:runId>/approve", views.ApproveView.as_view(), "approve"),
    *both("agents/<anyid:agentId>/runs/<str:runId>/decline", views.DeclineView.as_view(), "decline"),
    *both("agents/<anyid:agentId>/runs/<str:runId>/resume", views.ResumeView.as_view(), "resume"),
    *both("agents/<anyid:agentId>/runs/<str:runId>/decisions", views.BatchDecisionView.as_view(), "decisions-batch"),
    *both("agents/<anyid:agentId>/runs/<str:runId>/claim", views.ClaimView.as_view(), "claim"),
    *both("runs/<str:runId>", views.RunDetailView.as_view(), "run"),
    *both("runs/<str:runId>/steps", views.RunStepListView.as_view(), "run-steps"),
    *both("runs/<str:runId>/steps/<str:stepId>", views.RunStepDetailView.as_view(), "run-step"),
    *both("runs/<str:runId>/stream", views.RunStreamView.as_view(), "run-stream"),
    *both("runs/<str:runId>/cancel", views.RunCancelView.as_view(), "run-cancel"),
    # A thread id may hold "/" or a line break (memory.thread is any text): <anyid:> takes it whole.
    *both("threads/<anyid:threadId>/messages", views.ThreadMessageListView.as_view(), "thread-messages"),
    *both("decisions", views.DecisionListView.as_view(), "decisions"),
    *both("background-tasks", views.BackgroundTaskListView.as_view(), "background-tasks"),
    *both("background-tasks/<str:taskId>/cancel", views.BackgroundTaskCancelView.as_view(), "background-task-cancel"),
    *both("schema/", SchemaView.as_view(), "schema"),
    *both("docs/", SchemaPageView.as_view(url_name="api:schema"), "docs"),
    re_path(r"^[\s\S]*$", api_not_found),  # any path, line breaks included: the JSON 404
]

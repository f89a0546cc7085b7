from __future__ import annotations

from django.urls import path

import agentrun.core.converters  # noqa: F401 - registers <anyid:> (an agent id may hold "/")
from agentrun.ws.consumers import AgentConsumer, RunStreamConsumer
from approvals.consumers import ApprovalsFeedConsumer

websocket_urlpatterns = [
    path("ws/runs/<str:run_id>/", RunStreamConsumer.as_asgi()),
    path("ws/agents/<anyid:agent_id>/", AgentConsumer.as_asgi()),
    path("ws/approvals/", ApprovalsFeedConsumer.as_asgi()),
]

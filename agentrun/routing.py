from __future__ import annotations

from django.urls import path

from agentrun.consumers import AgentConsumer, RunStreamConsumer

websocket_urlpatterns = [
    path("ws/runs/<str:run_id>/", RunStreamConsumer.as_asgi()),
    path("ws/agents/<str:agent_id>/", AgentConsumer.as_asgi()),
]

try:  # the reviewers' live feed lives with the dashboard
    from approvals.consumers import ApprovalsFeedConsumer

    websocket_urlpatterns.append(path("ws/approvals/", ApprovalsFeedConsumer.as_asgi()))
except ImportError:  # pragma: no cover - until the dashboard app provides it
    pass

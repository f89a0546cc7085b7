"""REST routes of the webhook endpoints (docs/notifications.md#25-rest) and Slack destinations (docs/api.md),
mounted under /api/ before the engine's API (whose last route answers any other /api/ path with 404)."""

from __future__ import annotations

from agentrun.api.urls import both
from notifications import api

app_name = "notifications-api"
urlpatterns = [
    *both("webhook-endpoints/", api.EndpointListView.as_view(), "webhook-endpoints"),
    *both("webhook-endpoints/<str:id>", api.EndpointDetailView.as_view(), "webhook-endpoint"),
    *both("webhook-endpoints/<str:id>/deliveries", api.DeliveryListView.as_view(), "webhook-endpoint-deliveries"),
    *both("slack-destinations/", api.SlackDestinationListView.as_view(), "slack-destinations"),
    *both("slack-destinations/<str:id>", api.SlackDestinationDetailView.as_view(), "slack-destination"),
    *both(
        "slack-destinations/<str:id>/deliveries", api.SlackDeliveryListView.as_view(), "slack-destination-deliveries"
    ),
]

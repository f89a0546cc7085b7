from __future__ import annotations

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from agentrun.api import audit

urlpatterns = [
    path("admin/", admin.site.urls),
    # The compatibility prefixes first: /api/ answers every other path under it (404 included).
    path("api/mastra/", include("agentrun.api.mastra")),
    path("api/openai/v1/", include("agentrun.api.openai_compat")),
    # The audit receipts' public keys (docs/security.md), before the API's catch-all; public.
    re_path(r"^api/audit/public-keys/?$", audit.public_keys, name="audit-public-keys"),
    path("api/", include("notifications.api_urls")),  # webhook endpoints: before the API's catch-all
    path("api/", include("agentrun.api.urls")),
    path("integrations/slack/", include("notifications.slack_urls")),  # Slack's signed requests (docs/slack.md)
    path("approvals/", include("notifications.urls")),  # decision links, email settings, grants
    path("approvals/", include("approvals.urls")),
    path("accounts/", include("approvals.accounts")),  # Django's sign-in views; throttled password reset
    path("", include("agentrun.server.health")),  # /healthz, /readyz (docs/operations.md "Health")
    path("", include("agentrun.server.metrics")),  # /metrics: off unless AGENTRUN_METRICS_TOKEN is set
    # Pages without our <link rel="icon"> (the admin, the API docs) make browsers ask for /favicon.ico.
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("", RedirectView.as_view(url="/approvals/", permanent=False)),
]

# An error no view handled: 503 while the database or Redis is away, JSON under /api/ (agentrun.server.unavailable).
handler500 = "agentrun.server.unavailable.server_error"

"""Pages under /approvals/ (mounted beside the dashboard's own): links, email settings, grants."""

from __future__ import annotations

from django.urls import path

from notifications import views

app_name = "notifications"

urlpatterns = [
    path("links/<str:token>/", views.decision_link, name="link"),
    path("settings/", views.notification_settings, name="settings"),
    path("grants/", views.grant_list, name="grants"),
    path("grants/new", views.grant_create, name="grant-create"),
    path("grants/<str:grant_id>/revoke", views.grant_revoke, name="grant-revoke"),
]

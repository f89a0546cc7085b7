"""Pages under /approvals/ (mounted beside the dashboard's own): decision links, email settings."""

from __future__ import annotations

from django.urls import path

from notifications import views

app_name = "notifications"

urlpatterns = [
    path("links/<str:token>/", views.decision_link, name="link"),
    path("settings/", views.notification_settings, name="settings"),
]

"""Slack's request URLs (docs/slack.md), mounted at /integrations/slack/: the interactivity URL and the
slash command's. Slack posts to exactly the URL configured in the app; both spellings are accepted."""

from __future__ import annotations

from django.urls import path

from notifications import slack_views

app_name = "slack"
urlpatterns = [
    path("actions", slack_views.actions, name="actions"),
    path("actions/", slack_views.actions),
    path("commands", slack_views.commands, name="commands"),
    path("commands/", slack_views.commands),
]

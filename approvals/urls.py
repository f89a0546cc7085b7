from __future__ import annotations

from django.urls import path

from approvals import views

app_name = "approvals"

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("threads/<path:thread_id>/", views.thread_detail, name="thread"),
    path("runs/<str:run_id>/", views.run_detail, name="run"),
    path("runs/<str:run_id>/calls/<path:tool_call_id>/decide", views.decide_call, name="decide"),
    path("decide-all", views.decide_all, name="decide-all"),
    path("history/", views.history, name="history"),
]

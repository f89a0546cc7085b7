from __future__ import annotations

from urllib.parse import quote, urlencode

from django.urls import path, reverse

import agentrun.core.converters  # noqa: F401 - registers <anyid:>
from approvals import metrics, views

app_name = "approvals"

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("threads/", views.thread_by_query, name="thread-by-query"),
    path("threads/<anyid:thread_id>/", views.thread_detail, name="thread"),
    path("runs/<str:run_id>/", views.run_detail, name="run"),
    path("runs/<str:run_id>/calls/<anyid:tool_call_id>/decide", views.decide_call, name="decide"),
    path("runs/<str:run_id>/calls/<anyid:tool_call_id>/claim", views.claim_call, name="claim"),
    path("decide-all", views.decide_all, name="decide-all"),
    path("history/", views.history, name="history"),
    path("history/export.<str:fmt>", views.history_export, name="history-export"),
    path("grants/", views.grant_list, name="grants"),
    path("grants/new", views.grant_create, name="grant-create"),
    path("grants/<str:grant_id>/revoke", views.grant_revoke, name="grant-revoke"),
    path("metrics/", metrics.metrics_page, name="metrics"),
    path("metrics.csv", metrics.metrics_csv, name="metrics-csv"),
]

# Path segments a browser folds away ("a/./b" is "a/b"), "%2e" spellings included: such ids go in the query.
DOT_SEGMENTS = frozenset({".", ".."})


def thread_path(thread_id: str) -> str:
    """The thread page of any thread id, for every link to it (pages, emails, webhooks).

    The id is one path segment with every reserved character quoted, "/" included: ``reverse`` would
    leave "/" bare and a browser would resolve "a/../b" to thread "b"."""
    if thread_id in DOT_SEGMENTS:
        return f"{reverse('approvals:thread-by-query')}?{urlencode({'id': thread_id})}"
    return f"{reverse('approvals:thread-by-query')}{quote(thread_id, safe='')}/"

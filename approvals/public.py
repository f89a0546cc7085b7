"""What the notifications app may use of the dashboard: the card's view of an open call (emails and
decision-link pages show a call as its card does) and the thread page's URL. ``lint-imports`` keeps
notifications to this module.
"""

from __future__ import annotations

from approvals.selectors import OpenCallView, open_call_views
from approvals.urls import thread_path

__all__ = ["OpenCallView", "open_call_views", "thread_path"]

"""Fault points: places where a test may make this process die, to prove nothing is lost when it does.

A process started with ``AGENTRUN_FAULT=<name>`` SIGKILLs itself the first time it passes the point of
that name (no cleanup, no log line: what a crash or an OOM kill leaves). Unset — always, outside
tests — a point costs one dictionary lookup. Points:

- ``tool-result-committed``: right after a tool call's result (and the chunks announcing it) committed,
  before anything else — the worker's next write, its publish — happens (tests/system/test_outages.py).
"""

from __future__ import annotations

import os
import signal


def point(name: str) -> None:
    if os.environ.get("AGENTRUN_FAULT") == name:
        os.kill(os.getpid(), signal.SIGKILL)

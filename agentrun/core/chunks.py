"""The chunk: the wire shape of everything a run streams (docs/api.md#chunks), as a type.

Chunks stay plain dicts at run time (they are JSON on every transport, and the Python API hands them
out as dicts); this names their keys and types for the modules that make, log and relay them.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

ChunkType = Literal[
    "start",
    "step-start",
    "text-start",
    "text-delta",
    "text-end",
    "tool-call",
    "tool-call-approval",
    "tool-call-suspended",
    "tool-result",
    "tool-error",
    "tool-output-denied",
    "step-finish",
    "finish",
    "error",
    "abort",
    "background-task-started",
    "background-task-running",
    "background-task-progress",
    "background-task-completed",
    "background-task-failed",
    "background-task-cancelled",
]

# "from" is a Python keyword: the functional form.
Chunk = TypedDict(
    "Chunk", {"type": ChunkType, "runId": str, "from": Literal["AGENT"], "seq": int, "payload": dict[str, Any]}
)

# What the reviewers' feed (ws/approvals) is told: a call opened, was decided (or one person approved a
# call that needs several), or left with its run; or who is on it changed (docs/dashboard.md#shared-work).
FeedEvent = Literal["suspended", "decided", "approval", "removed", "claimed"]

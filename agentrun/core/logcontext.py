"""What a log line is about: the run, tool call, agent and request a process is working on, kept in
context variables (so each request, task and coroutine has its own, and ``sync_to_async`` threads
inherit them) and added to every record by ``ContextFilter``; ``JsonFormatter`` writes one JSON object
per line (``AGENTRUN_LOG_FORMAT=json``; docs/operations.md "Logs").
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime

FIELDS = ("request_id", "agent_id", "run_id", "tool_call_id")

_fields: ContextVar[dict[str, str]] = ContextVar("agentrun_log_fields", default={})  # noqa: B039 - never mutated


@contextlib.contextmanager
def bound(**fields: str | None) -> Iterator[None]:
    """Log lines written inside the block carry these fields (``None`` ones are left out)."""
    token = _fields.set({**_fields.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _fields.reset(token)


def current() -> dict[str, str]:
    return _fields.get()


class ContextFilter(logging.Filter):
    """Adds the bound fields to every record (as attributes, ``None`` when unbound)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _fields.get()
        for name in FIELDS:
            setattr(record, name, fields.get(name))
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the bound fields that are set, and the
    exception's traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line |= {name: value for name in FIELDS if (value := getattr(record, name, None)) is not None}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)

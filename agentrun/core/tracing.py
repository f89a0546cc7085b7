"""Optional OpenTelemetry tracing (docs/operations.md "Traces"): a request, the decision it records, the
continuation that carries the decision out (in whichever worker) and the tool calls it makes.

Off unless the OpenTelemetry SDK is installed and ``OTEL_TRACES_EXPORTER`` names an exporter (the SDK's
standard variables configure the rest: ``OTEL_SERVICE_NAME``, ``OTEL_EXPORTER_OTLP_ENDPOINT``, …; a
process started under ``opentelemetry-instrument`` keeps the provider that set up). When off, ``span``
is a shared no-op context manager and nothing is imported: no cost beyond one check.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger("agentrun.tracing")

_tracer: Any = None
_configured = False


def _exporters() -> list[str]:
    names = os.environ.get("OTEL_TRACES_EXPORTER", "")
    return [n.strip() for n in names.split(",") if n.strip() and n.strip() != "none"]


def tracer() -> Any:
    """The tracer, or None when tracing is off (decided once per process)."""
    global _tracer, _configured
    if _configured:
        return _tracer
    _configured = True
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or not (names := _exporters()):
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.util._importlib_metadata import entry_points
    except ImportError:
        logger.warning("OTEL_TRACES_EXPORTER is set but the OpenTelemetry SDK is not installed: no traces")
        return None
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # nobody set one up (opentelemetry-instrument would have)
        provider = TracerProvider(resource=Resource.create())
        for name in names:
            # The exporters register under this entry point group (the SDK's "console", OTLP's "otlp", …).
            found = entry_points(group="opentelemetry_traces_exporter", name=name)
            if not found:
                logger.warning("no OpenTelemetry span exporter named %r is installed", name)
                continue
            provider.add_span_processor(BatchSpanProcessor(next(iter(found)).load()()))
        trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("agentrun")
    return _tracer


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield None


@contextlib.contextmanager
def span(name: str, context: dict | None = None, **attributes: Any) -> Iterator[Any]:
    """A span around the block (a child of the current one, or of ``context``: a carrier from
    ``carrier()`` in another process); nothing when tracing is off."""
    t = tracer()
    if t is None:
        with _nothing():
            yield None
        return
    parent = None
    if context:
        from opentelemetry.propagate import extract

        parent = extract(context)
    attrs = {f"agentrun.{k}": v for k, v in attributes.items() if v is not None}
    with t.start_as_current_span(name, context=parent, attributes=attrs) as current:
        yield current


def event(name: str, **attributes: Any) -> None:
    """An event on the current span (a decision recorded in a request), if tracing is on."""
    if tracer() is None:
        return
    from opentelemetry import trace

    trace.get_current_span().add_event(name, {f"agentrun.{k}": v for k, v in attributes.items() if v is not None})


def carrier() -> dict | None:
    """The current span's context as a W3C ``traceparent`` carrier, to continue the trace in a task
    another process runs; None when tracing is off."""
    if tracer() is None:
        return None
    from opentelemetry.propagate import inject

    found: dict = {}
    inject(found)
    return found or None

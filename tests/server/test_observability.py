"""What operators scrape and read (docs/operations.md): ``/metrics`` behind its token, and JSON log lines
that stay one well-formed object a line whatever the message holds."""

from __future__ import annotations

import json
import logging

import pytest
from asgiref.sync import async_to_sync
from prometheus_client.parser import text_string_to_metric_families

from agentrun import get_agent
from agentrun.core.logcontext import ContextFilter, JsonFormatter, bound
from tests.helpers.runs import suspended_email_run


@pytest.mark.django_db
def test_metrics_are_off_without_a_token(client, settings):
    settings.AGENTRUN_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 404
    assert client.get("/metrics", headers={"Authorization": "Bearer anything"}).status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic c2VjcmV0", "Bearer "])
def test_metrics_need_the_bearer_token(client, settings, header):
    settings.AGENTRUN_METRICS_TOKEN = "s3cret-token"
    response = client.get("/metrics", headers={"Authorization": header} if header else {})
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"agentrun_" not in response.content


@pytest.mark.django_db(transaction=True)
def test_metrics_count_the_calls_waiting_now_by_agent_and_risk(client, settings):
    settings.AGENTRUN_METRICS_TOKEN = "s3cret-token"
    risk = get_agent("support-agent").tools["send-email"].risk
    before = _waiting(client, "support-agent", risk)
    async_to_sync(suspended_email_run)(thread="metrics thread/1 %#")
    async_to_sync(suspended_email_run)(thread="metrics thread/ü")

    assert _waiting(client, "support-agent", risk) == before + 2


def _waiting(client, agent: str, risk: str) -> float:
    response = client.get("/metrics", headers={"Authorization": "Bearer s3cret-token"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    for name in ("agentrun_waiting_calls", "agentrun_decisions", "agentrun_time_to_decision_seconds"):
        assert name in families, f"{name} missing from /metrics"
    samples = families["agentrun_waiting_calls"].samples
    return sum(s.value for s in samples if s.labels == {"agent": agent, "risk": risk})


def _line(message: str, *, exc: BaseException | None = None, **fields: str) -> dict:
    record = logging.LogRecord("agentrun.engine", logging.ERROR, __file__, 1, message, (), None)
    if exc is not None:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    with bound(**fields):
        ContextFilter().filter(record)
    text = JsonFormatter().format(record)
    assert "\n" not in text, "a log line must stay one line"
    return json.loads(text)


def test_a_json_log_line_carries_what_it_is_about():
    line = _line("tool failed", run_id="run/1 %#", tool_call_id="call-ü", agent_id="a")
    assert line["level"] == "ERROR" and line["logger"] == "agentrun.engine"
    assert line["message"] == "tool failed"
    assert (line["run_id"], line["tool_call_id"], line["agent_id"]) == ("run/1 %#", "call-ü", "a")
    assert "request_id" not in line  # unbound fields are left out, not null
    assert line["time"].endswith("+00:00")


def test_a_json_log_line_stays_one_object_whatever_an_llm_wrote():
    try:
        raise ValueError('multi\nline "quoted" \x00 message')
    except ValueError as exc:
        line = _line('the model said:\n{"not": json}\r\n\u2028', exc=exc)
    assert line["message"] == 'the model said:\n{"not": json}\r\n\u2028'
    assert "ValueError" in line["exception"] and "Traceback" in line["exception"]

"""``/approvals/metrics/`` (docs/operations.md "The metrics page"): its numbers are the decisions table's,
read from the rollup the database keeps; a reviewer sees their agents only."""

from __future__ import annotations

import bisect
import csv
import io
import math
from datetime import timedelta

import pytest
from django.db.models import Count
from django.utils import timezone
from django.utils.html import escape

from agentrun.core.metrics import WAIT_BUCKETS
from agentrun.core.models import Decision, Run, Thread, WaitingCallCount
from approvals.metrics import wait_label
from tests.helpers.runs import suspend

pytestmark = pytest.mark.django_db


def _decide(run: Run, n: int, *, tool: str, kind: str, via: str, waits: list[float] | None = None, **fields) -> None:
    """``n`` decisions on ``run`` decided at ``decided_at`` (default now), each after its wait in seconds."""
    decided_at = fields.pop("decided_at", timezone.now())
    start = Decision.objects.filter(run=run).count()
    Decision.objects.bulk_create(
        Decision(
            run=run,
            agent_id=run.agent_id,
            thread_id=run.thread_id,
            tool_call_id=f"call-{start + i}",
            tool_name=tool,
            kind=kind,
            via=via,
            decided_at=decided_at,
            waiting_since=decided_at - timedelta(seconds=waits[i]) if waits else None,
            **fields,
        )
        for i in range(n)
    )


def _run(agent_id: str) -> Run:
    thread, _ = Thread.objects.get_or_create(id="metrics-thread")
    return Run.objects.create(agent_id=agent_id, thread=thread, status=Run.Status.COMPLETED)


def _exact_bucket(waits: list[float], p: float) -> int:
    """The wait bucket of the nearest-rank percentile, computed from the raw waits."""
    ordered = sorted(waits)
    return bisect.bisect_left(WAIT_BUCKETS, ordered[math.ceil(p * len(ordered)) - 1])


@pytest.fixture
def history(settings):
    settings.AGENTRUN_AGENT_REVIEWERS = {"secret-agent": ["Auditors"]}
    support, secret = _run("support-agent"), _run("secret-agent")
    refund_waits = [3 + i * 97 for i in range(40)]  # 3 s … ~63 min
    _decide(support, 40, tool="refund", kind="approve", via="dashboard", waits=refund_waits)
    _decide(support, 1, tool="refund", kind="approve", via="api", waits=[7200], edited_args={"amount": 1})
    _decide(support, 1, tool="refund", kind="decline", via="api", waits=[40])
    email_waits = [15, 25, 35, 45, 55, 65, 600, 1200, 86400 * 3, 86400 * 9]
    _decide(support, 10, tool="send-email", kind="approve", via="link", waits=email_waits)
    _decide(support, 10, tool="send-email", kind="decline", via="dashboard", waits=email_waits)
    _decide(support, 3, tool="send-email", kind="decline", via="policy", waits=[300] * 3, details={"policy": "timeout"})
    _decide(support, 4, tool="send-email", kind="approve", via="policy", details={"policy": "grant"})
    _decide(support, 2, tool="send-email", kind="expire", via="system", waits=[900, 901])
    _decide(
        support,
        5,
        tool="refund",
        kind="approve",
        via="api",
        waits=[60] * 5,
        decided_at=timezone.now() - timedelta(days=1),
    )
    _decide(secret, 7, tool="refund", kind="decline", via="api", waits=[1] * 7)  # hidden from rita
    return {"refund": refund_waits + [7200, 40] + [60] * 5, "send-email": email_waits * 2}


def _table(html: str, table_id: str) -> str:
    start = html.index(f'id="{table_id}"')
    return html[start : html.index("</table>", start)]


def test_the_page_shows_the_decisions_table_of_the_reviewers_agents(reviewer, history):
    client, _ = reviewer
    response = client.get("/approvals/metrics/")
    assert response.status_code == 200
    html = response.content.decode()
    visible = Decision.objects.exclude(agent_id="secret-agent")
    assert f'<strong id="total-decisions">{visible.count()}</strong>' in html
    by_kind = _table(html, "by-kind")
    for row in visible.values("kind").annotate(n=Count("*")):
        assert f'<td>{row["kind"]}</td><td class="num">{row["n"]}</td>' in by_kind
    by_via = _table(html, "by-via")
    assert '<td>policy (timeout)</td><td class="num">3</td>' in by_via
    assert '<td>policy (grant)</td><td class="num">4</td>' in by_via

    per_tool = _table(html, "per-tool")
    refund = per_tool[per_tool.index('data-tool="refund"') :].split("</tr>")[0]
    email = per_tool[per_tool.index('data-tool="send-email"') :].split("</tr>")[0]
    assert '<td class="num">47</td>' in refund  # 40 + 1 + 1 today, 5 yesterday; the secret agent's 7 not
    # p50 / p95 of people's decisions: the bucket of the exact nearest-rank percentile.
    for tool, cells in (("refund", refund), ("send-email", email)):
        assert escape(wait_label(_exact_bucket(history[tool], 0.5))) in cells
        assert escape(wait_label(_exact_bucket(history[tool], 0.95))) in cells
    # refund: 45 of 47 decisions by people approved unedited (≥ 95 %): a candidate; send-email is not.
    assert "Candidate" in refund and "Candidate" not in email
    assert '<td class="num">3</td><td class="num">0</td>' in email  # timeouts, escalations


def test_the_csv_has_the_same_numbers_per_tool_per_day(reviewer, history):
    client, _ = reviewer
    response = client.get("/approvals/metrics.csv?days=7")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    visible = Decision.objects.exclude(agent_id="secret-agent")
    expected = {
        (r["decided_at__date"].isoformat(), r["tool_name"]): r["n"]
        for r in visible.values("decided_at__date", "tool_name").annotate(n=Count("*"))
    }
    assert {(r["day"], r["tool"]): int(r["decisions"]) for r in rows} == expected
    today = timezone.now().date().isoformat()
    email = next(r for r in rows if (r["day"], r["tool"]) == (today, "send-email"))
    assert (email["timeouts"], email["expiries"], email["approve"], email["decline"]) == ("3", "2", "14", "13")


def test_a_tool_name_that_reads_as_a_formula_is_text_in_the_csv(reviewer):
    _decide(_run("support-agent"), 2, tool="=HYPERLINK(A1)", kind="approve", via="api")
    client, _ = reviewer
    rows = list(csv.DictReader(io.StringIO(client.get("/approvals/metrics.csv?days=7").content.decode())))
    assert [(r["tool"], r["decisions"]) for r in rows] == [("'=HYPERLINK(A1)", "2")]


def test_waiting_now_and_the_slowest_waits_come_from_the_calls_that_wait(reviewer, settings):
    settings.AGENTRUN_AGENT_REVIEWERS = {"secret-agent": ["Auditors"]}
    run_id = suspend("send-email", {"to": "a@example.com", "subject": "s", "body": "b"}, thread="metrics-wait")
    WaitingCallCount.objects.create(agent_id="secret-agent", risk="high", slot=0, calls=3)  # hidden from rita
    client, _ = reviewer
    html = client.get("/approvals/metrics/").content.decode()
    waiting = _table(html, "waiting-now")
    assert "support-agent" in waiting and "secret-agent" not in waiting
    assert f"/approvals/runs/{run_id}/" in _table(html, "slowest")


def test_only_people_who_may_read_the_dashboard(client, groups):
    assert client.get("/approvals/metrics/").status_code == 302  # to the login page

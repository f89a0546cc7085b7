"""The audit that answers in seconds (docs/dashboard.md#history, #the-admin): the history page's filters
(agent, tool, via, person, dates), arguments on every row, its CSV and JSON exports (streamed, filtered,
scoped), and the admin's decision list (columns, times to the second, search over arguments and reasons)."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime

import pytest
from django.contrib.admin.utils import unquote
from django.contrib.auth.models import Group
from django.urls import reverse

from agentrun.core import exports
from agentrun.core.models import Decision, Run
from tests.approvals.conftest import suspend
from tests.factories import EMAIL

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # The test client reads a streamed export in a loop of its own (a server streams it as it goes).
    pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators"),
]

HISTORY = "/approvals/history/"


def decided(tool: str, args: dict, kind: str, *, at: datetime, who: str = "rita", via: str = "dashboard", **fields):
    """A decision on a waiting run, recorded at ``at`` (decisions are append-only: made in the past, not
    moved there)."""
    agent = "billing-agent" if tool == "refund" else "support-agent"
    run = Run.objects.get(pk=suspend(tool, args, thread=f"t {tool} {at:%d%H} /#%", agent_id=agent))
    call = run.suspended_calls.get()
    return Decision.objects.create(
        run=run,
        agent_id=agent,
        thread_id=run.thread_id,
        tool_call_id=call.tool_call_id,
        tool_name=tool,
        kind=kind,
        args=args,
        decided_by_username=who,
        via=via,
        decided_at=at,
        risk=call.risk,
        **fields,
    )


@pytest.fixture
def trail(db) -> dict[str, Decision]:
    return {
        "plain": decided("send-email", EMAIL, "approve", at=datetime(2026, 1, 10, 9, 0, 5, tzinfo=UTC)),
        "edited": decided(
            "send-email",
            EMAIL,
            "approve",
            at=datetime(2026, 1, 11, 23, 59, 59, tzinfo=UTC),
            who="olga",
            via="api",
            edited_args=dict(EMAIL, subject="Zoë's refund"),
        ),
        "declined": decided(
            "delete-record",
            {"table": "users", "id": 9},
            "decline",
            at=datetime(2026, 1, 12, 0, 0, 0, tzinfo=UTC),
            via="link",
            reason='=HYPERLINK("http://evil") keep the customer',
        ),
        "refund": decided(
            "refund",
            {"orderId": "o-77", "amount": 99.5},
            "approve",
            at=datetime(2026, 1, 13, 8, 0, 0, tzinfo=UTC),
            via="policy",
        ),
    }


def shown(response) -> list[str]:
    return re.findall(r'data-decision-id="([^"]+)"', response.content.decode())


def test_every_decision_shows_its_arguments(reviewer, trail):
    client, _ = reviewer
    page = client.get(HISTORY).content.decode()
    for d in trail.values():
        row = page[page.index(f'data-decision-id="{d.id}"') :]
        cell = row[row.index('data-label="Arguments"') : row.index('data-label="Reason"')]
        assert "args-diff" in cell and "—" not in cell, d.kind
    plain = page[page.index(f'data-decision-id="{trail["plain"].id}"') :]
    assert '<span class="arg-key">to</span> <span class="arg-same">ann@example.com</span>' in plain
    refund = page[page.index(f'data-decision-id="{trail["refund"].id}"') :]
    assert '<span class="arg-same">99.5</span>' in refund


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({}, ["refund", "declined", "edited", "plain"]),
        ({"agent": "billing-agent"}, ["refund"]),
        ({"tool": "send-email"}, ["edited", "plain"]),
        ({"via": "link"}, ["declined"]),
        ({"via": "policy"}, ["refund"]),
        ({"via": "api"}, ["edited"]),
        ({"decided_by": "olga"}, ["edited"]),
        ({"from": "2026-01-11", "to": "2026-01-11"}, ["edited"]),  # a day, to its last second
        ({"from": "2026-01-12"}, ["refund", "declined"]),
        ({"to": "2026-01-10"}, ["plain"]),
        ({"from": "2026-01-11T23:59:59Z", "to": "2026-01-12T00:00:00Z"}, ["declined", "edited"]),
        ({"tool": "send-email", "via": "dashboard", "decided_by": "rita"}, ["plain"]),
        ({"kind": "decline"}, ["declined"]),
    ],
)
def test_history_filters(reviewer, trail, query, expected):
    client, _ = reviewer
    response = client.get(HISTORY, query)
    assert response.status_code == 200
    assert shown(response) == [trail[k].id for k in expected]
    assert f"{len(expected)} decision" in response.content.decode()
    # The exports hold exactly what the page selects, in its order.
    as_json = json.loads(b"".join(client.get(reverse("approvals:history-export", args=["json"]), query)))
    assert [d["id"] for d in as_json] == [trail[k].id for k in expected]
    as_csv = list(csv.DictReader(io.StringIO(b"".join(client.get(f"{HISTORY}export.csv", query)).decode())))
    assert [r["id"] for r in as_csv] == [trail[k].id for k in expected]


def test_the_filter_menus_offer_tools_and_ways_and_keep_the_choice(reviewer, trail):
    client, _ = reviewer
    page = client.get(HISTORY, {"tool": "refund", "via": "policy", "from": "2026-01-02"}).content.decode()
    assert '<option value="refund" selected>refund</option>' in page
    assert '<option value="delete-record">delete-record</option>' in page
    assert '<option value="policy" selected>policy</option>' in page and '<option value="link">' in page
    assert 'name="from" value="2026-01-02"' in page
    assert 'href="/approvals/history/export.csv?tool=refund&amp;via=policy&amp;from=2026-01-02"' in page


@pytest.mark.parametrize("bad", ["soon", "2026-02-31", "2026-13-01T00:00:00Z"])
def test_a_bad_date_is_a_clear_400_that_lists_nothing(reviewer, trail, bad):
    client, _ = reviewer
    response = client.get(HISTORY, {"from": bad})
    assert response.status_code == 400 and shown(response) == []
    assert 'role="alert"' in response.content.decode()
    export = client.get(f"{HISTORY}export.json", {"to": bad})
    assert export.status_code == 400 and bad in export.content.decode()


def test_exports_are_the_rest_shape_and_spreadsheet_safe(reviewer, trail):
    client, _ = reviewer
    response = client.get(f"{HISTORY}export.json")
    assert response.streaming and response["Content-Type"] == "application/json"
    assert response["Content-Disposition"].startswith('attachment; filename="decisions-')
    exported = json.loads(b"".join(response))
    assert exported == client.get("/api/decisions", {"limit": 100}).json()["data"]
    edited = next(d for d in exported if d["id"] == trail["edited"].id)
    assert edited["args"] == EMAIL and edited["editedArgs"]["subject"] == "Zoë's refund"

    response = client.get(f"{HISTORY}export.csv")
    assert response.streaming and response["Content-Type"] == "text/csv; charset=utf-8"
    rows = {r["id"]: r for r in csv.DictReader(io.StringIO(b"".join(response).decode()))}
    assert rows[trail["declined"].id]["reason"].startswith("'=HYPERLINK(")  # a formula, neutralised
    assert json.loads(rows[trail["edited"].id]["edited_args"])["subject"] == "Zoë's refund"
    assert rows[trail["plain"].id]["decided_at"] == "2026-01-10T09:00:05+00:00"
    assert client.get(f"{HISTORY}export.xlsx").status_code == 404


def test_exports_stream_any_number_batch_by_batch(reviewer, trail, monkeypatch):
    monkeypatch.setattr(exports, "EXPORT_BATCH", 2)
    # Decisions at the same instant: the keyset (decided_at, id) neither skips nor repeats one.
    same = datetime(2026, 1, 10, tzinfo=UTC)
    for i in range(3):
        decided("send-email", dict(EMAIL, to=f"u{i}@example.com"), "approve", at=same)
    client, _ = reviewer
    chunks = list(client.get(f"{HISTORY}export.json"))
    assert len(chunks) >= 5  # "[", four batches of at most two, "]"
    ids = [d["id"] for d in json.loads(b"".join(chunks))]
    assert ids == [d.id for d in Decision.objects.order_by("-decided_at", "-id")] and len(set(ids)) == 7
    lines = b"".join(client.get(f"{HISTORY}export.csv")).decode().splitlines()
    assert len(lines) == 8


def test_exports_are_scoped_and_need_a_reader(settings, reviewer, viewer, trail, client):
    settings.AGENTRUN_AGENT_REVIEWERS = {"billing-agent": ["Billing reviewers"]}
    rita, _ = reviewer
    ids = [d["id"] for d in json.loads(b"".join(rita.get(f"{HISTORY}export.json")))]
    assert trail["refund"].id not in ids and len(ids) == 3
    assert trail["refund"].id not in shown(rita.get(HISTORY))
    assert rita.get(HISTORY, {"agent": "billing-agent"}).status_code == 200
    assert json.loads(b"".join(rita.get(f"{HISTORY}export.json", {"agent": "billing-agent"}))) == []
    vic, _ = viewer
    assert len(json.loads(b"".join(vic.get(f"{HISTORY}export.json")))) == 3  # viewers may read the trail
    anonymous = client.get(f"{HISTORY}export.csv")
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]


# --- the admin's decision list -------------------------------------------------------------------
ADMIN = "/admin/agentrun/decision/"


def test_the_admin_list_has_thread_tool_edited_reason_and_via_and_times_to_the_second(admin_client_, trail):
    client, _ = admin_client_
    page = client.get(ADMIN).content.decode()
    for column in (
        "decided",
        "agent",
        "thread_link",
        "seen_tool",
        "edited",
        "reason_text",
        "by",
        "via",
        "run_link",
        "receipt",
    ):
        assert f'class="sortable column-{column}' in page or f'class="column-{column}' in page, column
    assert "2026-01-10 09:00:05 UTC" in page and "2026-01-11 23:59:59 UTC" in page
    assert 'class="field-edited"><img src="/static/admin/img/icon-yes.svg" alt="True">' in page
    assert "=HYPERLINK(&quot;http://evil&quot;) keep the customer" in page  # escaped
    assert ">t send-email 1009 /#%</a>" in page
    assert "admin-decisions.css" in page


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("o-77", ["refund"]),  # an argument
        ("99.5", ["refund"]),
        ("Zoë", ["edited"]),  # an edited argument, not ASCII
        ("keep the customer", ["declined"]),  # a reason
        ("ann@example.com", ["edited", "plain"]),
        ("users", ["declined"]),
    ],
)
def test_admin_search_covers_arguments_and_reasons(admin_client_, trail, term, expected):
    client, _ = admin_client_
    page = client.get(ADMIN, {"q": term}).content.decode()
    found = [unquote(pk) for pk in re.findall(r'href="/admin/agentrun/decision/([^/]+)/change/', page)]
    assert sorted(set(found)) == sorted(trail[k].id for k in expected), term


def test_admin_search_stays_in_the_staff_members_scope(settings, groups, trail):
    from tests.approvals.conftest import _client_for

    settings.AGENTRUN_AGENT_REVIEWERS = {"billing-agent": ["Billing reviewers"]}
    client, user = _client_for("stella", None, is_staff=True)
    user.groups.add(Group.objects.get(name="Viewers"))
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="view_decision"))
    assert client.get(ADMIN, {"q": "o-77"}).content.decode().count("/change/") == 0
    assert trail["plain"].id in client.get(ADMIN, {"q": "ann@example.com"}).content.decode()

"""Inbox, run page and history through Django's test client: any id works, rows say what waits."""

from __future__ import annotations

import html as htmllib
import re
from urllib.parse import quote

import pytest
from django.urls import reverse

from agentrun.core.models import SuspendedToolCall
from agentrun.engine.types import Decider
from tests.helpers.decisions import record_decision
from tests.helpers.runs import EMAIL, suspend

# Each test runs in a transaction rolled back at its end: nothing here needs a real commit.
pytestmark = pytest.mark.django_db

# Ids the REST API accepts (memory.thread / memory.resource: any non-empty text of at most 255 characters).
LONG_ID = ("lg/%?# ü-" * 40)[:255]
ODD_IDS = [
    "a/b",
    "a/../b",
    "/lead/trail/",
    "sp ace",
    "50%",
    "what?x=1&y=2",
    "h#frag",
    "ünï/çødé 🧵",
    'quote"and<angle>',  # (control characters are refused in ids: tests/security/test_inputs.py)
    "u_2Fx",  # the admin's own escape sequence, as data
    ".",
    "..",
    LONG_ID,
]


def hrefs(page: str, pattern: str) -> list[str]:
    """The (unescaped) hrefs of the links whose href matches ``pattern``."""
    return [htmllib.unescape(h) for h in re.findall(r'href="([^"]*)"', page) if re.search(pattern, htmllib.unescape(h))]


def thread_link_of(page: str, thread_id: str) -> str:
    """The href of the link whose text is ``thread_id`` (as the page prints it)."""
    for href, text in re.findall(r'<a [^>]*href="([^"]*)"[^>]*>([^<]*)</a>', page):
        if htmllib.unescape(text) == thread_id:
            return htmllib.unescape(href)
    raise AssertionError(f"no link named {thread_id!r}")


@pytest.mark.parametrize("odd_id", ODD_IDS, ids=repr)
def test_any_thread_id_works_on_every_page_and_link(reviewer, odd_id):
    client, _ = reviewer
    run_id = suspend("send-email", EMAIL, thread=odd_id, resource=odd_id)
    call = SuspendedToolCall.objects.get(run_id=run_id)

    inbox = client.get(reverse("approvals:inbox"))
    assert inbox.status_code == 200
    page = inbox.content.decode()
    link = thread_link_of(page, odd_id)
    filtered = client.get(reverse("approvals:inbox"), {"resource": odd_id}).content.decode()
    assert thread_link_of(filtered, odd_id) == link

    # The inbox's link, the run page's links and the path a message would build all open this thread.
    thread = client.get(link)
    assert thread.status_code == 200, link
    assert f'data-tool-call-id="{call.tool_call_id}"' in thread.content.decode()
    if odd_id not in (".", ".."):  # those two are path segments browsers fold away
        assert client.get(f"/approvals/threads/{quote(odd_id, safe='')}/").status_code == 200

    run_page = client.get(reverse("approvals:run", args=[run_id]))
    assert run_page.status_code == 200
    assert thread_link_of(run_page.content.decode(), odd_id) == link

    record_decision(agent_id="support-agent", run_id=run_id, kind="decline", reason="no")
    history = client.get(reverse("approvals:history"))
    assert history.status_code == 200
    assert thread_link_of(history.content.decode(), odd_id) == link
    assert client.get(link).status_code == 200  # nothing waits any more: still a page


@pytest.mark.parametrize("odd_id", ["a/b", "a&b=c#d ü%", "u_2Fx", LONG_ID], ids=repr)
def test_admin_filters_and_links_follow_any_id(admin_client_, odd_id):
    client, _ = admin_client_
    run_id = suspend("send-email", EMAIL, thread=odd_id, resource=odd_id)
    suspend("send-email", EMAIL, thread="other-thread", resource="other")

    threads = client.get(reverse("admin:agentrun_thread_changelist")).content.decode()
    [runs_link] = [h for h in hrefs(threads, r"/admin/agentrun/run/\?") if "other-thread" not in h]
    runs = client.get(runs_link)
    assert runs.status_code == 200
    assert run_id in runs.content.decode() and "1 run" in runs.content.decode()

    # The run changelist's thread link opens that thread's change page.
    run_list = client.get(reverse("admin:agentrun_run_changelist"), {"q": run_id}).content.decode()
    [thread_change] = hrefs(run_list, r"/admin/agentrun/thread/.+/change/")
    page = client.get(thread_change)
    assert page.status_code == 200 and htmllib.escape(odd_id) in page.content.decode()

    # The suspended call's run link opens the run.
    calls = client.get(reverse("admin:agentrun_suspendedtoolcall_changelist")).content.decode()
    opened = [client.get(h) for h in hrefs(calls, r"/admin/agentrun/run/.+/change/")]
    assert opened and all(p.status_code == 200 for p in opened)
    assert any(run_id in p.content.decode() for p in opened)


# --- inbox: what waits ----------------------------------------------------------------------------
def inbox_queries(client, django_assert_max_num_queries, **params) -> tuple[str, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(reverse("approvals:inbox"), params)  # a person's permissions are read once, then kept (docs/security.md)
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(reverse("approvals:inbox"), params)
    assert response.status_code == 200
    return response.content.decode(), len(ctx.captured_queries)


def test_inbox_rows_say_what_waits_in_a_fixed_number_of_queries(reviewer, django_assert_max_num_queries):
    from tests.helpers.runs import SUB_AGENT_REFUND, start_run

    client, _ = reviewer
    suspend("send-email", dict(EMAIL, subject="Refund <b>now</b>"), thread="t-a", resource="ann")
    start_run(SUB_AGENT_REFUND, thread="t-d", resource="dee", agent_id="support-supervisor")
    _, few = inbox_queries(client, django_assert_max_num_queries)
    suspend("delete-record", {"table": "users", "id": 7}, thread="t-b", resource="bob")
    suspend("ask-user", {"question": "Which city?"}, thread="t-c", resource="cy")
    for i in range(3):
        suspend("send-email", EMAIL, thread=f"t-more{i}", resource=f"r{i}")
    page, many = inbox_queries(client, django_assert_max_num_queries)
    assert many == few, f"{few} queries with 2 rows, {many} with 7"

    row = re.search(r'<li class="thread-row risk-medium" data-thread-id="t-a">.*?</li>\s*</ul>', page, re.S).group(0)
    summary = re.search(r'<span class="summary">([^<]*)</span>', row).group(1)
    # One line, every argument (PostgreSQL's jsonb keeps its own key order).
    assert ">send-email</code>" in row and "\n" not in summary
    assert {"to=ann@example.com", "subject=Refund &lt;b&gt;now&lt;/b&gt;", "body=It shipped."} == set(
        summary.split(" · ")
    )
    assert "<strong>ann</strong>" in row and "waiting " in row
    high = re.search(r'<li class="thread-row risk-high" data-thread-id="t-b">.*?</li>\s*</ul>', page, re.S).group(0)
    assert "high risk" in high and "table=users" in high and "id=7" in high
    # A sub-agent's call names what it would run, once.
    sub = re.search(r'data-thread-id="t-d">.*?</li>\s*</ul>', page, re.S).group(0)
    assert ">refund</code>" in sub and "via billing-agent" in sub and "orderId=o-1" in sub and "amount=5.0" in sub
    assert page.count('data-thread-id="t-d"') == 1 and sub.count('class="row-call"') == 1
    # Runs waiting per agent (the sub-agent's run waits too, under its own agent).
    assert agent_counts(page) == {"support-agent": 6, "support-supervisor": 1, "billing-agent": 1}


def test_a_busy_threads_row_names_its_oldest_calls_and_counts_the_rest(reviewer):
    """A row shows the first five calls of its thread, oldest first, and "and N more" (chosen in SQL,
    per thread: a thread may hold thousands of waiting calls)."""
    from approvals.selectors import INBOX_CALLS_PER_ROW

    client, _ = reviewer
    subjects = [f"Order {i}" for i in range(INBOX_CALLS_PER_ROW + 2)]
    for subject in subjects:
        suspend("send-email", dict(EMAIL, subject=subject), thread="t-busy", resource="busy")
    suspend("send-email", dict(EMAIL, subject="Elsewhere"), thread="t-quiet", resource="quiet")
    page = client.get(reverse("approvals:inbox")).content.decode()
    row = re.search(r'data-thread-id="t-busy">.*?</li>\s*</ul>', page, re.S).group(0)
    shown = re.findall(r"subject=(Order \d+)", row)
    assert shown == subjects[:INBOX_CALLS_PER_ROW]
    assert "and 2 more" in row
    quiet = re.search(r'data-thread-id="t-quiet">.*?</li>\s*</ul>', page, re.S).group(0)
    assert "subject=Elsewhere" in quiet and "more</li>" not in quiet


def test_inbox_sorts_and_filters_by_agent_tool_risk_and_resource(reviewer):
    client, _ = reviewer
    suspend("send-email", EMAIL, thread="t-first", resource="r-1")
    suspend("delete-record", {"table": "t", "id": 1}, thread="t-second", resource="r-2")
    suspend("send-email", EMAIL, thread="t-third", resource="r-2")

    def threads(**params) -> list[str]:
        page = client.get(reverse("approvals:inbox"), params).content.decode()
        return re.findall(r'class="thread-row[^"]*" data-thread-id="([^"]*)"', page)

    assert threads() == ["t-first", "t-second", "t-third"]
    assert threads(sort="newest") == ["t-third", "t-second", "t-first"]
    assert threads(risk="high") == ["t-second"]
    assert threads(tool="send-email") == ["t-first", "t-third"]
    assert threads(resource="r-2", sort="newest") == ["t-third", "t-second"]
    assert threads(agent="billing-agent") == []
    # The agent counts follow the resource filter; the tool and risk filters narrow the rows only.
    page = client.get(reverse("approvals:inbox"), {"risk": "high"}).content.decode()
    assert agent_counts(page) == {"support-agent": 3}
    page = client.get(reverse("approvals:inbox"), {"resource": "r-2"}).content.decode()
    assert agent_counts(page) == {"support-agent": 2}


def agent_counts(page: str) -> dict[str, int]:
    found = re.findall(r'<li[^>]* data-agent-id="([^"]+)">.*?<strong class="n">(\d+)</strong>', page)
    return {agent: int(n) for agent, n in found}


def test_inbox_counts_per_agent_are_exact_from_the_counters(reviewer, django_assert_max_num_queries, settings):
    """The counts are the listing's totals (the snapshot counters, no scan): a run with two open calls
    is one waiting run, a run past its time to live that the sweeper has not expired yet is not counted,
    an agent the reviewer is outside of is not shown; the queries do not grow with the runs."""
    from datetime import timedelta

    from django.db.models import Q
    from django.utils import timezone

    from agentrun.core.models import Run, Snapshot
    from tests.helpers.runs import SUB_AGENT_REFUND, start_run, tool_line

    settings.AGENTRUN_AGENT_REVIEWERS = {"billing-agent": ["Billing reviewers"]}
    client, _ = reviewer
    two_calls = "\n".join([tool_line("send-email", EMAIL), tool_line("delete-record", {"table": "t", "id": 2})])
    start_run(two_calls, thread="t-two", resource="r-1")
    start_run(SUB_AGENT_REFUND, thread="t-sub", resource="r-1", agent_id="support-supervisor")
    overdue = suspend("send-email", EMAIL, thread="t-overdue", resource="r-1")
    past = timezone.now() - timedelta(minutes=1)
    Run.objects.filter(pk=overdue).update(expires_at=past)
    Snapshot.objects.filter(run_id=overdue).update(expires_at=past)

    def brute_force(**filters) -> dict[str, int]:
        live = Snapshot.objects.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()), **filters)
        counts: dict[str, int] = {}
        for agent_id in live.exclude(agent_id="billing-agent").values_list("agent_id", flat=True):
            counts[agent_id] = counts.get(agent_id, 0) + 1
        return counts

    page, few = inbox_queries(client, django_assert_max_num_queries)
    assert agent_counts(page) == brute_force() == {"support-agent": 1, "support-supervisor": 1}
    for i in range(6):
        suspend("send-email", EMAIL, thread=f"t-n{i}", resource=f"r-{i % 2}")
    page, many = inbox_queries(client, django_assert_max_num_queries)
    assert agent_counts(page) == brute_force() == {"support-agent": 7, "support-supervisor": 1}
    assert many == few
    page, _ = inbox_queries(client, django_assert_max_num_queries, resource="r-1")
    assert agent_counts(page) == brute_force(resource_id="r-1") == {"support-agent": 4, "support-supervisor": 1}


# --- history ---------------------------------------------------------------------------------------
def test_history_and_the_rest_trail_filter_alike(reviewer):
    client, _ = reviewer
    runs = {t: suspend("send-email", EMAIL, thread=t, resource=f"res-{i}") for i, t in enumerate(["h/a?", "h b#"])}
    for run_id in runs.values():
        record_decision(agent_id="support-agent", run_id=run_id, kind="decline", decider=Decider.system("rita"))
    for thread, run_id in runs.items():
        page = client.get(reverse("approvals:history"), {"thread": thread}).content.decode()
        rest = client.get("/api/decisions", {"threadId": thread}).json()["data"]
        shown = re.findall(r'data-decision-id="([^"]+)"', page)
        assert shown == [d["id"] for d in rest] and len(shown) == 1
        assert rest[0]["runId"] == run_id
    page = client.get(reverse("approvals:history"), {"resource": "res-1"}).content.decode()
    assert re.findall(r'data-decision-id="([^"]+)"', page) == [
        d["id"] for d in client.get("/api/decisions", {"threadId": "h b#"}).json()["data"]
    ]


def test_history_shows_edited_args_as_a_diff_and_times_with_their_zone(reviewer):
    client, _ = reviewer
    run_id = suspend("send-email", EMAIL, thread="t-diff", resource="ann")
    record_decision(agent_id="support-agent", run_id=run_id, kind="approve", args=dict(EMAIL, to="<b>bob</b>"))
    page = client.get(reverse("approvals:history")).content.decode()
    assert '<del title="original">ann@example.com</del>' in page
    assert '<ins title="ran with">&lt;b&gt;bob&lt;/b&gt;</ins>' in page
    assert re.search(r"<time datetime=\"[^\"]+\">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</time>", page)
    assert 'data-label="Resource">ann</td>' in page


def test_history_keeps_the_risk_the_reviewer_saw_after_the_tool_changes_its_declaration(
    reviewer, admin_client_, monkeypatch
):
    """The trail is what happened: a tool re-declared later (here delete-record high → low, send-email
    medium → high) does not rewrite the risk its decided calls showed, on the page, the admin or the CSV."""
    import csv
    import io

    from agentrun import get_agent
    from agentrun.core.models import Decision

    client, _ = reviewer
    deleted = suspend("delete-record", {"table": "orders", "id": 7}, thread="t-risk-del")
    emailed = suspend("send-email", EMAIL, thread="t-risk-mail")
    record_decision(agent_id="support-agent", run_id=deleted, kind="approve", decider=Decider.system("rita"))
    record_decision(agent_id="support-agent", run_id=emailed, kind="decline", decider=Decider.system("rita"))
    tools = get_agent("support-agent").tools
    for tool_id, risk in (("delete-record", "low"), ("send-email", "high")):
        monkeypatch.setattr(tools[tool_id], "risk", risk)
        monkeypatch.setattr(tools[tool_id], "explicit_risk", risk)

    page = client.get(reverse("approvals:history")).content.decode()
    rows = re.findall(r'<tr data-decision-id="[^"]+" class="risk-(\w+)">.*?<code>([^<]+)</code>', page, re.S)
    assert {tool: risk for risk, tool in rows} == {"delete-record": "high", "send-email": "medium"}
    assert page.count('<span class="risk risk-high" title="risk">high risk</span>') == 1

    admin, _ = admin_client_
    response = admin.post(
        reverse("admin:agentrun_decision_changelist"),
        {"action": "export_decisions_csv", "_selected_action": list(Decision.objects.values_list("pk", flat=True))},
    )
    exported = {r["tool_name"]: r["risk"] for r in csv.DictReader(io.StringIO(response.content.decode()))}
    assert exported == {"delete-record": "high", "send-email": "medium"}


# --- inbox: pages and counts ------------------------------------------------------------------------
def inbox_threads(page: str) -> list[str]:
    return re.findall(r'class="thread-row[^"]*" data-thread-id="([^"]*)"', page)


def inbox_count(page: str) -> str:
    found = re.search(r'data-testid="inbox-count"[^>]*>\s*<strong>([^<]*)</strong>', page)
    return " ".join(found.group(1).split()) if found else ""


def test_the_inbox_pages_by_thread_and_says_how_many_wait_in_all(reviewer, monkeypatch, django_assert_max_num_queries):
    """docs/dashboard.md#inbox: "2 of 5 threads waiting", a link to the next page keeping the sort and
    the filters, pages that neither overlap nor skip, and a fixed number of queries per page."""
    monkeypatch.setattr("approvals.selectors.INBOX_MAX_ROWS", 2)
    client, _ = reviewer
    threads = [f"p-{i} /%#ü" for i in range(5)]
    for thread in threads:
        suspend("send-email", EMAIL, thread=thread, resource="pager")
    suspend("delete-record", {"table": "t", "id": 1}, thread=threads[1], resource="pager")  # 2 calls, 1 thread
    first = client.get(reverse("approvals:inbox"), {"resource": "pager"}).content.decode()
    assert inbox_threads(first) == threads[:2]
    assert inbox_count(first) == "2 of 5 threads waiting"
    assert "6 open calls in all" in first
    nxt = re.search(r'<a rel="next" href="([^"]+)"', first).group(1).replace("&amp;", "&")
    assert "resource=pager" in nxt and "page=2" in nxt
    second = client.get(reverse("approvals:inbox") + nxt).content.decode()
    assert inbox_threads(second) == threads[2:4]
    assert inbox_count(second) == "3–4 of 5 threads waiting"
    last = client.get(reverse("approvals:inbox"), {"resource": "pager", "page": "3"}).content.decode()
    assert inbox_threads(last) == threads[4:] and 'rel="next"' not in last and 'rel="prev"' in last
    # The sort is kept from page to page.
    newest = client.get(reverse("approvals:inbox"), {"resource": "pager", "sort": "newest"}).content.decode()
    nxt = re.search(r'<a rel="next" href="([^"]+)"', newest).group(1).replace("&amp;", "&")
    assert "sort=newest" in nxt
    newest_2 = client.get(reverse("approvals:inbox") + nxt).content.decode()
    assert inbox_threads(newest) + inbox_threads(newest_2) == [threads[1], threads[4], threads[3], threads[2]]
    # Past the end, or nonsense: the last page, or the first; never an error.
    assert (
        inbox_threads(client.get(reverse("approvals:inbox"), {"resource": "pager", "page": "99"}).content.decode())
        == threads[4:]
    )
    assert (
        inbox_threads(client.get(reverse("approvals:inbox"), {"resource": "pager", "page": "x"}).content.decode())
        == threads[:2]
    )
    _, few = inbox_queries(client, django_assert_max_num_queries, resource="pager", page="2")
    for i in range(4):
        suspend("send-email", EMAIL, thread=f"p-more-{i}", resource="pager")
    _, many = inbox_queries(client, django_assert_max_num_queries, resource="pager", page="2")
    assert few == many


def test_the_inbox_chips_say_their_unit(reviewer):
    client, _ = reviewer
    suspend("send-email", EMAIL, thread="unit-1", resource="r")
    page = client.get(reverse("approvals:inbox")).content.decode()
    assert re.search(r'<strong class="n">1</strong> run waiting', page)
    assert inbox_count(page) == "1 of 1 thread waiting"

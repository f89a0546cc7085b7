"""Reviewer pages through Django's test client: access, escaping, decisions and their errors."""

from __future__ import annotations

import json
import re
from urllib.parse import unquote

import pytest
from django.urls import resolve, reverse

from agentrun.core.models import Decision, Message, SuspendedToolCall, args_fingerprint
from tests.helpers.runs import EMAIL, SUB_AGENT_REFUND, start_run, suspend, wait_until_final
from tests.helpers.users import make_user

# A test runs in a transaction rolled back at its end; those marked transaction=True need real commits
# (a decision's continuation, a start or a cancel goes on in another thread, started on commit).
pytestmark = pytest.mark.django_db

XSS = {"to": "<script>alert(1)</script>@x.test", "subject": '<img src=x onerror="alert(2)">', "body": "b"}


def open_call(run_id: str) -> SuspendedToolCall:
    return SuspendedToolCall.objects.get(run_id=run_id, status="open")


def decide_url(call: SuspendedToolCall) -> str:
    return reverse("approvals:decide", args=[call.run_id, call.tool_call_id])


# --- access ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["approvals:inbox", "approvals:history"])
def test_anonymous_is_sent_to_login(client, name):
    response = client.get(reverse(name))
    assert response.status_code == 302
    assert response.url.startswith("/accounts/login/?next=")


def test_login_page_is_styled(client):
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert b"approvals.css" in response.content and b'name="password"' in response.content


def test_root_redirects_to_the_inbox(client):
    assert client.get("/").url == "/approvals/"


def test_user_without_a_group_gets_403(groups, client):

    client.force_login(make_user("nobody", group=None))
    assert client.get(reverse("approvals:inbox")).status_code == 403


def test_viewer_reads_but_sees_no_buttons(viewer):
    client, _ = viewer
    run_id = suspend("send-email", EMAIL, thread="t-view")
    response = client.get(reverse("approvals:thread", args=["t-view"]))
    html = response.content.decode()
    assert response.status_code == 200
    assert f'data-tool-call-id="{open_call(run_id).tool_call_id}"' in html
    assert "ann@example.com" in html
    for name in (">Approve<", ">Decline<", "Edit &amp; approve", ">Resume<"):
        assert name not in html


def test_viewer_forged_post_is_403_and_decides_nothing(viewer):
    client, _ = viewer
    run_id = suspend("send-email", EMAIL, thread="t-forge")
    call = open_call(run_id)
    response = client.post(decide_url(call), {"action": "approve"})
    assert response.status_code == 403
    assert not Decision.objects.filter(run_id=run_id).exists()
    assert open_call(run_id).status == "open"


def test_reviewer_sees_the_actions(reviewer):
    client, _ = reviewer
    suspend("send-email", EMAIL, thread="t-rev")
    html = client.get(reverse("approvals:thread", args=["t-rev"])).content.decode()
    assert ">Approve</button>" in html and ">Decline</button>" in html and "Edit &amp; approve</button>" in html
    assert '<label for="reason-' in html and ">Reason</label>" in html
    assert ">Resume</button>" not in html


# --- escaping ----------------------------------------------------------------------------------
def test_arguments_are_escaped_everywhere(reviewer):
    client, _ = reviewer
    run_id = suspend("send-email", XSS, thread="t-xss")
    for url in (
        reverse("approvals:thread", args=["t-xss"]),
        reverse("approvals:run", args=[run_id]),
        reverse("approvals:inbox"),
    ):
        html = client.get(url).content.decode()
        assert "<script>alert(1)</script>" not in html
        assert '<img src=x onerror="alert(2)">' not in html
        assert "<img src" not in html
    html = client.get(reverse("approvals:thread", args=["t-xss"])).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


# --- inbox -------------------------------------------------------------------------------------
def test_inbox_lists_threads_oldest_first_with_filters(reviewer, django_assert_max_num_queries):
    client, _ = reviewer
    suspend("send-email", EMAIL, thread="t-old", resource="r-1")
    suspend("delete-record", {"table": "users", "id": 7}, thread="t-new", resource="r-2")
    suspend("send-email", EMAIL, thread="t-new", resource="r-2")
    # Session, user, 2 permissions, rows, the first calls of each (ids), those calls, reasons, filter menus,
    # counts per agent (from counters).
    with django_assert_max_num_queries(10):
        html = client.get(reverse("approvals:inbox")).content.decode()
    assert html.index("t-old") < html.index("t-new")
    assert "2 open calls" in html
    filtered = client.get(reverse("approvals:inbox"), {"tool": "delete-record"}).content.decode()
    assert 'href="/approvals/threads/t-new/"' in filtered and 'href="/approvals/threads/t-old/"' not in filtered
    by_resource = client.get(reverse("approvals:inbox"), {"resource": "r-1"}).content.decode()
    assert 'href="/approvals/threads/t-old/"' in by_resource and 'href="/approvals/threads/t-new/"' not in by_resource


def test_htmx_request_gets_the_partial(reviewer):
    client, _ = reviewer
    response = client.get(reverse("approvals:inbox"), headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="threads"') and "<html" not in html
    assert "HX-Request" in response["Vary"]


def test_the_live_refresh_reads_rows_and_counts_not_the_menus(reviewer):
    """Every open inbox re-fetches its rows on each live message: the filter menus (a scan of every
    waiting call, which it does not show) are read only for the whole page."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client, _ = reviewer
    suspend("send-email", EMAIL, thread="t-live", resource="r-live")
    client.get(reverse("approvals:inbox"))
    with CaptureQueriesContext(connection) as whole:
        page = client.get(reverse("approvals:inbox")).content.decode()
    with CaptureQueriesContext(connection) as partial:
        rows = client.get(reverse("approvals:inbox"), headers={"HX-Request": "true"}).content.decode()
    assert '<option value="r-live">' in page and 'data-thread-id="t-live"' in rows
    assert 'data-agent-id="support-agent"' in rows  # the counts per agent are in the rows' section
    menu_reads = [q["sql"] for q in whole.captured_queries if "DISTINCT" in q["sql"]]
    assert menu_reads and not [q["sql"] for q in partial.captured_queries if "DISTINCT" in q["sql"]]
    assert len(partial.captured_queries) == len(whole.captured_queries) - len(menu_reads)


# --- decisions ---------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_approve_with_htmx_replaces_the_call_and_continues(reviewer):
    client, user = reviewer
    run_id = suspend("send-email", EMAIL, thread="t-approve")
    call = open_call(run_id)
    response = client.post(decide_url(call), {"action": "approve"}, headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert "data-tool-call-id" not in response.content.decode()
    decision = Decision.objects.get(run_id=run_id)
    assert (decision.kind, decision.via, decision.decided_by_id) == ("approve", "dashboard", user.pk)
    assert wait_until_final(run_id).status == "completed"
    page = client.get(reverse("approvals:run", args=[run_id])).content.decode()
    assert "Final answer" in page and "send-email: {" in page


@pytest.mark.django_db(transaction=True)
def test_decline_without_js_redirects_to_the_run(reviewer):
    client, _ = reviewer
    run_id = suspend("send-email", EMAIL, thread="t-decline")
    response = client.post(decide_url(open_call(run_id)), {"action": "decline", "reason": "not today"})
    assert response.status_code == 302 and response.url == reverse("approvals:run", args=[run_id])
    wait_until_final(run_id)
    final = Message.objects.filter(run_id=run_id, role="assistant").last().content
    assert "not today" in final


@pytest.mark.django_db(transaction=True)
def test_edit_and_approve_invalid_json_is_shown_inline_and_decides_nothing(reviewer):
    client, _ = reviewer
    run_id = suspend("send-email", EMAIL, thread="t-edit")
    call = open_call(run_id)
    response = client.post(decide_url(call), {"action": "edit", "args": "{not json"}, headers={"HX-Request": "true"})
    html = response.content.decode()
    assert response.status_code == 422
    assert "Nothing was decided." in html and "not valid JSON" in html
    assert "{not json" in html  # the reviewer's text is kept to fix it
    assert f'data-tool-call-id="{call.tool_call_id}"' in html
    response = client.post(decide_url(call), {"action": "edit", "args": json.dumps({"to": "x"})})
    assert response.status_code == 422 and "subject" in response.content.decode()
    assert not Decision.objects.filter(run_id=run_id).exists()
    assert open_call(run_id).status == "open"

    edited = dict(EMAIL, to="bob@example.com")
    response = client.post(
        decide_url(call), {"action": "edit", "args": json.dumps(edited)}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 200
    decision = Decision.objects.get(run_id=run_id)
    assert decision.edited_args == edited and decision.args == EMAIL
    wait_until_final(run_id)
    assert "bob@example.com" in Message.objects.filter(run_id=run_id, role="assistant").last().content


@pytest.mark.django_db(transaction=True)
def test_resume_form_is_generated_and_validated(reviewer):
    client, _ = reviewer
    run_id = suspend("ask-user", {"question": "Which city?"}, thread="t-ask")
    call = open_call(run_id)
    html = client.get(reverse("approvals:thread", args=["t-ask"])).content.decode()
    assert ">Resume</button>" in html and ">Approve</button>" not in html
    assert 'name="resume__answer"' in html and "Which city?" in html
    response = client.post(decide_url(call), {"action": "resume", "resume__answer": ""}, headers={"HX-Request": "true"})
    assert response.status_code == 422 and 'class="field-error"' in response.content.decode()
    assert not Decision.objects.filter(run_id=run_id).exists()
    response = client.post(
        decide_url(call), {"action": "resume", "resume__answer": "Paris"}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 200
    assert Decision.objects.get(run_id=run_id).resume_data == {"answer": "Paris"}
    wait_until_final(run_id)


@pytest.mark.django_db(transaction=True)
def test_someone_else_decided_first_names_them(reviewer, other_reviewer):
    first, _ = other_reviewer
    second, _ = reviewer
    run_id = suspend("send-email", EMAIL, thread="t-race")
    call = open_call(run_id)
    assert first.post(decide_url(call), {"action": "approve"}, headers={"HX-Request": "true"}).status_code == 200
    for headers in ({"HX-Request": "true"}, {}):
        response = second.post(decide_url(call), {"action": "decline", "reason": "late"}, headers=headers)
        html = response.content.decode()
        assert response.status_code == 409
        assert "Already decided" in html and "olga" in html and "via dashboard" in html and "UTC" in html
    assert Decision.objects.filter(run_id=run_id).count() == 1
    wait_until_final(run_id)


@pytest.mark.django_db(transaction=True)
def test_live_refresh_appends_new_calls_and_reports_decided_ones(reviewer, other_reviewer):
    client, _ = reviewer
    run_id = suspend("send-email", EMAIL, thread="t-live")
    call = open_call(run_id)
    other, _ = other_reviewer
    other.post(decide_url(call), {"action": "decline"}, headers={"HX-Request": "true"})
    new_run = suspend("delete-record", {"table": "t", "id": 1}, thread="t-live")
    response = client.get(
        reverse("approvals:thread", args=["t-live"]),
        {"known": json.dumps([call.tool_call_id])},
        headers={"HX-Request": "true"},
    )
    html = response.content.decode()
    assert f'data-tool-call-id="{open_call(new_run).tool_call_id}"' in html
    assert f'data-decided-call-id="{call.tool_call_id}"' in html and 'hx-swap-oob="true"' in html and "olga" in html
    wait_until_final(run_id)


@pytest.mark.django_db(transaction=True)
def test_history_filters_and_paginates(reviewer):
    client, user = reviewer
    run_ids = [suspend("send-email", EMAIL, thread=f"t-h{i}") for i in range(3)]
    for run_id in run_ids:
        client.post(decide_url(open_call(run_id)), {"action": "approve"})
    for run_id in run_ids:
        wait_until_final(run_id)
    html = client.get(reverse("approvals:history"), {"decided_by": "rita", "kind": "approve"}).content.decode()
    assert html.count("data-decision-id=") == 3
    declined = client.get(reverse("approvals:history"), {"kind": "decline"}).content.decode()
    assert declined.count("data-decision-id=") == 0
    assert client.get(reverse("approvals:history"), {"page": "99"}).status_code == 200


def test_run_page_shows_steps_messages_and_the_final_answer(reviewer):
    client, _ = reviewer
    run_id = start_run("hello there", thread="t-echo")
    html = client.get(reverse("approvals:run", args=[run_id])).content.decode()
    assert "Final answer" in html and "Echo: hello there" in html
    assert "Message Creation" in html and "completed" in html
    assert 'id="run-stream-state"' in html


@pytest.mark.django_db(transaction=True)
def test_sub_agent_call_is_one_card_naming_the_sub_agent_and_edits_the_inner_call(reviewer):
    client, _ = reviewer
    run_id = start_run(SUB_AGENT_REFUND, thread="t-sub", agent_id="support-supervisor")
    call = open_call(run_id)
    inner = SuspendedToolCall.objects.get(run__parent_run_id=run_id, status="open")
    html = client.get(reverse("approvals:thread", args=["t-sub"])).content.decode()
    assert "billing-agent → refund" in html and "Refund an order." in html
    assert html.count("data-tool-call-id=") == 1  # the supervisor's call only, not the inner one too
    assert f'data-tool-call-id="{inner.tool_call_id}"' not in html
    assert "&quot;amount&quot;: 5" in html  # the inner call's arguments, to edit
    response = client.post(
        decide_url(call), {"action": "edit", "args": '{"orderId": "o-1", "amount": -1}'}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 422 and "amount" in response.content.decode()
    assert not Decision.objects.filter(run_id=run_id).exists()
    seen = args_fingerprint(inner.args)  # what the card shows (and posts): the inner call's arguments
    edited = {"action": "edit", "args": '{"orderId": "o-1", "amount": 3}', "args_fingerprint": seen}
    response = client.post(decide_url(call), edited, headers={"HX-Request": "true"})
    assert response.status_code == 200 and "Yes, approve billing-agent → refund" in response.content.decode()
    assert not Decision.objects.exists()  # high risk: the first click only asks
    response = client.post(decide_url(call), edited | {"confirm": "high-risk"}, headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert Decision.objects.get().edited_args == {"orderId": "o-1", "amount": 3.0}  # one record, the supervisor's
    wait_until_final(run_id)


@pytest.mark.django_db(transaction=True)
def test_sub_agent_call_approved_by_a_user_completes(reviewer):
    client, _ = reviewer
    run_id = start_run(SUB_AGENT_REFUND, thread="t-sub2", agent_id="support-supervisor")
    inner = SuspendedToolCall.objects.get(run__parent_run_id=run_id, status="open")
    form = {"action": "approve", "confirm": "high-risk", "args_fingerprint": args_fingerprint(inner.args)}
    client.post(decide_url(open_call(run_id)), form, headers={"HX-Request": "true"})
    assert wait_until_final(run_id).status == "completed"
    assert Decision.objects.count() == 1


# --- the card binds a decision to what it showed (issue 10) ------------------------------------------
def test_a_stale_fingerprint_is_refused_and_the_card_shows_the_current_arguments(reviewer):
    client, _ = reviewer
    run_id = suspend("send-email", EMAIL, thread="t-fp")
    call = open_call(run_id)
    shown = args_fingerprint(EMAIL)
    SuspendedToolCall.objects.filter(pk=call.pk).update(args=dict(EMAIL, to="eve@example.com"))
    response = client.post(
        decide_url(call), {"action": "approve", "args_fingerprint": shown}, headers={"HX-Request": "true"}
    )
    html = response.content.decode()
    assert response.status_code == 409
    assert "The arguments changed since this card was shown" in html and "eve@example.com" in html
    assert f'value="{args_fingerprint(dict(EMAIL, to="eve@example.com"))}"' in html  # the new one, to decide on
    assert not Decision.objects.filter(run_id=run_id).exists()


@pytest.mark.django_db(transaction=True)
def test_approve_while_the_editor_differs_is_refused(reviewer):
    client, _ = reviewer
    run_id = suspend("send-email", EMAIL, thread="t-differs")
    call = open_call(run_id)
    form = {"action": "approve", "args": json.dumps(dict(EMAIL, to="bob@example.com"))}
    response = client.post(decide_url(call), form, headers={"HX-Request": "true"})
    assert response.status_code == 422 and "You changed the arguments" in response.content.decode()
    assert not Decision.objects.filter(run_id=run_id).exists()
    same = {"action": "approve", "args": json.dumps(EMAIL, indent=4), "args_fingerprint": args_fingerprint(EMAIL)}
    assert client.post(decide_url(call), same, headers={"HX-Request": "true"}).status_code == 200
    assert Decision.objects.get(run_id=run_id).edited_args is None
    wait_until_final(run_id)


@pytest.mark.django_db(transaction=True)
def test_high_risk_approval_takes_a_second_step(reviewer):
    client, _ = reviewer
    run_id = suspend("delete-record", {"table": "users", "id": 7}, thread="t-high")
    call = open_call(run_id)
    form = {"action": "approve", "args_fingerprint": args_fingerprint({"table": "users", "id": 7})}
    response = client.post(decide_url(call), form)  # without JavaScript too
    assert response.status_code == 200 and "Yes, approve delete-record" in response.content.decode()
    assert not Decision.objects.filter(run_id=run_id).exists()
    response = client.post(decide_url(call), form | {"confirm": "high-risk"})
    assert response.status_code == 302 and Decision.objects.get(run_id=run_id).kind == "approve"
    wait_until_final(run_id)


@pytest.mark.parametrize("thread", ["a/b", "sp ace", "100%", "x#y", "why?", "ünï/çødé", "t" * 255])
@pytest.mark.django_db(transaction=True)
def test_thread_ids_of_any_shape_reach_their_page_and_decide(reviewer, thread):
    client, _ = reviewer
    run_id = suspend("send-email", EMAIL, thread=thread)
    call = open_call(run_id)
    url = reverse("approvals:thread", args=[thread])
    html = client.get(url).content.decode()
    assert f'data-tool-call-id="{call.tool_call_id}"' in html
    assert client.post(decide_url(call), {"action": "decline"}).status_code == 302
    wait_until_final(run_id)


@pytest.mark.parametrize("tool_call_id", ["call/1", "call 2", "call%3", "call#4", "call?5", "cäll/6"])
def test_decide_urls_carry_any_tool_call_id(tool_call_id):
    url = reverse("approvals:decide", args=["run_1", tool_call_id])
    assert "?" not in url and "#" not in url and " " not in url
    match = resolve(unquote(url))  # the server matches the decoded path
    assert match.url_name == "decide" and match.kwargs == {"run_id": "run_1", "tool_call_id": tool_call_id}


@pytest.mark.django_db(transaction=True)
def test_resync_after_offline_gives_every_card_and_who_decided_the_rest(reviewer, other_reviewer):
    client, _ = reviewer
    run_id = suspend("send-email", EMAIL, thread="t-resync")
    call = open_call(run_id)
    other, _ = other_reviewer
    other.post(decide_url(call), {"action": "decline"}, headers={"HX-Request": "true"})
    new_run = suspend("send-email", EMAIL, thread="t-resync")
    response = client.get(
        reverse("approvals:thread", args=["t-resync"]),
        {"known": json.dumps([call.tool_call_id]), "resync": "1"},
        headers={"HX-Request": "true"},
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="calls"')  # the whole list replaces the page's
    assert f'data-decided-call-id="{call.tool_call_id}"' in html and "olga" in html and "hx-swap-oob" not in html
    assert f'data-tool-call-id="{open_call(new_run).tool_call_id}"' in html
    wait_until_final(run_id)


@pytest.mark.django_db(transaction=True)
def test_decide_all_needs_the_listed_calls_and_decides_all_or_nothing(reviewer, viewer):
    client, _ = reviewer
    runs = [suspend("send-email", EMAIL, thread="t-all"), suspend("send-email", EMAIL, thread="t-all")]
    calls = [open_call(r) for r in runs]
    url = reverse("approvals:decide-all")
    asked = client.post(url, {"thread_id": "t-all", "ask": "approve"}, headers={"HX-Request": "true"})
    assert asked.status_code == 200 and "Approve these 2 calls?" in asked.content.decode()
    items = [f"{c.run_id} {args_fingerprint(EMAIL)} {c.tool_call_id}" for c in calls]
    stale = [items[0], f"{calls[1].run_id} {'0' * 64} {calls[1].tool_call_id}"]
    refused = client.post(url, {"thread_id": "t-all", "confirm": "approve", "call": stale})
    assert refused.status_code == 409 and not Decision.objects.exists()
    assert viewer[0].post(url, {"thread_id": "t-all", "confirm": "approve", "call": items}).status_code == 403
    done = client.post(url, {"thread_id": "t-all", "confirm": "approve", "call": items}, headers={"HX-Request": "true"})
    assert done.status_code == 200 and done["HX-Retarget"] == "#calls"
    assert Decision.objects.filter(kind="approve", via="dashboard").count() == 2
    for run_id in runs:
        wait_until_final(run_id)


@pytest.mark.django_db(transaction=True)
def test_always_approve_from_a_stale_card_grants_and_decides_nothing(reviewer):
    from agentrun.core.models import StandingGrant

    client, _ = reviewer
    run_id = suspend("send-email", EMAIL, thread="t-grant-stale")
    call = open_call(run_id)
    SuspendedToolCall.objects.filter(pk=call.pk).update(args=dict(EMAIL, to="eve@example.com"))
    form = {"run_id": run_id, "tool_call_id": call.tool_call_id, "scope": "thread", "expires_in": "3600"}
    response = client.post(
        reverse("approvals:grant-create"),
        form | {"args_fingerprint": args_fingerprint(EMAIL)},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 409 and "Nothing was granted" in response.content.decode()
    assert not Decision.objects.exists() and not StandingGrant.objects.exists()


def test_the_thread_page_reads_a_fixed_number_of_queries(reviewer, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client, _ = reviewer
    url = reverse("approvals:thread", args=["t-queries"])
    suspend("send-email", EMAIL, thread="t-queries")
    start_run(SUB_AGENT_REFUND, thread="t-queries", agent_id="support-supervisor")
    with CaptureQueriesContext(connection) as few:
        client.get(url)
    for _ in range(4):
        suspend("send-email", EMAIL, thread="t-queries")
    start_run(SUB_AGENT_REFUND, thread="t-queries", agent_id="support-supervisor")
    with django_assert_max_num_queries(len(few.captured_queries)):
        html = client.get(url).content.decode()
    assert html.count("data-tool-call-id=") == 7


def test_approve_all_lists_every_argument_in_full_and_asks_only_while_two_calls_wait(reviewer):
    client, _ = reviewer
    long_body = "It shipped. " * 40 + "<b>end</b>"
    runs = [
        suspend("send-email", dict(EMAIL, body=long_body), thread="t-full"),
        suspend("delete-record", {"table": "users", "id": 7}, thread="t-full"),
    ]
    url = reverse("approvals:decide-all")
    asked = client.post(url, {"thread_id": "t-full", "ask": "approve"}, headers={"HX-Request": "true"}).content.decode()
    assert "Approve these 2 calls?" in asked
    listed = re.findall(r'<pre class="json batch-args"[^>]*>(.*?)</pre>', asked, re.S)
    assert len(listed) == 2
    assert ("It shipped. " * 40).strip() in listed[0] and "&lt;b&gt;end&lt;/b&gt;" in listed[0] and "…" not in listed[0]
    assert '"table": "users"' in listed[1].replace("&quot;", '"') and "high risk" in asked
    # One of them is decided elsewhere: nothing left to decide together, no "Approve these 1 call?".
    call = open_call(runs[0])
    client.post(decide_url(call), {"action": "decline", "args_fingerprint": args_fingerprint(call.args)})
    again = client.post(url, {"thread_id": "t-full", "ask": "approve"}, headers={"HX-Request": "true"}).content.decode()
    assert "Approve these" not in again and "Fewer than two calls wait" in again
    page = client.get(reverse("approvals:thread", args=["t-full"])).content.decode()
    assert 'class="batch-ask"' not in page


@pytest.mark.django_db(transaction=True)
def test_a_question_is_declined_with_a_reason_through_the_decision_service(reviewer):
    """docs/dashboard.md#cards: the tool is not asked again; the model reads a clear refusal."""
    client, _ = reviewer
    run_id = suspend("ask-user", {"question": "Which city?"}, thread="t-q-decline")
    call = open_call(run_id)
    page = client.get(reverse("approvals:thread", args=["t-q-decline"])).content.decode()
    assert "Decline to answer" in page
    answer = client.post(
        decide_url(call),
        {"action": "decline_question", "reason": "<b>not</b> our business"},
        headers={"HX-Request": "true"},
    )
    assert answer.status_code == 200 and "Declined" in answer.content.decode()
    decision = Decision.objects.get(run_id=run_id)
    assert (decision.kind, decision.reason, decision.via) == ("decline", "<b>not</b> our business", "dashboard")
    run = wait_until_final(run_id)
    assert run.status == "completed"
    said = " ".join(m.content for m in Message.objects.filter(run_id=run_id))
    assert "declined" in said.lower()
    steps = json.dumps([s.step_details for s in run.steps.all()])
    assert "Declined: the user chose not to answer this question: <b>not</b> our business" in json.loads(
        json.dumps(steps)
    )

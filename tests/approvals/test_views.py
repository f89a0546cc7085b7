"""Reviewer pages through Django's test client: access, escaping, decisions and their errors."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from agentrun.models import Decision, Message, SuspendedToolCall
from tests.approvals.conftest import start_run, suspend, wait_until_final
from tests.factories import EMAIL

pytestmark = pytest.mark.django_db(transaction=True)

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
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user("nobody"))
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
    with django_assert_max_num_queries(7):
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


# --- decisions ---------------------------------------------------------------------------------
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


def test_decline_without_js_redirects_to_the_run(reviewer):
    client, _ = reviewer
    run_id = suspend("send-email", EMAIL, thread="t-decline")
    response = client.post(decide_url(open_call(run_id)), {"action": "decline", "reason": "not today"})
    assert response.status_code == 302 and response.url == reverse("approvals:run", args=[run_id])
    wait_until_final(run_id)
    final = Message.objects.filter(run_id=run_id, role="assistant").last().content
    assert "not today" in final


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


def test_live_refresh_appends_new_calls_and_reports_decided_ones(reviewer, other_reviewer):
    client, _ = reviewer
    run_id = suspend("send-email", EMAIL, thread="t-live")
    call = open_call(run_id)
    other, _ = other_reviewer
    other.post(decide_url(call), {"action": "decline"}, headers={"HX-Request": "true"})
    new_run = suspend("delete-record", {"table": "t", "id": 1}, thread="t-live")
    response = client.get(
        reverse("approvals:thread", args=["t-live"]), {"known": call.tool_call_id}, headers={"HX-Request": "true"}
    )
    html = response.content.decode()
    assert f'data-tool-call-id="{open_call(new_run).tool_call_id}"' in html
    assert f'id="call-{call.tool_call_id}"' in html and 'hx-swap-oob="true"' in html and "olga" in html
    wait_until_final(run_id)


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


SUB_AGENT_REFUND = '/tool agent-billing-agent {"message": "/tool refund {\\"orderId\\": \\"o-1\\", \\"amount\\": 5}"}'


def test_sub_agent_call_shows_and_edits_the_inner_call(reviewer):
    client, _ = reviewer
    run_id = start_run(SUB_AGENT_REFUND, thread="t-sub", agent_id="support-supervisor")
    call = open_call(run_id)
    html = client.get(reverse("approvals:thread", args=["t-sub"])).content.decode()
    assert "agent-billing-agent → refund" in html and "Refund an order." in html
    assert "&quot;amount&quot;: 5" in html  # the inner call's arguments, to edit
    response = client.post(
        decide_url(call), {"action": "edit", "args": '{"orderId": "o-1", "amount": -1}'}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 422 and "amount" in response.content.decode()
    assert not Decision.objects.filter(run_id=run_id).exists()
    response = client.post(
        decide_url(call), {"action": "edit", "args": '{"orderId": "o-1", "amount": 3}'}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 200
    assert Decision.objects.get(run_id=run_id).edited_args == {"orderId": "o-1", "amount": 3.0}
    wait_until_final(run_id)


def test_sub_agent_call_approved_by_a_user_completes(reviewer):
    client, _ = reviewer
    run_id = start_run(SUB_AGENT_REFUND, thread="t-sub2", agent_id="support-supervisor")
    client.post(decide_url(open_call(run_id)), {"action": "approve"}, headers={"HX-Request": "true"})
    assert wait_until_final(run_id).status == "completed"

"""A decision on a call surfaced from a sub-agent reads as what the reviewer saw (issue 19, item 7).

``support-supervisor`` asks ``billing-agent`` (a sub-agent) to refund; the refund surfaces on the
supervisor's ``agent-billing-agent`` call. The reviewer sees, edits and approves the refund: the audit
trail, the history page, the admin (search included), the done notice, the emails and the inbox
filters all speak of ``billing-agent → refund`` and its arguments, not of the supervisor's message.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Group
from django.core import mail
from django.test import Client

from agentrun.core.models import Decision, SuspendedToolCall, args_fingerprint
from tests.helpers.notifications import sent_emails
from tests.helpers.runs import start, tool_line, wait_rested
from tests.helpers.users import make_user, token_client
from tests.helpers.waiting import wait_for_tasks

pytestmark = pytest.mark.django_db(transaction=True)

REFUND = {"orderId": "o-77", "amount": 5}


def supervised_refund(thread: str) -> tuple[str, SuspendedToolCall, SuspendedToolCall]:
    message = tool_line("agent-billing-agent", {"message": tool_line("refund", REFUND)})
    stream, _ = async_to_sync(start)("support-supervisor", message, thread=thread)
    outer = SuspendedToolCall.objects.select_related("run").get(run_id=stream.run_id, status="open")
    inner = SuspendedToolCall.objects.get(run__parent_run_id=stream.run_id, status="open")
    return stream.run_id, outer, inner


def reviewer(name: str, *groups: str, **extra) -> Client:
    user = make_user(name, **extra)
    for group in groups:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    browser = Client()
    browser.force_login(user)
    return browser


def test_the_audit_trail_history_and_admin_show_the_inner_refund_and_its_edit():
    run_id, outer, inner = supervised_refund("t-audit")
    rita = reviewer("rita", is_staff=True, is_superuser=True)
    form = {"action": "edit", "args": '{"orderId": "o-77", "amount": 3}', "confirm": "high-risk"}
    form["args_fingerprint"] = args_fingerprint(inner.args)
    done = rita.post(
        f"/approvals/runs/{quote(run_id)}/calls/{quote(outer.tool_call_id)}/decide", form, HTTP_HX_REQUEST="true"
    )
    assert done.status_code == 200 and "billing-agent → refund" in done.content.decode()  # the done notice
    wait_rested(run_id)

    [record] = token_client(make_user("auditor")).get("/api/decisions", {"threadId": "t-audit"}).json()["data"]
    assert (record["toolName"], record["args"]) == ("agent-billing-agent", outer.args)
    assert record["editedArgs"] is None  # the supervisor's message was not edited
    assert record["subAgent"] == {
        "agentId": "billing-agent",
        "runId": inner.run_id,
        "toolCallId": inner.tool_call_id,
        "toolName": "refund",
        "args": {"orderId": "o-77", "amount": 5.0},
        "editedArgs": {"orderId": "o-77", "amount": 3.0},
    }
    assert record["argsFingerprint"] == args_fingerprint(inner.args)

    history = rita.get("/approvals/history/").content.decode()
    assert "billing-agent → refund" in history
    assert '<del title="original">5.0</del>' in history and '<ins title="ran with">3.0</ins>' in history
    assert "/tool refund" not in history  # no meaningless diff of the supervisor's message

    found = rita.get("/admin/agentrun/decision/", {"q": "refund"}).content.decode()
    assert Decision.objects.get().id in found and "billing-agent → refund" in found
    csv = rita.post(
        "/admin/agentrun/decision/", {"action": "export_decisions_csv", "_selected_action": Decision.objects.get().id}
    ).content.decode()
    assert "refund" in csv and '""amount"": 5.0' in csv  # the inner call's arguments, CSV-quoted


def test_reviewers_outside_the_sub_agents_scope_are_not_emailed_its_arguments_and_each_gets_one_email(settings):
    settings.AGENTRUN_AGENT_REVIEWERS = {"billing-agent": ["Billing reviewers"]}
    bill = make_user("bill", email="bill@example.com")
    bill.groups.add(Group.objects.get_or_create(name="Billing reviewers")[0])
    make_user("sue", email="sue@example.com")  # may decide the supervisor, not billing-agent
    supervised_refund("t-mail")
    [email] = sent_emails(1)
    wait_for_tasks()
    assert [e.to for e in mail.outbox] == [["bill@example.com"]]  # one email: the supervisor's call
    assert "billing-agent → refund" in email.subject and '"orderId": "o-77"' in email.body


def test_the_inbox_finds_a_sub_agents_call_by_the_sub_agent_and_its_tool(settings):
    supervised_refund("t-inbox")
    rita = reviewer("rita")
    for query in ({"agent": "billing-agent"}, {"agent": "support-supervisor"}, {"tool": "refund"}):
        page = rita.get("/approvals/", query).content.decode()
        assert "t-inbox" in page, query
    assert "t-inbox" not in rita.get("/approvals/", {"tool": "agent-billing-agent"}).content.decode()
    chips = rita.get("/approvals/").content.decode()
    assert 'value="billing-agent"' in chips and 'value="refund"' in chips

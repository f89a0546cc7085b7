"""The listing contract: ``Agent.list_suspended_runs`` (docs/runs.md#the-python-api, docs/api.md#the-listing)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from agentrun import AgentRunError, get_agent
from tests.helpers.runs import EMAIL, collect, set_created_at, snapshot_exists, suspended_email_run

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


@pytest.fixture
def agent():
    return get_agent("support-agent")


async def _runs_at(layout: list[tuple[str, str, datetime]]) -> list[str]:
    ids = []
    for thread, resource, created_at in layout:
        run_id = await suspended_email_run(thread=thread, resource=resource)
        await set_created_at(run_id, created_at)
        ids.append(run_id)
    return ids


async def test_lists_a_suspended_run_with_its_open_call(agent):
    run_id = await suspended_email_run(thread="t-a", resource="u-a")
    page = await agent.list_suspended_runs()
    assert page.total == 1
    [run] = page.runs
    assert (run.run_id, run.agent_id, run.status, run.thread_id, run.resource_id) == (
        run_id,
        "support-agent",
        "suspended",
        "t-a",
        "u-a",
    )
    [call] = run.tool_calls
    assert (call.tool_name, call.args, call.requires_approval, call.suspend_payload) == (
        "send-email",
        EMAIL,
        True,
        None,
    )
    data = page.to_dict()
    assert set(data) == {"runs", "total"}
    assert set(data["runs"][0]) >= {
        "runId",
        "agentId",
        "status",
        "threadId",
        "resourceId",
        "createdAt",
        "suspendedAt",
        "toolCalls",
    }
    assert set(data["runs"][0]["toolCalls"][0]) >= {
        "toolCallId",
        "toolName",
        "args",
        "requiresApproval",
        "suspendPayload",
        "resumeSchema",
    }
    assert data["runs"][0]["createdAt"].endswith("Z")


async def test_filters_by_thread_and_by_resource(agent):
    a1, a2, b1 = await _runs_at(
        [
            ("t-a", "u-1", T0),
            ("t-a", "u-2", T0 + timedelta(seconds=1)),
            ("t-b", "u-1", T0 + timedelta(seconds=2)),
        ]
    )
    by_thread = await agent.list_suspended_runs(thread_id="t-a")
    assert [r.run_id for r in by_thread.runs] == [a2, a1] and by_thread.total == 2
    by_resource = await agent.list_suspended_runs(resource_id="u-1")
    assert [r.run_id for r in by_resource.runs] == [b1, a1] and by_resource.total == 2
    both = await agent.list_suspended_runs(thread_id="t-a", resource_id="u-1")
    assert [r.run_id for r in both.runs] == [a1] and both.total == 1
    none = await agent.list_suspended_runs(thread_id="t-nope")
    assert none.runs == [] and none.total == 0


async def test_date_bounds_are_inclusive_on_created_at(agent):
    first, middle, last = await _runs_at(
        [
            ("t", "u", T0),
            ("t", "u", T0 + timedelta(hours=1)),
            ("t", "u", T0 + timedelta(hours=2)),
        ]
    )
    page = await agent.list_suspended_runs()
    created = {r.run_id: r.to_dict()["createdAt"] for r in page.runs}

    # A returned createdAt used as a bound still matches that run (both ends, ISO strings).
    exact = await agent.list_suspended_runs(from_date=created[middle], to_date=created[middle])
    assert [r.run_id for r in exact.runs] == [middle]
    upto = await agent.list_suspended_runs(to_date=created[middle])
    assert [r.run_id for r in upto.runs] == [middle, first]
    since = await agent.list_suspended_runs(from_date=created[middle])
    assert [r.run_id for r in since.runs] == [last, middle]

    # Aware datetimes in another zone, and naive datetimes (taken as UTC).
    plus2 = timezone(timedelta(hours=2))
    aware = await agent.list_suspended_runs(from_date=(T0 + timedelta(hours=1)).astimezone(plus2))
    assert [r.run_id for r in aware.runs] == [last, middle]
    naive = await agent.list_suspended_runs(to_date=T0.replace(tzinfo=None))
    assert [r.run_id for r in naive.runs] == [first]
    offset_string = await agent.list_suspended_runs(to_date="2025-03-01T14:00:00.123456+02:00")
    assert [r.run_id for r in offset_string.runs] == [first]
    # One microsecond before the first run excludes nothing; one after excludes it.
    assert (await agent.list_suspended_runs(from_date=T0 - timedelta(microseconds=1))).total == 3
    assert (await agent.list_suspended_runs(from_date=T0 + timedelta(microseconds=1))).total == 2


@pytest.mark.parametrize("bad", ["yesterday", "2025-13-01", 12345, "2025-03-01T25:00:00Z"])
async def test_invalid_date_is_rejected(agent, bad):
    with pytest.raises(AgentRunError) as err:
        await agent.list_suspended_runs(from_date=bad)
    assert err.value.code == "INVALID_DATE"
    with pytest.raises(AgentRunError) as err:
        await agent.list_suspended_runs(to_date=bad)
    assert err.value.code == "INVALID_DATE"


async def test_order_is_created_at_desc_then_run_id_desc(agent):
    ids = await _runs_at([("t", "u", T0), ("t", "u", T0), ("t", "u", T0), ("t", "u", T0 + timedelta(seconds=1))])
    page = await agent.list_suspended_runs()
    newest, *same_time = ids[3], *ids[:3]
    assert [r.run_id for r in page.runs] == [newest, *sorted(same_time, reverse=True)]


async def test_pagination_applies_only_with_both_per_page_and_page_and_total_counts_all(agent):
    ids = await _runs_at([("t", "u", T0 + timedelta(seconds=i)) for i in range(5)])
    newest_first = list(reversed(ids))

    assert [r.run_id for r in (await agent.list_suspended_runs(per_page=2)).runs] == newest_first
    assert [r.run_id for r in (await agent.list_suspended_runs(page=1)).runs] == newest_first

    pages = [await agent.list_suspended_runs(per_page=2, page=p) for p in range(4)]
    assert [[r.run_id for r in p.runs] for p in pages] == [newest_first[0:2], newest_first[2:4], newest_first[4:], []]
    assert {p.total for p in pages} == {5}
    # String values (as a query string would carry them) page the same way.
    assert [r.run_id for r in (await agent.list_suspended_runs(per_page="2", page="1")).runs] == newest_first[2:4]
    # total is counted before pagination, after filtering.
    filtered = await agent.list_suspended_runs(from_date=T0 + timedelta(seconds=1), per_page=1, page=0)
    assert filtered.total == 4 and [r.run_id for r in filtered.runs] == newest_first[:1]


@pytest.mark.parametrize("per_page", [0, 1001, "x", True, -3, 2.5])
async def test_invalid_per_page(agent, per_page):
    with pytest.raises(AgentRunError) as err:
        await agent.list_suspended_runs(per_page=per_page, page=0)
    assert err.value.code == "INVALID_PER_PAGE"
    with pytest.raises(AgentRunError) as err:  # validated whenever given, even without page
        await agent.list_suspended_runs(per_page=per_page)
    assert err.value.code == "INVALID_PER_PAGE"


@pytest.mark.parametrize("page", [-1, "x", True, "-1"])
async def test_invalid_page(agent, page):
    with pytest.raises(AgentRunError) as err:
        await agent.list_suspended_runs(per_page=10, page=page)
    assert err.value.code == "INVALID_PAGE"


async def test_per_page_bounds_are_accepted(agent):
    await suspended_email_run()
    assert (await agent.list_suspended_runs(per_page=1, page=0)).total == 1
    assert len((await agent.list_suspended_runs(per_page=1000, page=0)).runs) == 1


async def test_an_agent_never_lists_another_agents_runs(agent):
    run_id = await suspended_email_run()
    for other in ("billing-agent", "support-supervisor"):
        page = await get_agent(other).list_suspended_runs()
        assert page.total == 0 and page.runs == []
    assert [r.run_id for r in (await agent.list_suspended_runs()).runs] == [run_id]


async def test_a_completed_run_is_no_longer_listed_and_its_snapshot_is_gone(agent):
    run_id = await suspended_email_run()
    assert await snapshot_exists(run_id)
    _, chunks = await collect(agent.approve_tool_call(run_id=run_id))
    assert chunks[-1]["payload"]["finishReason"] == "stop"
    page = await agent.list_suspended_runs()
    assert page.total == 0 and page.runs == []
    assert not await snapshot_exists(run_id)
    from agentrun import get_run

    assert (await get_run(run_id)).status == "completed"

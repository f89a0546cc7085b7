"""Unpaged listings are streamed batch by batch, and read exactly like the paged answer."""

from __future__ import annotations

import json

import pytest
from rest_framework.renderers import JSONRenderer

from agentrun.core import selectors
from tests.helpers.runs import email_run

# Each test runs in a transaction rolled back at its end: nothing here needs a real commit.
pytestmark = pytest.mark.django_db

URL = "/api/agents/support-agent/suspended-runs"


@pytest.fixture
def batches_of_two(monkeypatch):
    monkeypatch.setattr(selectors, "STREAM_BATCH", 2)


def body_of(response) -> bytes:
    return b"".join(response) if response.streaming else response.content  # Django consumes it in a loop of its own


@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")
def test_an_unpaged_listing_streams_the_paged_answer_batch_by_batch(api, batches_of_two):
    for i in range(5):
        email_run(thread=f"t-{i % 2}", resource="u-1")
    paged = api.get(URL, {"perPage": 1000, "page": 0})
    assert paged.status_code == 200 and len(paged.json()["runs"]) == 5

    unpaged = api.get(URL)
    assert unpaged.status_code == 200 and unpaged.streaming  # five runs, batches of two: streamed
    assert unpaged["Content-Type"] == "application/json"
    body = body_of(unpaged)
    assert json.loads(body) == paged.json()
    assert body == JSONRenderer().render(paged.json())  # byte for byte what a plain answer would be

    by_thread = api.get(URL, {"threadId": "t-0", "perPage": "7"})  # perPage alone does not page
    assert by_thread.streaming
    expected = [r for r in paged.json()["runs"] if r["threadId"] == "t-0"]
    assert json.loads(body_of(by_thread)) == {"runs": expected, "total": 3}


@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")
def test_an_unpaged_listing_that_fits_in_one_batch_is_a_plain_answer(api, batches_of_two):
    run_id = email_run(thread="t-1")
    response = api.get(URL)
    assert not response.streaming
    assert [r["runId"] for r in response.json()["runs"]] == [run_id] and response.json()["total"] == 1
    empty = api.get(URL, {"threadId": "nobody"})
    assert empty.json() == {"runs": [], "total": 0}
    assert api.get(URL, {"perPage": "0"}).json()["error"]["code"] == "INVALID_PER_PAGE"  # checked all the same
    assert api.get(URL, {"page": "-1"}).json()["error"]["code"] == "INVALID_PAGE"
    assert api.get(URL, {"fromDate": "soon"}).json()["error"]["code"] == "INVALID_DATE"

"""A websocket frame fuzzer: hypothesis-generated frames against ``ws/agents/support-agent/`` and
``ws/runs/<id>/`` through the real ASGI application (authenticated reviewer, allowed origin).

Every frame must get either chunks (ending with a ``finish``) or one error frame whose code is a
contract 4xx code; the socket never closes, no exception escapes a consumer, no run fails with a
server error. It prints one line of figures, e.g. ``fuzz: websocket frames=600 server_errors=0``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest
from asgiref.sync import sync_to_async
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun.core.errors import HTTP_STATUS
from tests.helpers.asgi import communicator as ws
from tests.helpers.runs import ask_run, email_run
from tests.helpers.users import reviewer_token

pytestmark = pytest.mark.django_db(transaction=True)

FRAMES_PER_RUN = 600
TIMEOUT = 15

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
MESSAGES = [
    "hi",
    '/tool echo {"value": 1}',
    '/tool lookup-order {"orderId": "o-1"}',
    '/tool lookup-order {"orderId": 5}',
    '/tool send-email {"to": "a@b.c", "subject": "s", "body": "b"}',
    '/tool ask-user {"question": "Which city?"}',
    "/tool nope {}",
    "/tool echo [1, 2",
    '/tool delete-record {"table": "t", "id": "not-an-int"}',
]
# Random user text must not ask the directive model for a failure or a wait on purpose.
user_text = st.text(max_size=60).filter(lambda t: "/fail" not in t and "/sleep" not in t)
messages = (
    st.sampled_from(MESSAGES)
    | user_text
    | st.lists(st.sampled_from(MESSAGES) | user_text, max_size=3)
    | st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "robot"]), "content": user_text | json_values}
        ),
        max_size=2,
    )
    | json_values
)


def action_frames(run_ids: list[str]) -> st.SearchStrategy:
    """Frames that look like the contract's, with wrong, missing or extra fields."""
    return st.fixed_dictionaries(
        {
            "action": st.sampled_from(["stream", "stream", "approve", "decline", "resume", "Stream", "", "cancel"])
            | json_values
        },
        optional={
            "messages": messages,
            "memory": st.fixed_dictionaries(
                {},
                optional={"thread": st.text(max_size=10) | json_values, "resource": st.text(max_size=10) | json_values},
            )
            | json_values,
            "untilIdle": st.booleans()
            | st.fixed_dictionaries({"maxIdleMs": st.integers(-5, 500) | json_values})
            | json_values,
            "requireToolApproval": st.booleans() | json_values,
            "maxSteps": st.integers(-2, 1002) | json_values,
            "metadata": st.dictionaries(st.text(max_size=70), st.text(max_size=20) | json_values, max_size=18)
            | json_values,
            "runId": st.sampled_from([*run_ids, "run_nope", ""]) | json_values,
            "toolCallId": st.text(max_size=12) | json_values,
            "args": st.fixed_dictionaries(
                {"to": st.text(max_size=8) | json_values, "subject": st.text(max_size=8), "body": st.text(max_size=8)}
            )
            | json_values,
            "reason": st.text(max_size=20) | json_values,
            "resumeData": st.fixed_dictionaries({"answer": st.text(max_size=8) | json_values}) | json_values,
        },
    )


def valid_frames(run_ids: list[str]) -> st.SearchStrategy:
    """Well-formed requests (they must stream), so the fuzzing also runs between live runs."""
    memory = st.fixed_dictionaries({"thread": st.sampled_from(["fz-a", "fz-b"]), "resource": st.just("u1")})
    stream = st.fixed_dictionaries(
        {
            "action": st.just("stream"),
            "messages": st.sampled_from(MESSAGES) | st.text(min_size=1, max_size=30).filter(lambda t: "/" not in t),
        },
        optional={
            "memory": memory,
            "maxSteps": st.integers(1, 5),
            "metadata": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
            "requireToolApproval": st.booleans(),
        },
    )
    decide = st.fixed_dictionaries(
        {"action": st.sampled_from(["approve", "decline"]), "runId": st.sampled_from(run_ids)},
        optional={"reason": st.text(max_size=10)},
    )
    return stream | decide


def frames(run_ids: list[str]) -> st.SearchStrategy:
    text = st.one_of(
        valid_frames(run_ids).map(json.dumps),
        valid_frames(run_ids).map(json.dumps),
        json_values.map(json.dumps),  # any JSON, objects or not
        action_frames(run_ids).map(json.dumps),
        action_frames(run_ids).map(json.dumps).map(lambda s: s[: len(s) // 2]),  # cut short
        st.text(max_size=200),  # rarely JSON
        st.integers(60, 5_000).map(lambda d: '{"action": "stream", "messages": ' + "[" * d + '"hi"' + "]" * d + "}"),
        st.sampled_from(
            [
                "NaN",
                "[Infinity]",
                '{"action": "stream", "messages": "hi", "maxSteps": 1e400}',
                '{"action": "stream", "messages": "\\ud800"}',
                '{"action": "stream", "messages": "a\\u0000"}',
                "",
                " ",
                "{}",
                "null",
            ]
        ),
    )
    return st.tuples(
        st.sampled_from(["agents", "agents", "agents", "runs"]),
        text.map(lambda t: ("text", t)) | st.binary(max_size=200).map(lambda b: ("bytes", b)),
    )


async def _exchange(comm, kind: str, frame, figures: Counter, problems: list) -> None:
    await comm.send_input({"type": "websocket.receive", kind: frame})
    got: list[dict] = []
    try:
        while True:
            # Done after an error frame or a finish, once nothing more follows (a decision's chunks may).
            if got and got[-1]["type"] in ("error", "finish") and await comm.receive_nothing(timeout=0.02):
                break
            output = await comm.receive_output(timeout=TIMEOUT)
            if output["type"] != "websocket.send":
                raise AssertionError(f"the socket was closed: {output}")
            got.append(json.loads(output["text"]))
    except Exception as exc:  # an exception out of the consumer, a close, or silence
        problems.append((kind, repr(frame)[:200], repr(exc)[:300]))
        figures["server_errors"] += 1
        raise
    for out in got:
        if out["type"] == "error" and "error" in out:  # an error frame of the socket
            code = out["error"].get("code")
            if 400 <= HTTP_STATUS.get(code, 500) < 500:
                figures["error_frames"] += 1
            else:
                figures["server_errors"] += 1
                problems.append((kind, repr(frame)[:200], f"error frame {out}"))
        elif out["type"] == "error" or (out["type"] == "finish" and out["payload"]["finishReason"] == "error"):
            figures["server_errors"] += 1  # a run that failed on the server
            problems.append((kind, repr(frame)[:200], f"run failed: {out}"))
        else:
            figures["chunks"] += 1


async def test_fuzz_websocket_frames(report):
    token = await reviewer_token()
    run_ids = [await sync_to_async(email_run)(thread=f"fz-{i}") for i in range(4)]
    run_ids += [await sync_to_async(ask_run)(thread=f"fz-ask-{i}") for i in range(2)]
    watched = await sync_to_async(email_run)(thread="fz-watched")  # not in run_ids: nobody decides it

    agents = ws("/ws/agents/support-agent/", token)
    runs = ws(f"/ws/runs/{watched}/", token)
    assert (await agents.connect())[0] and (await runs.connect())[0]
    while (await runs.receive_json_from(timeout=10))["type"] != "finish":  # the replay
        pass
    sockets = {"agents": agents, "runs": runs}

    loop = asyncio.get_running_loop()
    figures: Counter = Counter()
    problems: list = []

    @settings(
        max_examples=FRAMES_PER_RUN,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=frames(run_ids))
    def fuzz(case) -> None:
        target, (kind, frame) = case
        figures["frames"] += 1
        figures[target] += 1
        future = asyncio.run_coroutine_threadsafe(_exchange(sockets[target], kind, frame, figures, problems), loop)
        future.result(timeout=TIMEOUT * 4)

    started = time.monotonic()
    try:
        # Hypothesis drives from a thread; the consumers run on this test's loop meanwhile.
        await asyncio.to_thread(fuzz)
    finally:
        report(
            f"fuzz: websocket frames={figures['frames']} agents={figures['agents']} runs={figures['runs']} "
            f"chunks={figures['chunks']} error_frames={figures['error_frames']} "
            f"server_errors={figures['server_errors']} seconds={time.monotonic() - started:.1f}"
        )
    assert figures["server_errors"] == 0, problems[:5]
    assert figures["frames"] >= FRAMES_PER_RUN * 0.9
    assert figures["chunks"] > 0 and figures["error_frames"] > 0, figures
    # Both sockets are still open and usable.
    await agents.send_json_to({"action": "stream", "messages": "still here"})
    out = [await agents.receive_json_from(timeout=10)]
    while out[-1]["type"] != "finish":
        out.append(await agents.receive_json_from(timeout=10))
    await runs.send_json_to({})
    assert (await runs.receive_json_from(timeout=10))["error"]["code"] == "INVALID_REQUEST"
    await agents.disconnect()
    await runs.disconnect()

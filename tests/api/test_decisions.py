"""approve / decline / resume through REST: 202 + server-side continuation, errors, races, Idempotency-Key."""

from __future__ import annotations

import hashlib
import threading

import pytest
from django.db import connection

from agentrun.core.models import Decision, IdempotencyKey, Message, Run, Snapshot, SuspendedToolCall, ToolEffect
from tests.helpers.runs import ask_run, email_run, refund_run, two_call_run, wait_rested
from tests.helpers.users import make_user, token_client

# A test runs in a transaction rolled back at its end; those marked transaction=True need real commits
# (a decision's continuation, a start or a cancel goes on in another thread, started on commit).
pytestmark = pytest.mark.django_db


def url(run_id: str, kind: str, agent: str = "support-agent") -> str:
    return f"/api/agents/{agent}/runs/{run_id}/{kind}"


def error_code(response) -> str:
    return response.json()["error"]["code"]


def open_call_ids(run_id: str) -> list[str]:
    return list(SuspendedToolCall.objects.filter(run_id=run_id, status="open").values_list("tool_call_id", flat=True))


def assert_unchanged(run_id: str, open_calls: int = 1) -> None:
    assert Run.objects.get(pk=run_id).status == "suspended"
    assert Snapshot.objects.filter(run_id=run_id).exists()
    assert len(open_call_ids(run_id)) == open_calls
    assert not Decision.objects.filter(run_id=run_id).exists()


@pytest.mark.django_db(transaction=True)
def test_approve_answers_202_and_the_run_continues_server_side(api, reviewer):
    run_id = email_run()
    [call_id] = open_call_ids(run_id)
    response = api.post(url(run_id, "approve") + "/", {"reason": "fine"}, format="json")
    assert response.status_code == 202
    assert response.json() == {"runId": run_id, "toolCallId": call_id, "decision": "approve", "status": "in_progress"}
    assert wait_rested(run_id).status == "completed"
    decision = Decision.objects.get(run_id=run_id)
    assert (decision.kind, decision.via, decision.decided_by, decision.reason) == ("approve", "api", reviewer, "fine")
    assert ToolEffect.objects.filter(tool_call_id=call_id).count() == 1
    assert not Snapshot.objects.filter(run_id=run_id).exists()


@pytest.mark.django_db(transaction=True)
def test_approve_with_edited_args_runs_the_tool_with_them(api):
    run_id = email_run()
    edited = {"to": "bob@example.com", "subject": "s", "body": "b"}
    response = api.post(url(run_id, "approve"), {"args": edited}, format="json")
    assert response.status_code == 202
    wait_rested(run_id)
    decision = Decision.objects.get(run_id=run_id)
    assert decision.edited_args == edited and decision.args["to"] == "ann@example.com"
    assert "bob@example.com" in Message.objects.filter(run_id=run_id, role="assistant").last().content


def test_approve_with_invalid_args_is_400_and_nothing_changes(api):
    run_id = email_run()
    for args in ({"to": 1}, [1, 2], "nope"):
        response = api.post(url(run_id, "approve"), {"args": args}, format="json")
        assert response.status_code == 400
        assert error_code(response) == "ARGS_INVALID"
    assert_unchanged(run_id)


@pytest.mark.django_db(transaction=True)
def test_decline_with_reason(api):
    run_id = email_run()
    response = api.post(url(run_id, "decline"), {"reason": "not this customer"}, format="json")
    assert response.status_code == 202 and response.json()["decision"] == "decline"
    assert wait_rested(run_id).status == "completed"
    assert Decision.objects.get(run_id=run_id).reason == "not this customer"
    assert not ToolEffect.objects.filter(run_id=run_id).exists()
    answer = Message.objects.filter(run_id=run_id, role="assistant").last().content
    assert answer == "send-email: denied: not this customer"


@pytest.mark.django_db(transaction=True)
def test_resume_with_valid_data(api):
    run_id = ask_run()
    response = api.post(url(run_id, "resume"), {"resumeData": {"answer": "Paris"}}, format="json")
    assert response.status_code == 202 and response.json()["decision"] == "resume"
    assert wait_rested(run_id).status == "completed"
    assert Decision.objects.get(run_id=run_id).resume_data == {"answer": "Paris"}
    assert "Paris" in Message.objects.filter(run_id=run_id, role="assistant").last().content


@pytest.mark.parametrize("body", [{"resumeData": {"answer": ""}}, {"resumeData": {}}, {"resumeData": "Paris"}])
def test_invalid_resume_data_is_400_and_the_run_is_unchanged(api, body):
    run_id = ask_run()
    response = api.post(url(run_id, "resume"), body, format="json")
    assert response.status_code == 400
    assert error_code(response) == "RESUME_DATA_INVALID"
    assert_unchanged(run_id)


def test_resume_without_resume_data_is_invalid_request(api):
    run_id = ask_run()
    response = api.post(url(run_id, "resume"), {}, format="json")
    assert (response.status_code, error_code(response)) == (400, "INVALID_REQUEST")
    assert_unchanged(run_id)


def test_wrong_decision_kind(api):
    ask, email = ask_run(), email_run()
    assert error_code(api.post(url(ask, "approve"), {}, format="json")) == "WRONG_DECISION_KIND"
    assert error_code(api.post(url(ask, "decline"), {}, format="json")) == "WRONG_DECISION_KIND"
    response = api.post(url(email, "resume"), {"resumeData": {"answer": "x"}}, format="json")
    assert (response.status_code, error_code(response)) == (400, "WRONG_DECISION_KIND")
    assert_unchanged(ask)
    assert_unchanged(email)


@pytest.mark.django_db(transaction=True)
def test_several_open_calls_need_a_tool_call_id(api):
    run_id = two_call_run()
    first, second = open_call_ids(run_id)
    response = api.post(url(run_id, "approve"), {}, format="json")
    assert (response.status_code, error_code(response)) == (400, "AMBIGUOUS_TOOL_CALL")
    assert set(response.json()["error"]["details"]["toolCallIds"]) == {first, second}
    response = api.post(url(run_id, "approve"), {"toolCallId": "call_nope"}, format="json")
    assert (response.status_code, error_code(response)) == (400, "TOOL_CALL_NOT_SUSPENDED")
    assert_unchanged(run_id, open_calls=2)

    response = api.post(url(run_id, "decline"), {"toolCallId": second}, format="json")
    assert response.status_code == 202 and response.json()["status"] == "suspended"  # one call still open
    assert wait_rested(run_id).status == "suspended"
    assert open_call_ids(run_id) == [first]
    assert api.post(url(run_id, "approve"), {"toolCallId": first}, format="json").status_code == 202
    assert wait_rested(run_id).status == "completed"


@pytest.mark.django_db(transaction=True)
def test_deciding_twice_is_409_already_decided(api):
    run_id = two_call_run()
    first, _ = open_call_ids(run_id)
    assert api.post(url(run_id, "approve"), {"toolCallId": first}, format="json").status_code == 202
    wait_rested(run_id)
    again = api.post(url(run_id, "decline"), {"toolCallId": first}, format="json")
    assert (again.status_code, error_code(again)) == (409, "TOOL_CALL_ALREADY_DECIDED")
    assert again.json()["error"]["details"]["decidedBy"] == "rita"


def test_deciding_another_agents_run_is_404(api):
    billing = refund_run()
    for kind, body in (("approve", {}), ("decline", {}), ("resume", {"resumeData": {}})):
        response = api.post(url(billing, kind, agent="support-agent"), body, format="json")
        assert (response.status_code, error_code(response)) == (404, "RUN_NOT_FOUND")
    assert_unchanged(billing)
    response = api.post(url(billing, "approve", agent="nobody"), {}, format="json")
    assert (response.status_code, error_code(response)) == (404, "AGENT_NOT_FOUND")
    response = api.post(url("run_nope", "approve"), {}, format="json")
    assert (response.status_code, error_code(response)) == (404, "RUN_NOT_FOUND")


@pytest.mark.django_db(transaction=True)
def test_a_finished_run_cannot_be_decided(api):
    run_id = email_run()
    api.post(url(run_id, "approve"), {}, format="json")
    wait_rested(run_id)
    response = api.post(url(run_id, "approve"), {}, format="json")
    assert response.status_code in (404, 409)
    assert error_code(response) in {"RUN_NOT_FOUND", "TOOL_CALL_ALREADY_DECIDED"}


def _race(clients, run_id: str, headers: dict | None = None) -> list:
    barrier = threading.Barrier(len(clients))
    responses: list = [None] * len(clients)

    def decide(i: int) -> None:
        try:
            barrier.wait()
            responses[i] = clients[i].post(url(run_id, "approve"), {}, format="json", headers=headers)
        finally:
            connection.close()  # each thread had its own connection

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return responses


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_approvals_one_wins_one_gets_409(api, reviewer):
    from django.contrib.auth.models import Group

    other = make_user("otto", group=None)
    other.groups.add(Group.objects.get(name="Reviewers"))
    run_id = email_run()
    responses = _race([token_client(reviewer), token_client(other)], run_id)
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [202, 409], [r.content for r in responses]
    loser = next(r for r in responses if r.status_code == 409)
    assert error_code(loser) in {"TOOL_CALL_ALREADY_DECIDED", "RUN_NOT_SUSPENDED"}
    wait_rested(run_id)
    assert Decision.objects.filter(run_id=run_id).count() == 1
    assert ToolEffect.objects.filter(run_id=run_id).count() == 1


@pytest.mark.django_db(transaction=True)
def test_idempotency_key_returns_the_first_answer_and_records_one_decision(api):
    run_id = email_run()
    headers = {"Idempotency-Key": "retry-123"}
    first = api.post(url(run_id, "approve"), {"reason": "ok"}, format="json", headers=headers)
    assert first.status_code == 202
    wait_rested(run_id)
    again = api.post(url(run_id, "approve") + "/", {"reason": "ok"}, format="json", headers=headers)
    assert (again.status_code, again.json()) == (202, first.json())
    assert Decision.objects.filter(run_id=run_id).count() == 1
    assert IdempotencyKey.objects.count() == 1
    # Without the key the same request is a second decision attempt, and loses.
    assert api.post(url(run_id, "approve"), {"reason": "ok"}, format="json").status_code in (404, 409)
    # The same key for another request is refused.
    other = api.post(url(run_id, "decline"), {}, format="json", headers=headers)
    assert (other.status_code, error_code(other)) == (400, "INVALID_REQUEST")


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_with_one_idempotency_key_get_the_same_answer(reviewer):
    run_id = email_run()
    responses = _race([token_client(reviewer), token_client(reviewer)], run_id, headers={"Idempotency-Key": "k"})
    assert [r.status_code for r in responses] == [202, 202], [r.content for r in responses]
    assert responses[0].json() == responses[1].json()
    wait_rested(run_id)
    assert Decision.objects.filter(run_id=run_id).count() == 1


@pytest.mark.django_db(transaction=True)
def test_idempotency_keys_are_per_user(api, reviewer):
    from django.contrib.auth.models import Group

    other = make_user("olga", group=None)
    other.groups.add(Group.objects.get(name="Reviewers"))
    run_id = two_call_run()
    first, second = open_call_ids(run_id)
    headers = {"Idempotency-Key": "same"}
    body = {"toolCallId": first, "argsFingerprint": shown_fingerprint(run_id, first)}
    assert api.post(url(run_id, "approve"), body, format="json", headers=headers).status_code == 202
    wait_rested(run_id)
    body = {"toolCallId": second, "argsFingerprint": shown_fingerprint(run_id, second)}
    response = token_client(other).post(url(run_id, "approve"), body, format="json", headers=headers)
    assert response.status_code == 202 and response.json()["toolCallId"] == second
    wait_rested(run_id)


@pytest.mark.django_db(transaction=True)
def test_viewers_cannot_decide(viewer_api):
    run_id = email_run()
    response = viewer_api.post(url(run_id, "approve"), {}, format="json")
    assert (response.status_code, error_code(response)) == (403, "PERMISSION_DENIED")
    assert_unchanged(run_id)


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"{not json", "application/json"),
        (b"[1, 2]", "application/json"),
        (b'{"toolCallId": 5}', "application/json"),
        (b'{"reason": ["x"]}', "application/json"),
        (b"\xff\xfe", "application/json"),
        (b"a=b", "application/x-www-form-urlencoded"),
        (b'{"reason": "a\\u0000b"}', "application/json"),
        (b'{"reason": "\\ud800"}', "application/json"),
    ],
)
def test_malformed_bodies_are_400_never_500(api, body, content_type):
    run_id = email_run()
    response = api.generic("POST", url(run_id, "approve"), body, content_type=content_type)
    assert (response.status_code, error_code(response)) == (400, "INVALID_REQUEST"), response.content
    assert_unchanged(run_id)


# --- docs/api.md#argsfingerprint, docs/api.md#batch-decisions -------------------------------------
def listed_call(api, run_id: str, agent: str = "support-agent") -> dict:
    [run] = [r for r in api.get(f"/api/agents/{agent}/suspended-runs").json()["runs"] if r["runId"] == run_id]
    return run["toolCalls"][0]


@pytest.mark.django_db(transaction=True)
def test_a_decision_bound_to_the_args_the_reviewer_saw_goes_through(api):
    run_id = email_run()
    call = listed_call(api, run_id)
    response = api.post(url(run_id, "approve"), {"argsFingerprint": call["argsFingerprint"]}, format="json")
    assert response.status_code == 202
    assert wait_rested(run_id).status == "completed"


@pytest.mark.parametrize("kind", ["approve", "decline"])
def test_a_decision_bound_to_other_args_is_409_args_changed_and_nothing_changes(api, kind):
    run_id = email_run()
    call = listed_call(api, run_id)
    stale = hashlib.sha256(b'{"to":"someone-else@example.com"}').hexdigest()
    response = api.post(url(run_id, kind), {"argsFingerprint": stale}, format="json")
    assert response.status_code == 409 and error_code(response) == "ARGS_CHANGED"
    assert response.json()["error"]["details"]["argsFingerprint"] == call["argsFingerprint"]
    assert_unchanged(run_id)
    assert not ToolEffect.objects.filter(run_id=run_id).exists()


@pytest.mark.django_db(transaction=True)
def test_a_batch_decides_several_calls_of_a_run_in_one_go(api):
    run_id = two_call_run()
    email_id, delete_id = open_call_ids_in_order(run_id)
    body = {
        "decisions": [
            {"toolCallId": email_id, "decision": "approve"},
            {"toolCallId": delete_id, "decision": "decline", "reason": "keep the record"},
        ]
    }
    response = api.post(url(run_id, "decisions"), body, format="json", HTTP_IDEMPOTENCY_KEY="batch-1")
    assert response.status_code == 202
    assert response.json() == {
        "runId": run_id,
        "decisions": [
            {"toolCallId": email_id, "decision": "approve"},
            {"toolCallId": delete_id, "decision": "decline"},
        ],
        "status": "in_progress",
    }
    assert wait_rested(run_id).status == "completed"
    assert sorted(Decision.objects.filter(run_id=run_id).values_list("kind", flat=True)) == ["approve", "decline"]
    assert ToolEffect.objects.filter(run_id=run_id).count() == 1
    # Retried with the same key: the first answer, nothing decided twice.
    again = api.post(url(run_id, "decisions"), body, format="json", HTTP_IDEMPOTENCY_KEY="batch-1")
    assert again.status_code == 202 and again.json() == response.json()
    assert Decision.objects.filter(run_id=run_id).count() == 2


@pytest.mark.parametrize(
    ("second", "status", "code"),
    [
        ({"decision": "resume", "resumeData": {}}, 400, "WRONG_DECISION_KIND"),
        ({"decision": "approve", "args": {"table": 5}}, 400, "ARGS_INVALID"),
        ({"decision": "approve", "argsFingerprint": "0" * 64}, 409, "ARGS_CHANGED"),
        ({"decision": "maybe"}, 400, "INVALID_REQUEST"),
    ],
)
def test_a_batch_with_one_bad_decision_records_none_and_names_it(api, second, status, code):
    run_id = two_call_run()
    email_id, delete_id = open_call_ids_in_order(run_id)
    body = {"decisions": [{"toolCallId": email_id, "decision": "approve"}, {"toolCallId": delete_id, **second}]}
    response = api.post(url(run_id, "decisions"), body, format="json")
    assert response.status_code == status and error_code(response) == code
    assert response.json()["error"]["details"]["index"] == 1
    assert_unchanged(run_id, open_calls=2)


@pytest.mark.parametrize(
    "body",
    [{}, {"decisions": []}, {"decisions": "approve"}, {"decisions": [{"decision": "approve"}]}],
)
def test_a_malformed_batch_is_400(api, body):
    run_id = two_call_run()
    response = api.post(url(run_id, "decisions"), body, format="json")
    assert response.status_code == 400 and error_code(response) == "INVALID_REQUEST"
    assert_unchanged(run_id, open_calls=2)


def shown_fingerprint(run_id: str, tool_call_id: str) -> str:
    """The ``argsFingerprint`` a client reads in the listing for this call (what it shows)."""
    from agentrun.engine.decisions import shown_fingerprint as of_call

    return of_call(SuspendedToolCall.objects.get(run_id=run_id, tool_call_id=tool_call_id))


def open_call_ids_in_order(run_id: str) -> list[str]:
    return list(
        SuspendedToolCall.objects.filter(run_id=run_id, status="open")
        .order_by("position")
        .values_list("tool_call_id", flat=True)
    )

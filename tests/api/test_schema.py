"""OpenAPI: the schema and its page are served (no CDN), and a property-based run of schemathesis
against every operation finds no 5xx and no response that contradicts the schema."""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
CONTRACT_PATHS = {
    ("/api/agents/", "get"),
    ("/api/agents/{agentId}/stream", "post"),
    ("/api/agents/{agentId}/generate", "post"),
    ("/api/agents/{agentId}/suspended-runs", "get"),
    ("/api/suspended-runs", "get"),
    ("/api/agents/{agentId}/runs/{runId}/approve", "post"),
    ("/api/agents/{agentId}/runs/{runId}/decline", "post"),
    ("/api/agents/{agentId}/runs/{runId}/resume", "post"),
    ("/api/runs/{runId}", "get"),
    ("/api/runs/{runId}/steps", "get"),
    ("/api/runs/{runId}/steps/{stepId}", "get"),
    ("/api/agents/{agentId}/runs/{runId}/decisions", "post"),
    ("/api/runs/{runId}/stream", "get"),
    ("/api/runs/{runId}/cancel", "post"),
    ("/api/threads/{threadId}/messages", "get"),
    ("/api/decisions", "get"),
    ("/api/background-tasks", "get"),
    ("/api/background-tasks/{taskId}/cancel", "post"),
    ("/api/webhook-endpoints/", "get"),
    ("/api/webhook-endpoints/", "post"),
    ("/api/webhook-endpoints/{id}", "get"),
    ("/api/webhook-endpoints/{id}", "patch"),
    ("/api/webhook-endpoints/{id}", "delete"),
    ("/api/webhook-endpoints/{id}/deliveries", "get"),
    ("/api/slack-destinations/", "get"),
    ("/api/slack-destinations/", "post"),
    ("/api/slack-destinations/{id}", "get"),
    ("/api/slack-destinations/{id}", "patch"),
    ("/api/slack-destinations/{id}", "delete"),
    ("/api/slack-destinations/{id}/deliveries", "get"),
}


def test_the_schema_documents_every_endpoint_of_the_contract(client):
    for path in ("/api/schema/", "/api/schema"):
        response = client.get(path, HTTP_ACCEPT="application/vnd.oai.openapi+json")
        assert response.status_code == 200
    schema = response.json()
    operations = {(path, method) for path, item in schema["paths"].items() for method in item}
    assert operations == CONTRACT_PATHS
    listing = schema["paths"]["/api/agents/{agentId}/suspended-runs"]["get"]
    assert {p["name"] for p in listing["parameters"]} >= {
        "threadId",
        "resourceId",
        "fromDate",
        "toDate",
        "perPage",
        "page",
    }
    across = schema["paths"]["/api/suspended-runs"]["get"]
    assert {p["name"] for p in across["parameters"]} == {p["name"] for p in listing["parameters"]} | {"agentId"}
    assert across["responses"]["200"] == listing["responses"]["200"]
    approve = schema["paths"]["/api/agents/{agentId}/runs/{runId}/approve"]["post"]
    assert {"202", "400", "401", "403", "404", "409", "413"} <= set(approve["responses"])
    assert "text/event-stream" in approve["responses"]["200"]["content"]
    assert {"tokenAuth", "cookieAuth"} <= set(schema["components"]["securitySchemes"])


def test_the_schema_generates_without_warnings_so_the_deploy_check_passes():
    """scripts/production.sh runs `check --deploy --fail-level WARNING`: every choice set has one name."""
    from drf_spectacular.checks import schema_check

    problems = schema_check(None)
    assert problems == [], [p.msg for p in problems]
    schema = SchemaGenerator().get_schema(request=None, public=True)
    enums = schema["components"]["schemas"]
    assert enums["RunObjectEnum"]["enum"] == ["thread.run"]
    assert enums["EventTypeEnum"]["enum"][0] == "run.suspended"
    assert not [name for name in enums if name.startswith(("Object", "Type", "Events")) and name.endswith("Enum")]


def test_the_docs_page_is_served_without_a_cdn(client):
    for path in ("/api/docs/", "/api/docs"):
        response = client.get(path)
        assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html and "/static/drf_spectacular_sidecar/" in html
    assert "cdn" not in html.lower() and "unpkg" not in html.lower()


@pytest.mark.django_db
@pytest.mark.parametrize("credentials", ["Token not-a-key", "Bearer not-a-key"])
def test_a_bad_token_gets_the_same_401_from_the_schema_as_from_every_endpoint(client, credentials, auth_header):
    expected = client.get("/api/agents/", HTTP_AUTHORIZATION=credentials)
    assert expected.status_code == 401 and expected.json()["error"]["code"] == "NOT_AUTHENTICATED"
    for path in ("/api/schema/", "/api/schema", "/api/docs/", "/api/docs"):
        response = client.get(path, HTTP_AUTHORIZATION=credentials)
        assert response.status_code == 401, path
        assert response.json() == expected.json(), path  # the contract's envelope, as JSON even for the page
        assert response["WWW-Authenticate"] == expected["WWW-Authenticate"], path
    # The schema stays public: anonymous readers and good tokens get it.
    assert client.get("/api/schema/").status_code == 200
    assert client.get("/api/schema/", HTTP_AUTHORIZATION=auth_header["Authorization"]).status_code == 200


@pytest.fixture
def keep_test_connection():
    """Like Django's test client: the test's DB connection must survive each request's start and end."""
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


# Loaded through the WSGI application itself (the schema view needs no database).
schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())


@pytest.fixture
def api_schema(keep_test_connection):
    return schema


@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_fuzz_the_api_against_its_schema(case, auth_header, keep_test_connection):
    response = case.call(headers=auth_header)
    FUZZ_FIGURES["inputs"] += 1
    FUZZ_FIGURES["server_errors"] += response.status_code >= 500
    FUZZ_OPERATIONS.add(case.operation.label)
    case.validate_response(response, checks=CHECKS, headers=auth_header)


FUZZ_FIGURES: Counter = Counter()
FUZZ_OPERATIONS: set[str] = set()


@pytest.fixture(scope="module", autouse=True)
def _print_fuzz_figures(request):
    """One line of figures for CI logs, past pytest's capture so it shows under ``-q`` too."""
    yield
    if FUZZ_FIGURES["inputs"]:
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print(
                f"\nfuzz: schemathesis operations={len(FUZZ_OPERATIONS)} inputs={FUZZ_FIGURES['inputs']} "
                f"server_errors={FUZZ_FIGURES['server_errors']}",
                flush=True,
            )


@pytest.mark.django_db
def test_fuzzing_also_sees_real_objects(api_schema, auth_header):
    """The same checks on responses about real objects (fuzzed ids rarely exist)."""
    from django.utils import timezone

    from agentrun.core.models import Decision, Run, RunStep, Thread

    thread = Thread.objects.create(id="t-fuzz")
    run = Run.objects.create(agent_id="support-agent", thread=thread, status="completed", completed_at=timezone.now())
    step = RunStep.objects.create(
        run=run,
        agent_id="support-agent",
        thread_id=thread.id,
        type="message_creation",
        status="completed",
        step_details={"type": "message_creation", "messageCreation": {"messageId": "msg_x"}},
    )
    Decision.objects.create(
        run=run,
        agent_id="support-agent",
        thread_id=thread.id,
        tool_call_id="call_x",
        tool_name="send-email",
        kind="approve",
        via="api",
        args={"to": "a"},
    )
    checked = 0
    for template, method, params in [
        ("/api/runs/{runId}", "GET", {"runId": run.id}),
        ("/api/runs/{runId}/steps", "GET", {"runId": run.id}),
        ("/api/runs/{runId}/steps/{stepId}", "GET", {"runId": run.id, "stepId": step.id}),
        ("/api/decisions", "GET", {}),
        ("/api/agents/", "GET", {}),
        ("/api/agents/{agentId}/suspended-runs", "GET", {"agentId": "support-agent"}),
        ("/api/suspended-runs", "GET", {}),
        ("/api/runs/{runId}/cancel", "POST", {"runId": run.id}),  # a finished run: 409
        ("/api/background-tasks", "GET", {}),
    ]:
        case = api_schema[template][method].Case(path_parameters=params)
        response = case.call_and_validate(headers=auth_header, checks=CHECKS)
        assert response.status_code in (200, 409)
        checked += 1
    assert checked == 9

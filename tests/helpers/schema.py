"""The OpenAPI schema schemathesis fuzzes (loaded through the WSGI application itself: the schema view
needs no database), and the checks every response must pass. The fixture ``keep_test_connection``
(tests/helpers/wsgi.py) keeps the test's database connection across the requests."""

from __future__ import annotations

import schemathesis
from django.core.wsgi import get_wsgi_application
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

schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())

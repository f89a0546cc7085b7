"""Requests through the WSGI application in the test's own thread."""

from __future__ import annotations

import pytest
from django.core.signals import request_finished, request_started
from django.db import close_old_connections


@pytest.fixture
def keep_test_connection():
    """Like Django's test client: the test's DB connection must survive each request's start and end."""
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)

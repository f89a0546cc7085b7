"""The notification tests start and end with a fresh view of subscribers and no notification job
running (tests/helpers/notifications.py)."""

import pytest


@pytest.fixture(autouse=True)
def _clean_notifier(clean_notifier):
    yield

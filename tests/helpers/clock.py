"""Moving the clock instead of waiting out a time (a time to live, a grace period).

``clock.advance(seconds)`` moves ``django.utils.timezone.now`` forward for every thread of the test
process (the engine's sync thread too); the real clock goes on underneath. Put back after the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.utils import timezone


class Clock:
    def __init__(self) -> None:
        self.offset = timedelta(0)
        self._real = timezone.now

    def now(self) -> datetime:
        return self._real() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    moved = Clock()
    monkeypatch.setattr(timezone, "now", moved.now)
    yield moved

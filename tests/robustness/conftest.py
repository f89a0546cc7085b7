"""Fixtures of the robustness tests: no embedded sweeper, and a line of figures past pytest's capture."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest


@pytest.fixture(autouse=True)
def _no_embedded_sweeper(settings):
    # The ASGI app would start a sweeper on each test's event loop; these tests need none.
    settings.AGENTRUN_EMBEDDED_SWEEPER = False


@pytest.fixture
def report(capsys) -> Callable[[str], None]:
    """Prints a line of figures past pytest's capture, so CI logs show it even under ``-q``."""

    def write(line: str) -> None:
        with capsys.disabled():
            sys.stdout.write(f"\n{line}\n")
            sys.stdout.flush()

    return write

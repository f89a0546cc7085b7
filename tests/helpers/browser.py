"""What the browser tests (tests/e2e) share: where their files go, the reviewers' password, engine
code run beside Playwright's sync API, and the pages' landmarks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
SCREENSHOTS = ARTIFACTS / "screenshots"
E2E_DIR = ROOT / "var" / "e2e"
PASSWORD = "correct-horse-e2e"
SLACK_SIGNING_SECRET = "e2e-slack-signing-secret"  # the e2e server's; tests/e2e/test_slack.py signs with it


def e2e_selected(config: pytest.Config) -> bool:
    """This pytest run is the browser tests' own (``-m e2e`` or only tests/e2e paths)."""
    expr = (config.getoption("markexpr", "") or "").replace(" ", "")
    if expr:
        return "e2e" in expr and "note2e" not in expr
    args = [str(a).replace(os.sep, "/") for a in config.args]
    return bool(args) and all("tests/e2e" in a for a in args)


def run_python_api(coro_factory: Callable[[], Any]) -> Any:
    """Run engine code in its own thread and loop: Playwright's sync API holds this thread's loop."""

    def in_thread() -> Any:
        from django.db import connections

        try:
            return asyncio.run(coro_factory())
        finally:
            connections.close_all()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(in_thread).result(timeout=60)


EMAIL = {"to": "ann@example.com", "subject": "Your order", "body": "It shipped."}
DESKTOP, PHONE = {"width": 1280, "height": 900}, {"width": 375, "height": 800}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_live(page: Any) -> None:
    """The page's websocket to ws/approvals/ is open (the header's dot turns green)."""
    from playwright.sync_api import expect

    expect(page.locator('body[data-live="on"]')).to_have_count(1)


def call_card(page: Any, tool_call_id: str) -> Any:
    return page.locator(f'.call[data-tool-call-id="{tool_call_id}"]')


def start_run(agent_id: str, message: str, *, thread: str, resource: str = "cust-42") -> str:
    """Start a run through the Python API and read it to its end (finished or suspended): its id."""
    from agentrun import get_agent

    async def go() -> str:
        stream = await get_agent(agent_id).stream(message, memory={"thread": thread, "resource": resource})
        await stream.collect()
        return stream.run_id

    return run_python_api(go)


def screenshot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)

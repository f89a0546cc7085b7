"""A local stand-in for Slack (docs/slack.md): its Web API (``chat.postMessage``, ``chat.update``,
``views.open``) and its ``response_url`` hooks, on 127.0.0.1, so the tests reach no outside host.

Requests are signed and payloads validated with the official ``slack_sdk``: ``SignatureVerifier`` signs
what "Slack" sends agentrun, and every message, update and modal agentrun sends is parsed with
``slack_sdk.models`` (an invalid Block Kit payload fails the test that caused it).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlencode

from django.test import Client
from slack_sdk.models.blocks import Block
from slack_sdk.models.views import View
from slack_sdk.signature import SignatureVerifier

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TEAM = "T0AGENTRUN"
CHANNEL_ID = "C0REVIEWS"


@dataclass
class Call:
    method: str  # "chat.postMessage", "chat.update", "views.open", or "hook" (a response_url)
    body: dict
    token: str | None
    path: str


@dataclass
class FakeSlack:
    base: str = ""  # AGENTRUN_SLACK_API_URL
    calls: list[Call] = field(default_factory=list)
    errors: dict[str, list[str]] = field(default_factory=dict)  # method → Slack error codes to answer, in turn
    statuses: list[int] = field(default_factory=list)  # HTTP statuses to answer first (then 200)
    hold_posts: threading.Event | None = None  # set: chat.postMessage answers only once it is released
    holding: int = 0
    _ts: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    # Generous: the work is queued, and the machine may be shared (waits end as soon as it is done).
    def wait_for(self, method: str, count: int = 1, timeout: float = 30.0) -> list[Call]:
        deadline = time.monotonic() + timeout
        while len(self.of(method)) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"Slack got {len(self.of(method))} {method} calls, not {count}: {self.calls}")
            time.sleep(0.02)
        return self.of(method)

    def wait_until(self, predicate: Callable[[], Any], timeout: float = 30.0, what: str = "it") -> Any:
        deadline = time.monotonic() + timeout
        while not (value := predicate()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {self.calls}")
            time.sleep(0.02)
        return value

    def response_url(self) -> str:
        return f"{self.base.rsplit('/api', 1)[0]}/hooks/{uuid.uuid4().hex}"

    def answer(self, method: str, body: dict) -> tuple[int, dict | str]:
        with self.lock:
            if self.statuses:
                return self.statuses.pop(0), {"ok": False, "error": "ratelimited"}
            queued = self.errors.get(method) or []
            if queued:
                return 200, {"ok": False, "error": queued.pop(0)}
        if method == "hook":
            return 200, "ok"
        if method == "chat.postMessage":
            return 200, {"ok": True, "channel": CHANNEL_ID, "ts": f"1700000000.{next(self._ts):06d}"}
        if method == "chat.update":
            return 200, {"ok": True, "channel": body.get("channel"), "ts": body.get("ts")}
        if method == "views.open":
            return 200, {"ok": True, "view": {"id": "V0001"}}
        return 200, {"ok": False, "error": "unknown_method"}


def validate(body: dict) -> None:
    """What a Slack client library accepts: every block (and a modal) parses and validates."""
    for raw in body.get("blocks") or []:
        block = Block.parse(raw)
        assert block is not None, raw
        block.validate_json()
    if "view" in body:
        View(**body["view"]).validate_json()


def serve() -> tuple[FakeSlack, Callable[[], None]]:
    state = FakeSlack()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            body = json.loads(raw or b"{}")
            method = "hook" if self.path.startswith("/hooks/") else self.path.rsplit("/", 1)[-1]
            auth = self.headers.get("Authorization") or ""
            validate(body)
            if method == "chat.postMessage" and state.hold_posts is not None:
                state.holding += 1
                state.hold_posts.wait(30)
            state.calls.append(Call(method, body, auth.removeprefix("Bearer ") or None, self.path))
            status, answer = state.answer(method, body)
            data = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(answer, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.base = f"http://127.0.0.1:{server.server_port}/api"
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return state, stop


def settle(timeout: float = 15.0) -> None:
    """Wait until no run is being carried on and the notifications queue is empty: the messages and
    updates a test set going were sent (to this stand-in, before it stops)."""
    from django.utils import timezone

    from agentrun.core.models import Run
    from tests.helpers.waiting import wait_for_tasks

    deadline = time.monotonic() + timeout
    while Run.objects.filter(lease_owner__isnull=False, lease_expires_at__gt=timezone.now()).exists():
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    wait_for_tasks()


# --- what Slack sends agentrun ------------------------------------------------------------------------
def signed_headers(body: bytes, *, secret: str = SIGNING_SECRET, timestamp: int | None = None) -> dict[str, str]:
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    signature = SignatureVerifier(secret).generate_signature(timestamp=stamp, body=body)
    return {"HTTP_X_SLACK_REQUEST_TIMESTAMP": stamp, "HTTP_X_SLACK_SIGNATURE": signature or ""}


def send(path: str, form: dict[str, str], **signing: Any) -> Any:
    """POST a form as Slack does (urlencoded, signed); the Django test client's response."""
    body = urlencode(form).encode()
    headers = signing.pop("headers", None) or signed_headers(body, **signing)
    return Client().post(path, body, content_type="application/x-www-form-urlencoded", **headers)


def user(slack_user_id: str, team: str = TEAM) -> dict:
    return {"id": slack_user_id, "username": slack_user_id.lower(), "team_id": team}


def click(value: str, action_id: str, slack_user_id: str, *, response_url: str, team: str = TEAM) -> dict:
    """A ``block_actions`` payload: a button of a message clicked."""
    return {
        "type": "block_actions",
        "team": {"id": team, "domain": "acme"},
        "user": user(slack_user_id, team),
        "api_app_id": "A0AGENTRUN",
        "trigger_id": f"trig.{uuid.uuid4().hex}",
        "response_url": response_url,
        "container": {"type": "message", "channel_id": CHANNEL_ID, "message_ts": "1700000000.000001"},
        "channel": {"id": CHANNEL_ID, "name": "reviews"},
        "actions": [{"type": "button", "action_id": action_id, "block_id": "agentrun_decide", "value": value}],
    }


def submission(view: dict, slack_user_id: str, *, reason: str | None = None, team: str = TEAM) -> dict:
    """A ``view_submission`` payload: the modal ``view`` (as agentrun opened it) submitted."""
    values = {"reason": {"reason_input": {"type": "plain_text_input", "value": reason}}} if reason is not None else {}
    return {
        "type": "view_submission",
        "team": {"id": team, "domain": "acme"},
        "user": user(slack_user_id, team),
        "view": {**view, "id": "V0001", "state": {"values": values}},
    }


def interact(payload: dict, **signing: Any) -> Any:
    return send("/integrations/slack/actions", {"payload": json.dumps(payload)}, **signing)


def command(text: str, slack_user_id: str, *, team: str = TEAM, response_url: str = "") -> Any:
    return send(
        "/integrations/slack/commands",
        {
            "command": "/agentrun",
            "text": text,
            "team_id": team,
            "user_id": slack_user_id,
            "response_url": response_url,
            "trigger_id": "t",
        },
    )

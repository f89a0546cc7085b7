"""The real ASGI application (``agentrun.asgi.application``) driven in process: HTTP, websockets, SSE.

``AsgiClient`` is a minimal HTTP client over it.
Django's AsyncClient skips the ASGI handler (no per-request thread-sensitive context, no streaming to a
socket, no disconnects); this one speaks ASGI messages, so event streams arrive as they are sent
and a test can hang up mid-stream like a browser does.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote, urlsplit

from asgiref.testing import ApplicationCommunicator
from channels.testing import WebsocketCommunicator

ORIGIN = [(b"origin", b"http://localhost")]


class AsgiResponse:
    def __init__(self, communicator: ApplicationCommunicator, status: int, headers: dict[str, str]) -> None:
        self.communicator = communicator
        self.status_code = status
        self.headers = headers
        self._done = False

    def __getitem__(self, name: str) -> str:
        return self.headers[name.lower()]

    async def parts(self, timeout: float = 10) -> AsyncIterator[bytes]:
        while not self._done:
            message = await self.communicator.receive_output(timeout)
            if message["type"] != "http.response.body":
                continue
            self._done = not message.get("more_body", False)
            if message.get("body"):
                yield message["body"]

    async def read(self) -> bytes:
        return b"".join([part async for part in self.parts()])

    async def json(self) -> Any:
        return json.loads(await self.read())

    async def hang_up(self) -> None:
        await self.communicator.send_input({"type": "http.disconnect"})
        # The app may end by cancellation: fine for a client that left.
        with contextlib.suppress(Exception):
            await self.communicator.wait(timeout=5)


class AsgiClient:
    def __init__(self, headers: dict[str, str] | None = None) -> None:
        from agentrun.asgi import application

        self.app = application
        self.headers = headers or {}

    async def request(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        raw_body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> AsgiResponse:
        parts = urlsplit(url)
        body = raw_body if raw_body is not None else b"" if json_body is None else json.dumps(json_body).encode()
        all_headers = {"host": "localhost", **self.headers, **(headers or {})}
        if json_body is not None:
            all_headers |= {"content-type": "application/json", "content-length": str(len(body))}
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            # As daphne and uvicorn do: the decoded path, and the path as sent.
            "path": unquote(parts.path),
            "raw_path": parts.path.encode(),
            "query_string": parts.query.encode(),
            "root_path": "",
            "client": ("127.0.0.1", 50000),
            "server": ("localhost", 80),
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in all_headers.items()],
        }
        communicator = ApplicationCommunicator(self.app, scope)
        await communicator.send_input({"type": "http.request", "body": body, "more_body": False})
        start = await communicator.receive_output(timeout=10)
        assert start["type"] == "http.response.start", start
        headers_out = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in start["headers"]}
        return AsgiResponse(communicator, start["status"], headers_out)

    async def get(self, url: str, **kwargs: Any) -> AsgiResponse:
        return await self.request("GET", url, **kwargs)

    async def post(self, url: str, body: Any = None, **kwargs: Any) -> AsgiResponse:
        return await self.request("POST", url, json_body=body if body is not None else {}, **kwargs)


def communicator(path: str, token: str) -> WebsocketCommunicator:
    """A websocket to ``path`` of the application, signed in with ``token``, from an allowed origin."""
    from agentrun.asgi import application

    sep = "&" if "?" in path else "?"
    return WebsocketCommunicator(application, f"{path}{sep}token={token}", headers=ORIGIN)


async def receive_until(comm: WebsocketCommunicator, predicate: Any, timeout: float = 10) -> list[dict]:
    """The frames received until (and with) the first one ``predicate`` accepts."""
    frames = []
    while True:
        frame = await comm.receive_json_from(timeout=timeout)
        frames.append(frame)
        if predicate(frame):
            return frames


def parse(raw: bytes) -> list[dict]:
    """SSE frames → [{id?, event, data}]."""
    events = []
    for frame in raw.decode().split("\n\n"):
        if not frame.strip():
            continue
        event: dict = {}
        for line in frame.split("\n"):
            name, _, value = line.partition(": ")
            event[name] = value
        events.append(event)
    return events

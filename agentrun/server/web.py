"""agentrun's web server: daphne, with the websocket answers docs/api.md#websockets documents.

    python -m agentrun.server.web -b 0.0.0.0 -p 8000 agentrun.asgi:application   (any daphne option)

What it changes in daphne (4.x, autobahn underneath):

- **A frame over 1 MiB** (bodies and frames are at most 1 MiB: docs/api.md#conventions). Daphne's own limit
  (``--websocket-max-message-size``, 1 MiB) is checked by autobahn as soon as a frame's header
  announces its length, before its payload is read, and autobahn then drops the TCP connection.
  Here the client gets the error frame ``PAYLOAD_TOO_LARGE`` and a clean close **1009**
  (message too big) instead; the rest of the oversized message is read and discarded, never buffered.
- **Close codes of the 1xxx range** a server may send (1009, 1011): autobahn's ``sendClose`` only
  takes 1000 and 3000–4999, so a consumer's ``close(code=1009)`` raised inside daphne; they are sent
  as they are here, and a close's ``reason`` (which daphne drops) is sent too.
- **Backpressure**: daphne's ASGI ``send`` never waited; a slow client's frames piled up in the
  server's write buffer, and the final close could not be flushed within autobahn's one-second
  closing handshake, so the connection was aborted mid-stream. Here a websocket ``send`` waits while
  the connection's write buffer is full (Twisted pauses the connection as a producer above 64 KiB), so
  a consumer feels a slow client (the kernel's send buffer is bounded, ``SEND_BUFFER_BYTES``, so that it
  does within a few thousand chunks; ``ws/runs`` then closes it with 4008 once it is too far behind, see
  ``agentrun.core.fanout.SubscriberBehind``; the extension's ``client_full`` tells it whether the client
  or this busy process is the one that waits), and the closing handshake waits up to
  ``CLOSE_HANDSHAKE_SECONDS`` for the client to read what was sent before the close frame.
- **Frames made once** (``agentrun.ws.frames``): a websocket's scope announces the extension, and a
  message of that type carries whole text frames that are written to the connection as they are, so
  a chunk is encoded and framed once per process, not once per socket; per-message compression is
  off (it would make each socket's bytes differ).
- **The access log** never shows a secret that travels in a URL: signed decision links, password reset
  tokens and ``?token=`` are ``[redacted]`` (``redact``).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import gc
import json
import logging
import os
import re
import signal
import socket
import sys
import termios
import threading
import time
from typing import Any

from autobahn.websocket.protocol import WebSocketProtocol as AutobahnProtocol
from daphne.access import AccessLogGenerator
from daphne.cli import CommandLineInterface
from daphne.server import Server as DaphneServer
from daphne.server import reactor
from daphne.ws_protocol import WebSocketProtocol as DaphneWebSocketProtocol
from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

from agentrun.ws.frames import CLIENT_FULL, FRAMES

logger = logging.getLogger("agentrun.server")

GOING_AWAY = 1001
MESSAGE_TOO_BIG = 1009
EXIT_GRACE_SECONDS = 2.0
# How long a closing socket waits for its client to read the frames sent before the close frame
# (autobahn's default is 1 s: a slow reader's last frames and the close itself were lost).
CLOSE_HANDSHAKE_SECONDS = 30
# A websocket's kernel send buffer (Linux doubles it): with Twisted's 64 KiB, about 3,000 chunks.
SEND_BUFFER_BYTES = 128 * 1024
# A client has stopped reading when this much of what it was sent waits in the kernel for it: its own
# receive buffer is full then (a client that reads keeps this near zero, however busy the server is).
CLIENT_FULL_BYTES = SEND_BUFFER_BYTES
TOO_LARGE_FRAME = json.dumps(
    {"type": "error", "error": {"code": "PAYLOAD_TOO_LARGE", "message": "A frame is at most 1 MiB."}}
).encode()


@implementer(IPushProducer)
class WriteFlow:
    """Registered with a connection's transport, which pauses it while its write buffer is full."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.ready.set()

    def pauseProducing(self) -> None:  # noqa: N802 - Twisted's interface
        self.ready.clear()

    def resumeProducing(self) -> None:  # noqa: N802
        self.ready.set()

    def stopProducing(self) -> None:  # noqa: N802 - the connection is gone: never wait again
        self.ready.set()


class WebSocketProtocol(DaphneWebSocketProtocol):
    flow: WriteFlow | None = None

    def onOpen(self) -> None:  # noqa: N802 - autobahn's callback
        super().onOpen()
        # A bounded kernel send buffer (autotuning can take megabytes): a client that reads slowly is
        # felt as backpressure within a few thousand chunks, not after the whole run went into the kernel.
        with contextlib.suppress(Exception):
            self.transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        self.flow = WriteFlow()
        # The HTTP channel that upgraded the connection was its producer until now.
        with contextlib.suppress(Exception):
            self.transport.unregisterProducer()
        self.transport.registerProducer(self.flow, True)

    def client_full(self) -> bool:
        """The client does not read what it is sent: ``CLIENT_FULL_BYTES`` of it wait in the kernel's
        send queue (``TIOCOUTQ``: sent but not acknowledged, that is not taken into the client's
        receive buffer). What our write buffer holds does not count: a busy server holds it too."""
        queued = array.array("i", [0])
        try:
            fcntl.ioctl(self.transport.fileno(), termios.TIOCOUTQ, queued)
        except (OSError, AttributeError, ValueError):  # closed, or not a socket: not the client's lag
            return False
        return queued[0] >= CLIENT_FULL_BYTES

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:  # noqa: N803
        if self.flow is not None:
            self.flow.ready.set()
        super().onClose(wasClean, code, reason)

    def handle_reply(self, message: dict) -> None:
        if message.get("type") == FRAMES:
            # Whole text frames, made once for every socket (agentrun.ws.frames): written as they are.
            if self.state == self.STATE_CONNECTING:
                self.serverAccept()
            if self.state == self.STATE_OPEN:
                self.transport.write(message["frames"])
            return
        if message.get("type") == "websocket.close" and self.state != self.STATE_CONNECTING:
            self.serverClose(code=message.get("code"), reason=message.get("reason"))
        else:
            super().handle_reply(message)

    def _max_message_size_exceeded(self, msg_size: int, max_msg_size: int, reason: str) -> None:
        # autobahn would drop the connection (failByDrop). failedByMe makes it discard the rest of the
        # message while the closing handshake completes.
        self.failedByMe = True
        if self.state == AutobahnProtocol.STATE_OPEN:
            self.sendMessage(TOO_LARGE_FRAME, isBinary=False)
            self.sendCloseFrame(code=MESSAGE_TOO_BIG, reasonUtf8=b"frame over 1 MiB", isReply=False)

    def serverClose(self, code: int | None = None, reason: str | None = None) -> None:
        code = 1000 if code is None else code
        if 1000 < code < 3000:  # sendClose refuses the 1xxx codes a server may send
            self.sendCloseFrame(code=code, reasonUtf8=(reason or "").encode()[:123] or None, isReply=False)
        else:
            self.sendClose(code=code, reason=reason or None)


# Secrets that travel in URLs: a signed decision link's token, a password reset token, ``?token=`` (an
# API token, as websocket clients may send it) and the like. The access log keeps the rest of the line.
_SECRET_PATHS = [
    (re.compile(r"^(/approvals/links/)[^/?]+"), r"\1[redacted]"),
    (re.compile(r"^(/accounts/reset/[^/]+/)[^/?]+"), r"\1[redacted]"),
]
_SECRET_PARAMS = re.compile(r"(?i)([?&](?:token|key|access_token|api_key)=)[^&#]*")


def redact(path: str) -> str:
    """``path`` as the access log may show it (docs/security.md, "Access logs")."""
    for pattern, replacement in _SECRET_PATHS:
        path = pattern.sub(replacement, path)
    return _SECRET_PARAMS.sub(r"\1[redacted]", path)


class RedactingAccessLog(AccessLogGenerator):
    """Daphne's access log, with ``redact``ed paths."""

    def __call__(self, protocol: str, action: str, details: dict) -> None:
        if isinstance(details.get("path"), str):
            details = {**details, "path": redact(details["path"])}
        super().__call__(protocol, action, details)


class Server(DaphneServer):
    """Daphne's server whose websocket factory builds ``WebSocketProtocol`` above, and that drains on
    SIGTERM / SIGINT instead of stopping at once:

    1. stop listening, and answer ``/healthz`` with 503 "draining" on connections still open (new
       requests go to the other web processes behind the load balancer);
    2. close every websocket with 1001 "server shutting down" (clients reconnect elsewhere, with
       ``?after=<last seq>`` on ``ws/runs``);
    3. let HTTP requests in flight finish, for at most ``AGENTRUN_DRAIN_SECONDS`` (10 by default);
    4. stop: what still runs is cancelled, and the process exits within 2 s more whatever its threads
       do (a request thread stuck on the database cannot hold the exit). A second signal stops at once.

    A decision's continuation is queued in the decision's own transaction, so a request cut off here
    either committed both or neither: nothing is lost (the client may retry with ``Idempotency-Key``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        logger_ = kwargs.get("action_logger")
        if isinstance(logger_, AccessLogGenerator) and not isinstance(logger_, RedactingAccessLog):
            kwargs["action_logger"] = RedactingAccessLog(logger_.stream)
        super().__init__(*args, **kwargs)
        self.ports: list[Any] = []
        self.drain_seconds = float(os.environ.get("AGENTRUN_DRAIN_SECONDS", "10"))
        self.drain_deadline: float | None = None

    def run(self) -> None:
        self.signal_handlers = False  # ours, below
        loop = reactor._asyncioEventloop
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.drain, signum)
        # What is loaded by now (Django, the application: ~130k objects) lives as long as the process:
        # out of the cyclic collector's way. Each full collection walked all of it, ~80 ms, and a
        # process relaying chunks allocates enough to run one every few thousand chunks
        # (docs/performance.md "Fan-out (third pass)", "Fourth pass").
        gc.collect()
        gc.freeze()
        super().run()

    def listen_success(self, port: Any) -> None:
        super().listen_success(port)
        self.ports.append(port)

    def drain(self, signum: int = signal.SIGTERM) -> None:
        if self.drain_deadline is not None:
            logger.warning("%s again: stopping now", signal.Signals(signum).name)
            self.stop()
            return
        self.drain_deadline = time.monotonic() + self.drain_seconds
        from agentrun.server import health  # Django's side, loaded with the application by now

        health.draining = True  # /healthz: 503 "draining", out of the load balancer
        logger.info("%s: draining for at most %.0f s", signal.Signals(signum).name, self.drain_seconds)
        for port in self.ports:
            port.stopListening()
        for protocol in list(self.connections):
            if isinstance(protocol, WebSocketProtocol) and protocol.state == AutobahnProtocol.STATE_OPEN:
                protocol.serverClose(code=GOING_AWAY, reason="server shutting down")
        self._stop_when_drained()

    def _requests_in_flight(self) -> int:
        return sum(
            1
            for protocol, details in self.connections.items()
            if not isinstance(protocol, WebSocketProtocol)
            and (instance := details.get("application_instance")) is not None
            and not instance.done()
        )

    def _stop_when_drained(self) -> None:
        busy = self._requests_in_flight()
        if busy and time.monotonic() < self.drain_deadline:
            reactor.callLater(0.1, self._stop_when_drained)
            return
        if busy:
            logger.warning("drain over: %d requests still in flight are cancelled", busy)
        self.stop()

    @property
    def ws_factory(self) -> Any:
        return self._ws_factory

    @ws_factory.setter
    def ws_factory(self, factory: Any) -> None:
        # DaphneServer.run() makes the factory; the protocol it builds is ours.
        factory.protocol = WebSocketProtocol
        # No per-message compression: frames made once go to every socket as they are (agentrun.ws.frames).
        factory.setProtocolOptions(
            closeHandshakeTimeout=CLOSE_HANDSHAKE_SECONDS, perMessageCompressionAccept=lambda offers: None
        )
        self._ws_factory = factory

    def create_application(self, protocol: Any, scope: dict) -> Any:
        if isinstance(protocol, WebSocketProtocol):
            scope.setdefault("extensions", {})[FRAMES] = {CLIENT_FULL: protocol.client_full}
        return super().create_application(protocol, scope)

    async def handle_reply(self, protocol: Any, message: dict) -> None:
        await super().handle_reply(protocol, message)
        flow = getattr(protocol, "flow", None)
        if flow is not None and message.get("type") in ("websocket.send", FRAMES):
            await flow.ready.wait()  # backpressure: the client reads slower than we send


class AgentrunCommandLine(CommandLineInterface):
    server_class = Server


def main(argv: list[str] | None = None) -> None:
    cli = AgentrunCommandLine()
    cli.run(sys.argv[1:] if argv is None else argv)
    # The reactor stopped. Request threads that are still running (sync views) would hold the
    # interpreter's exit: give them a moment to commit, then leave without them.
    deadline = time.monotonic() + EXIT_GRACE_SECONDS
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()

"""agentrun's web server: daphne, with websocket answers the contract can name.

    python -m agentrun.daphne_ws -b 0.0.0.0 -p 8000 agentrun.asgi:application   (any daphne option)

What it changes in daphne (4.x, autobahn underneath):

- **A frame over 1 MiB** (CONTRACT §4/§5: bodies and frames are at most 1 MiB). Daphne's own limit
  (``--websocket-max-message-size``, 1 MiB) is checked by autobahn as soon as a frame's header
  announces its length, before its payload is read, and autobahn then drops the TCP connection.
  Here the client gets the contract's error frame ``PAYLOAD_TOO_LARGE`` and a clean close **1009**
  (message too big) instead; the rest of the oversized message is read and discarded, never buffered.
- **Close codes of the 1xxx range** a server may send (1009, 1011): autobahn's ``sendClose`` only
  takes 1000 and 3000–4999, so a consumer's ``close(code=1009)`` raised inside daphne; they are sent
  as they are here.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from autobahn.websocket.protocol import WebSocketProtocol as AutobahnProtocol
from daphne.cli import CommandLineInterface
from daphne.server import Server as DaphneServer
from daphne.ws_protocol import WebSocketProtocol as DaphneWebSocketProtocol

MESSAGE_TOO_BIG = 1009
TOO_LARGE_FRAME = json.dumps(
    {"type": "error", "error": {"code": "PAYLOAD_TOO_LARGE", "message": "A frame is at most 1 MiB."}}
).encode()


class WebSocketProtocol(DaphneWebSocketProtocol):
    def _max_message_size_exceeded(self, msg_size: int, max_msg_size: int, reason: str) -> None:
        # autobahn would drop the connection (failByDrop). failedByMe makes it discard the rest of the
        # message while the closing handshake completes.
        self.failedByMe = True
        if self.state == AutobahnProtocol.STATE_OPEN:
            self.sendMessage(TOO_LARGE_FRAME, isBinary=False)
            self.sendCloseFrame(code=MESSAGE_TOO_BIG, reasonUtf8=b"frame over 1 MiB", isReply=False)

    def serverClose(self, code: int | None = None) -> None:
        if code is not None and 1000 < code < 3000:
            self.sendCloseFrame(code=code, isReply=False)  # sendClose refuses the 1xxx codes
        else:
            super().serverClose(code)


class Server(DaphneServer):
    """Daphne's server whose websocket factory builds ``WebSocketProtocol`` above."""

    @property
    def ws_factory(self) -> Any:
        return self._ws_factory

    @ws_factory.setter
    def ws_factory(self, factory: Any) -> None:
        # DaphneServer.run() makes the factory; the protocol it builds is ours.
        factory.protocol = WebSocketProtocol
        self._ws_factory = factory


class AgentrunCommandLine(CommandLineInterface):
    server_class = Server


def main(argv: list[str] | None = None) -> None:
    AgentrunCommandLine().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()

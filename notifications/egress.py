"""Webhook egress that cannot reach inside: where a delivery may connect, and the connection itself.

A webhook URL is chosen by staff, and the host it names is resolved by DNS that someone else may
control. Unchecked, an endpoint is a probe into the private network (the database, Redis, a cloud's
metadata service at 169.254.169.254), and the delivery log an oracle of what answered there. So
(docs/security.md, "Webhook targets"):

- an address is refused unless it is public: loopback, private, link-local, multicast, reserved and
  unspecified addresses are blocked (``address_problem``). ``AGENTRUN_WEBHOOK_ALLOW_PRIVATE=1`` allows
  loopback and private ones (receivers on the internal network, tests); link-local, multicast and
  reserved addresses stay blocked whatever the setting (the metadata service is link-local);
- at creation and on every change, ``url_problem`` refuses a URL whose host is, or resolves to, a
  blocked address; a host that does not resolve yet is accepted;
- at every connection the host is resolved **once**, every address it resolves to is checked, and the
  socket connects to the vetted address itself — DNS that answers differently a second time (rebinding)
  never gets a say. Redirects are not followed; no proxy from the environment is used;
- a failed attempt is logged with a generic reason (``Outcome.error``): "blocked address", "connection
  refused", "timeout", "HTTP 503" — never text the other side sent.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class BlockedAddress(OSError):
    """The host is, or resolves to, an address webhooks may not reach."""


def address_problem(address: IPAddress, *, allow_private: bool | None = None) -> str | None:
    """Why a delivery may not connect to ``address`` ("a loopback address", …), or None.
    ``allow_private``: None follows ``AGENTRUN_WEBHOOK_ALLOW_PRIVATE``; True for a host the operator
    configured (Slack's Web API base, docs/slack.md), never chosen by a user."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    if allow_private is None:
        allow_private = settings.AGENTRUN_WEBHOOK_ALLOW_PRIVATE
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_loopback:
        return None if allow_private else "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_reserved:
        return "a reserved address"
    if address.is_private or not address.is_global:  # RFC 1918, ULA, CGNAT (100.64/10), documentation ranges
        return None if allow_private else "a private address"
    return None


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (an IP literal: itself). ``socket.gaierror`` if none."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))


def vetted(host: str, port: int, *, allow_private: bool | None = None) -> list[IPAddress]:
    """The addresses to connect to: ``host`` resolved once, all of them allowed (``BlockedAddress`` if not)."""
    addresses = resolve(host, port)
    for address in addresses:
        if problem := address_problem(address, allow_private=allow_private):
            raise BlockedAddress(f"{host} resolves to {address}, {problem}")
    return addresses


def _port(parts: Any) -> int:
    return parts.port or (443 if parts.scheme == "https" else 80)


def url_problem(url: str) -> str | None:
    """Why webhooks may not be sent to ``url`` (its host is, or resolves to, a blocked address), or None.
    A host that does not resolve (yet) is accepted: it is checked again at every connection."""
    try:
        parts = urlsplit(url)
        port = _port(parts)
    except ValueError:
        return "the URL is not valid"
    if not parts.hostname:
        return "the URL names no host"
    try:
        vetted(parts.hostname, port)
    except BlockedAddress as exc:
        allowed = settings.AGENTRUN_WEBHOOK_ALLOW_PRIVATE
        hint = "" if allowed else " (AGENTRUN_WEBHOOK_ALLOW_PRIVATE=1 allows private ones)"
        return f"{exc}: webhooks go to public addresses only{hint}"
    except (OSError, UnicodeError):
        return None  # does not resolve yet
    return None


def _connect(
    host: str, port: int, timeout: float | None, source_address: Any = None, allow_private: bool | None = None
) -> socket.socket:
    """``socket.create_connection`` to the vetted addresses of ``host``, never to a second lookup's."""
    last: OSError | None = None
    for address in vetted(host, port, allow_private=allow_private):
        try:
            return socket.create_connection((str(address), port), timeout, source_address)
        except OSError as exc:
            last = exc
    raise last or OSError("no address")


class _VettedHTTPConnection(http.client.HTTPConnection):
    allow_private: bool | None = None

    def connect(self) -> None:
        self.sock = _connect(self.host, self.port, self.timeout, self.source_address, self.allow_private)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _VettedHTTPSConnection(http.client.HTTPSConnection):
    allow_private: bool | None = None

    def connect(self) -> None:
        # TLS on the vetted socket: the certificate is checked against the URL's host name (SNI too).
        sock = _connect(self.host, self.port, self.timeout, self.source_address, self.allow_private)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


@dataclass(frozen=True)
class Outcome:
    status: int | None  # the HTTP status, when something answered in HTTP
    error: str | None  # None: delivered (2xx); else a generic reason, never the other side's text
    body: bytes = b""  # the answer's first ``read_limit`` bytes, when asked for (Slack's Web API answers in JSON)


def post(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    timeout: float,
    read_limit: int = 0,
    allow_private: bool | None = None,
) -> Outcome:
    """POST ``body`` to ``url`` through a vetted connection; a 2xx delivers, anything else is a reason.
    ``read_limit``: keep that much of the answer's body; ``allow_private``: as ``address_problem``."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if parts.scheme == "https":
        connection: http.client.HTTPConnection = _VettedHTTPSConnection(
            parts.hostname, _port(parts), timeout=timeout, context=ssl.create_default_context()
        )
    else:
        connection = _VettedHTTPConnection(parts.hostname, _port(parts), timeout=timeout)
    connection.allow_private = allow_private
    answer = b""
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        status = response.status
        if read_limit:
            answer = response.read(read_limit)
    except BlockedAddress:
        return Outcome(None, "blocked address")
    except TimeoutError:  # socket.timeout is TimeoutError
        return Outcome(None, "timeout")
    except ConnectionRefusedError:
        return Outcome(None, "connection refused")
    except socket.gaierror:
        return Outcome(None, "host not found")
    except ssl.SSLError:
        return Outcome(None, "TLS error")
    except http.client.HTTPException:
        return Outcome(None, "invalid HTTP response")
    except (OSError, ValueError, UnicodeError):
        return Outcome(None, "connection failed")
    finally:
        connection.close()
    return Outcome(status, None if 200 <= status < 300 else f"HTTP {status}", answer)

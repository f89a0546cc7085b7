"""What agentrun's processes take from other packages is declared, and bounded where it is private.

``agentrun.server.web`` overrides and calls private parts of daphne, autobahn and Twisted, and
``agentrun.server.channel_layer`` reaches into channels_redis, ``agentrun.core.outages`` into
psycopg_pool's reconnection and the two libraries' loggers. A new release may drop or rename any of
them without notice: the bounds in ``pyproject.toml`` keep such a release out, and the checks below
say exactly what to look at (the attribute, the package and its version) before a bound is raised.
Their behaviour is proved through a real server in tests/system (test_websockets, test_drain) and the
browser tests, which run on ``agentrun.server.web`` too.
"""

from __future__ import annotations

import ast
import inspect
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module, metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SHIPPED = ("agentrun", "approvals", "notifications")  # the packages pyproject.toml installs


@dataclass(frozen=True)
class Internal:
    distribution: str  # the package on PyPI that ships it
    name: str  # what agentrun relies on, as a reader would look it up
    used_by: str
    holds: Callable[[], bool]


def _source_of(obj: object) -> str:
    return inspect.getsource(obj)  # type: ignore[arg-type]


def _params(func: Callable[..., object]) -> list[str]:
    return list(inspect.signature(func).parameters)


def _autobahn_protocol() -> type:
    from autobahn.websocket.protocol import WebSocketProtocol

    return WebSocketProtocol


def _daphne_server() -> type:
    from daphne.server import Server

    return Server


def _daphne_ws_protocol() -> type:
    from daphne.ws_protocol import WebSocketProtocol

    return WebSocketProtocol


def _loop_layer() -> object:
    from channels_redis.pubsub import RedisPubSubLoopLayer

    return RedisPubSubLoopLayer(hosts=["redis://127.0.0.1:6379/0"])  # connects only when used


def _twisted_reactor_loop() -> bool:
    import asyncio

    from daphne.server import reactor  # daphne installs Twisted's asyncio reactor on import

    return isinstance(getattr(reactor, "_asyncioEventloop", None), asyncio.AbstractEventLoop)


def _asgi_handler() -> type:
    from django.core.handlers.asgi import ASGIHandler

    return ASGIHandler


WEB = "agentrun.server.web"
ASGI = "agentrun.asgi"
LAYER = "agentrun.server.channel_layer"
OUTAGES = "agentrun.core.outages"
INTERNALS = [
    Internal(
        "django",
        "django.core.handlers.asgi.ASGIHandler.read_body(receive), create_request(scope, body_file), "
        "listen_for_disconnect(receive), send_response(response, send), chunk_size",
        f"{ASGI}.OneHopASGIHandler serves a sync view's request with them in one hop to the sync thread",
        lambda: (
            _params(_asgi_handler().read_body) == ["self", "receive"]
            and _params(_asgi_handler().create_request) == ["self", "scope", "body_file"]
            and _params(_asgi_handler().listen_for_disconnect) == ["self", "receive"]
            and _params(_asgi_handler().send_response) == ["self", "response", "send"]
            and isinstance(_asgi_handler().chunk_size, int)
            and "_handler_class" in _source_of(_asgi_handler())
        ),
    ),
    Internal(
        "autobahn",
        "autobahn.websocket.protocol.WebSocketProtocol._max_message_size_exceeded(msg_size, max_msg_size, reason)",
        f"{WEB}.WebSocketProtocol overrides it to answer PAYLOAD_TOO_LARGE and close 1009",
        lambda: (
            _params(_autobahn_protocol()._max_message_size_exceeded) == ["self", "msg_size", "max_msg_size", "reason"]
        ),
    ),
    Internal(
        "autobahn",
        "autobahn.websocket.protocol.WebSocketProtocol.failedByMe",
        f"{WEB} sets it so that the rest of an oversized message is discarded",
        lambda: "self.failedByMe" in _source_of(_autobahn_protocol()),
    ),
    Internal(
        "autobahn",
        "autobahn.websocket.protocol.WebSocketProtocol.sendCloseFrame(code, reasonUtf8, isReply)",
        f"{WEB} sends the 1xxx close codes autobahn's sendClose refuses (1009, 1011)",
        lambda: _params(_autobahn_protocol().sendCloseFrame) == ["self", "code", "reasonUtf8", "isReply"],
    ),
    Internal(
        "twisted",
        "twisted.internet.asyncioreactor.AsyncioSelectorReactor._asyncioEventloop",
        f"{WEB}.Server.run installs the SIGTERM/SIGINT drain on the reactor's asyncio loop",
        _twisted_reactor_loop,
    ),
    Internal(
        "daphne",
        "daphne.server.Server.run() assigning self.ws_factory",
        f"{WEB}.Server.ws_factory (a property) swaps in agentrun's websocket protocol",
        lambda: "self.ws_factory = " in _source_of(_daphne_server().run),
    ),
    Internal(
        "daphne",
        'daphne.server.Server.connections[protocol]["application_instance"]',
        f"{WEB}.Server counts the HTTP requests in flight while it drains",
        lambda: 'self.connections[protocol]["application_instance"]' in _source_of(_daphne_server()),
    ),
    Internal(
        "daphne",
        "daphne.server.Server.signal_handlers",
        f"{WEB}.Server.run turns daphne's signal handlers off for its own",
        lambda: "reactor.run(installSignalHandlers=self.signal_handlers)" in _source_of(_daphne_server().run),
    ),
    Internal(
        "daphne",
        "daphne.server.Server.listen_success(port)",
        f"{WEB}.Server keeps the listening ports to stop listening on SIGTERM",
        lambda: _params(_daphne_server().listen_success) == ["self", "port"],
    ),
    Internal(
        "daphne",
        "daphne.server.Server.handle_reply(protocol, message) (a coroutine)",
        f"{WEB}.Server waits there while a websocket's write buffer is full (backpressure)",
        lambda: (
            inspect.iscoroutinefunction(_daphne_server().handle_reply)
            and _params(_daphne_server().handle_reply) == ["self", "protocol", "message"]
        ),
    ),
    Internal(
        "daphne",
        "daphne.ws_protocol.WebSocketProtocol.handle_reply(message) and serverClose(code)",
        f"{WEB}.WebSocketProtocol sends a close's code and reason as the application gave them",
        lambda: (
            _params(_daphne_ws_protocol().handle_reply) == ["self", "message"]
            and _params(_daphne_ws_protocol().serverClose)[:2] == ["self", "code"]
        ),
    ),
    Internal(
        "daphne",
        "daphne.cli.CommandLineInterface.server_class",
        f"{WEB}.AgentrunCommandLine runs agentrun's Server with daphne's options",
        lambda: "self.server_class(" in _source_of(import_module("daphne.cli").CommandLineInterface),
    ),
    Internal(
        "daphne",
        "daphne.access.AccessLogGenerator(stream).stream and Server(action_logger=...)",
        f"{WEB}.Server swaps the access log for RedactingAccessLog (no token in the log)",
        lambda: (
            _params(import_module("daphne.access").AccessLogGenerator.__init__) == ["self", "stream"]
            and "self.stream = stream" in _source_of(import_module("daphne.access").AccessLogGenerator)
            and "action_logger" in _params(_daphne_server().__init__)
        ),
    ),
    Internal(
        "channels-redis",
        "channels_redis.pubsub.RedisPubSubChannelLayer._get_layer()",
        f"{LAYER}.AwakePubSubChannelLayer reaches the per-loop layer through it",
        lambda: callable(getattr(import_module("channels_redis.pubsub").RedisPubSubChannelLayer, "_get_layer", None)),
    ),
    Internal(
        "channels-redis",
        "channels_redis.pubsub.RedisPubSubLoopLayer._shards, .prefix and the shards' subscribe(channel)",
        f"{LAYER}.AwakePubSubChannelLayer keeps each shard subscribed so that its reader never sleeps",
        lambda: (
            isinstance(getattr(layer := _loop_layer(), "prefix", None), str)
            and bool(getattr(layer, "_shards", None))
            and all(inspect.iscoroutinefunction(getattr(shard, "subscribe", None)) for shard in layer._shards)
        ),
    ),
    Internal(
        "channels-redis",
        "channels_redis.pubsub's logger (its receive loop logs a failure with the exception each second)",
        f"{OUTAGES}.OutageLogFilter counts those records as the channel layer's outage",
        lambda: import_module("channels_redis.pubsub").logger.name == "channels_redis.pubsub",
    ),
    Internal(
        "psycopg-pool",
        "psycopg_pool.base.AttemptWithBackoff.INITIAL_DELAY and DELAY_BACKOFF, read by update_delay()",
        f"{OUTAGES}.tune_database_pool makes the pool reconnect every 0.5 s after an outage",
        lambda: all(
            f"self.{name}" in _source_of(import_module("psycopg_pool.base").AttemptWithBackoff.update_delay)
            for name in ("INITIAL_DELAY", "DELAY_BACKOFF")
        ),
    ),
    Internal(
        "psycopg-pool",
        "psycopg_pool's logger and its warnings with the exception as an argument",
        f"{OUTAGES}.OutageLogFilter counts its failed connection attempts as the database's outage",
        lambda: import_module("psycopg_pool.pool").logger.name == "psycopg.pool",
    ),
]


@pytest.mark.parametrize("internal", INTERNALS, ids=[i.name.split("(")[0] for i in INTERNALS])
def test_the_private_internals_agentrun_relies_on_are_still_there(internal: Internal):
    version = metadata.version(internal.distribution)
    try:
        holds = internal.holds()
    except Exception as exc:  # gone or renamed: say which, whatever the exception
        holds, why = False, f" ({type(exc).__name__}: {exc})"
    else:
        why = ""
    assert holds, (
        f"{internal.distribution} {version} no longer provides {internal.name}{why}; "
        f"{internal.used_by}. Adapt it to {internal.distribution} {version} (or keep the version out) "
        f"before changing the bound in pyproject.toml."
    )


def _declared() -> dict[str, Requirement]:
    requirements = [Requirement(line) for line in PYPROJECT["project"]["dependencies"]]
    return {canonicalize_name(r.name): r for r in requirements}


def test_the_packages_whose_internals_agentrun_uses_are_declared_with_an_upper_bound():
    declared = _declared()
    for distribution in sorted({i.distribution for i in INTERNALS}):
        requirement = declared.get(canonicalize_name(distribution))
        assert requirement is not None, f"{distribution} is not declared in pyproject.toml's dependencies"
        assert any(spec.operator in {"<", "<=", "==", "~="} for spec in requirement.specifier), (
            f"{requirement} has no upper bound: a release may drop the private internals agentrun uses"
        )
        installed = metadata.version(distribution)
        assert requirement.specifier.contains(installed, prereleases=True), (
            f"{requirement} does not admit the installed {distribution} {installed}"
        )


def _imported_top_level_modules() -> set[str]:
    modules = set()
    for package in SHIPPED:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    modules.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
    return modules


def _owners(module: str, providers: list[str]) -> set[str]:
    """The distributions that ship the package itself, not just a file in it (daphne ships a Twisted
    plugin, ``twisted/plugins/…``, and is no provider of Twisted)."""
    init = f"{module}/__init__.py"
    owners = [d for d in providers if any(str(f) == init for f in metadata.files(d) or [])]
    return {canonicalize_name(d) for d in owners or providers}


# Imported only when installed (an optional feature): the extra of pyproject.toml that installs it.
OPTIONAL = {"opentelemetry": "tracing"}


def test_every_package_the_code_imports_is_declared():
    declared = set(_declared())
    providers = metadata.packages_distributions()
    undeclared = {}
    for module in sorted(_imported_top_level_modules()):
        if module in sys.stdlib_module_names or module in SHIPPED:
            continue
        if module in OPTIONAL:
            extra = PYPROJECT["project"]["optional-dependencies"].get(OPTIONAL[module], [])
            assert any(canonicalize_name(Requirement(r).name).startswith(module) for r in extra), (
                f"{module} is an optional import: pyproject.toml's extra {OPTIONAL[module]!r} must install it"
            )
            continue
        distributions = _owners(module, providers.get(module, []))
        assert distributions, f"{module} is imported but no installed distribution provides it"
        if not distributions & declared:
            undeclared[module] = sorted(distributions)
    assert not undeclared, f"imported by agentrun but not in pyproject.toml's dependencies: {undeclared}"

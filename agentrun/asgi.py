"""ASGI entry point: HTTP (Django, static files) and websockets (Channels)."""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from agentrun.engine import runtime, sweeper  # noqa: E402
from agentrun.routing import websocket_urlpatterns  # noqa: E402
from agentrun.ws.auth import AuthStack, OriginCheck  # noqa: E402
from agentrun.ws.consumers import OutageGuard  # noqa: E402
from agentrun.ws.observed import count_websockets  # noqa: E402

router = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_asgi),
        # The guard outside the authentication: checking a user needs the database too. The origin
        # check lets a handshake without Origin through only with a token (docs/api.md#websockets).
        "websocket": count_websockets(OriginCheck(OutageGuard(AuthStack(URLRouter(websocket_urlpatterns))))),
    }
)


async def application(scope, receive, send):  # noqa: ANN001, ANN201 - the ASGI signature
    # Runs dispatched from sync views execute on this loop (see agentrun.engine.runtime); on the embedded
    # default the server sweeps too (production leaves that to the workers).
    loop = asyncio.get_running_loop()
    if runtime.bind_loop(loop) and settings.AGENTRUN_EMBEDDED_SWEEPER:
        runtime.keep(loop.create_task(sweeper.run_forever()))
    return await router(scope, receive, send)

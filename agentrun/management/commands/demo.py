"""``make demo``: seed the demo, serve it, and say how to sign in as the last lines, every time.

The seeded runs email the demo reviewer (the console shows those emails); the server's own start-up
lines follow. Said before both, the password would scroll away: here it is said once the seeding's
emails are out and the server listens.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.tasks import task_backends

from agentrun.management.commands.demo_seed import Command as DemoSeed

SERVER_START_SECONDS = 60


class Command(BaseCommand):
    help = "Seed the demo, serve it (agentrun.server.web), then say where it is and how to sign in."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args: Any, host: str, port: int, **options: Any) -> None:
        base = f"http://{host}:{port}"
        env = dict(os.environ)
        if "AGENTRUN_PUBLIC_URL" not in env:
            # Links in the demo's emails point at this server, whatever the port (docs/notifications.md).
            env["AGENTRUN_PUBLIC_URL"] = settings.AGENTRUN_PUBLIC_URL = base
        seed = DemoSeed(stdout=self.stdout, stderr=self.stderr)
        seed.announce = False
        call_command(seed)
        idle = getattr(task_backends["default"], "wait_idle", None)
        if idle is not None:
            with contextlib.suppress(TimeoutError):  # the seeded runs' emails, printed before what follows
                idle(timeout=30, queue="notifications")
        server = subprocess.Popen(
            [sys.executable, "-m", "agentrun.server.web", "-b", host, "-p", str(port), "agentrun.asgi:application"],
            env=env,
        )
        try:
            if not _listening(host, port, server):
                raise SystemExit(server.wait())
            sys.stderr.flush()
            self.stdout.write("")
            self.stdout.write(
                self.style.SUCCESS(f"agentrun demo on {base}/approvals/")
                + f"  (admin: {base}/admin/, API docs: {base}/api/docs/; another port: make demo PORT=8080)"
            )
            for line in seed.signin:
                self.stdout.write(self.style.WARNING(line))
            self.stdout.flush()
            raise SystemExit(server.wait())
        except KeyboardInterrupt:  # Ctrl-C reached the server too (one process group): let it drain
            raise SystemExit(server.wait()) from None
        finally:
            if server.poll() is None:
                server.terminate()
                server.wait()


def _listening(host: str, port: int, server: subprocess.Popen) -> bool:
    """Whether the server accepts connections (a bare TCP connect: no request, nothing in its log)."""
    deadline = time.monotonic() + SERVER_START_SECONDS
    address = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    while time.monotonic() < deadline and server.poll() is None:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
            probe.settimeout(1)
            if probe.connect_ex((address.strip("[]"), port)) == 0:
                return True
        time.sleep(0.1)
    return False

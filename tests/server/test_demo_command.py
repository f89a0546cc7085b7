"""``make demo`` (``manage.py demo``) through real processes: its last lines say where it is and how to
sign in, every time, and the links in its emails follow the port (issue 20 item 8)."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIGN_IN = re.compile(r"Sign in as '(reviewer|viewer)' with (password: \S+|the password printed when it was created)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_demo(data_dir: Path, port: int) -> list[str]:
    """``manage.py demo`` until it has said how to sign in (both accounts), then Ctrl-C: its output lines."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "AGENTRUN_PUBLIC_URL")}
    env |= {"DEBUG": "1", "AGENTRUN_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=120)
    demo = subprocess.Popen(
        [*manage, "demo", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its Ctrl-C (to the group: the command and its server) reaches no one else
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in demo.stdout] + [lines.put(None)]).start()
    seen: list[str] = []
    deadline = time.monotonic() + 90
    try:
        while sum(bool(SIGN_IN.search(line)) for line in seen) < 2:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, "the demo ended early:\n" + "\n".join(seen)
            seen.append(line)
        # Whatever the server had to say at start-up came before: nothing follows the sign-in lines.
        try:
            extra = lines.get(timeout=2)
        except queue.Empty:
            extra = ""
        assert not extra, f"printed after the sign-in lines: {extra!r}"
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        demo.wait(timeout=30)
    return seen


def test_the_demo_ends_with_where_it_is_and_how_to_sign_in_every_time_and_emails_follow_the_port(tmp_path):
    port = free_port()
    first = run_demo(tmp_path, port)
    banner, *signin = first[-3:]
    assert banner.startswith(f"agentrun demo on http://127.0.0.1:{port}/approvals/"), first[-5:]
    assert [SIGN_IN.search(line).group(1) for line in signin] == ["reviewer", "viewer"]
    assert "password: " in signin[0]
    assert any("Listening on TCP address" in line for line in first)  # the server's lines came first
    # The seeded runs emailed the reviewer: its decision links are on this server's port.
    links = re.findall(r"http://[^/\s]+/approvals/links/", "\n".join(first))
    assert links and set(links) == {f"http://127.0.0.1:{port}/approvals/links/"}, links

    again = run_demo(tmp_path, free_port())  # a second start: the reminder, last again
    assert [SIGN_IN.search(line).group(1) for line in again[-2:]] == ["reviewer", "viewer"]
    assert "printed when it was created" in again[-1] and "AGENTRUN_RESET_DEMO_PASSWORD=1" in again[-1]

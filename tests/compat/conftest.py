"""Fixtures of the compatibility prefixes' tests.

In-process tests share the REST API's fixtures (users with tokens, runs made by the engine). The real
clients' tests share the system tests' real processes (daphne and a worker on PostgreSQL and Redis),
and install Mastra's published client from the npm registry into ``var/compat-node/`` (not committed:
``tests/compat/node/`` holds the pinned ``package.json`` and its lock file). A machine without
``node`` and ``npm`` fails them; nothing skips.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE_SOURCES = Path(__file__).resolve().parent / "node"
NODE_CACHE = ROOT / "var" / "compat-node"
MASTRA_CLIENT_VERSION = "1.47.0"


def _installed_version(package: str) -> str | None:
    manifest = NODE_CACHE / "node_modules" / package / "package.json"
    return json.loads(manifest.read_text())["version"] if manifest.exists() else None


@pytest.fixture(scope="session")
def node_client() -> Path:
    """A folder holding ``mastra_client.mjs`` beside ``@mastra/client-js`` installed with ``npm ci``
    from the committed lock file (again whenever the lock file changes)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are required to test @mastra/client-js against agentrun", pytrace=False)
    NODE_CACHE.mkdir(parents=True, exist_ok=True)
    lock = (NODE_SOURCES / "package-lock.json").read_bytes()
    stamp = NODE_CACHE / ".installed-from-lock"
    with open(NODE_CACHE / ".install-lock", "w") as guard:  # two pytest processes: one installs
        fcntl.flock(guard, fcntl.LOCK_EX)
        if not stamp.exists() or stamp.read_bytes() != lock or _installed_version("@mastra/client-js") is None:
            for name in ("package.json", "package-lock.json"):
                shutil.copy(NODE_SOURCES / name, NODE_CACHE / name)
            done = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=NODE_CACHE,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if done.returncode != 0:
                pytest.fail(f"npm ci failed:\n{done.stdout}\n{done.stderr}", pytrace=False)
            stamp.write_bytes(lock)
        shutil.copy(NODE_SOURCES / "mastra_client.mjs", NODE_CACHE / "mastra_client.mjs")
    assert _installed_version("@mastra/client-js") == MASTRA_CLIENT_VERSION
    return NODE_CACHE

"""A small process supervisor (standard library only) for ``scripts/production.sh``.

    python -m agentrun.server.supervisor \\
        --process "web-0=python -m agentrun.server.web -p 8000 agentrun.asgi:application" \\
        --process "worker-1=python manage.py agentrun_worker" …

- Starts every process (each in a process group of its own, so a terminal's Ctrl-C reaches only the
  supervisor, which forwards it). A process that exits — crash, signal, exit code 0 alike — is started
  again after a backoff (1 s, doubling to 30 s; back to 1 s once it stayed up a minute), logged; the
  others are left alone.
- SIGTERM or SIGINT: every process gets SIGTERM at once and has ``--stop-seconds`` (default
  ``AGENTRUN_DRAIN_SECONDS`` + 5) to exit, then SIGKILL; the supervisor exits 0 once all are gone.
- On Linux a process whose supervisor dies (even by SIGKILL) gets SIGTERM from the kernel, so no
  orphan keeps a port.

- Metrics (docs/operations.md): with ``PROMETHEUS_MULTIPROC_DIR`` set, every process counts into that
  directory; the supervisor empties it at start (counts of a previous run must not add up with this
  one's) and removes a dead process's live gauges (its open websockets are gone with it), as
  ``prometheus_client.multiprocess.mark_process_dead`` does; its counters stay counted.

A Procfile runner (honcho, foreman) or systemd does the same job: see ``deploy/``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0
STABLE_AFTER = 60.0  # a process that ran this long restarts after BACKOFF_FIRST again
POLL = 0.1
PR_SET_PDEATHSIG = 1


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    print(f"{stamp} supervisor: {message}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:  # runs in the child, between fork and exec
    os.setpgid(0, 0)
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    backoff: float = BACKOFF_FIRST
    restart_at: float | None = None
    restarts: int = field(default=0)

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, preexec_fn=_die_with_parent)  # noqa: PLW1509 - single-threaded
        self.started_at = time.monotonic()
        self.restart_at = None
        log(f"started {self.name} (pid {self.proc.pid}): {shlex.join(self.argv)}")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)


def metrics_dir() -> Path | None:
    value = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(value) if value else None


def clear_metrics_dir() -> None:
    if (directory := metrics_dir()) is not None:
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.db"):
            stale.unlink(missing_ok=True)


def forget_live_gauges(pid: int) -> None:
    """A dead process's ``live*`` gauges no longer count (prometheus_client's ``mark_process_dead``)."""
    if (directory := metrics_dir()) is not None:
        for stale in directory.glob(f"gauge_live*_{pid}.db"):
            stale.unlink(missing_ok=True)


class Supervisor:
    def __init__(self, children: list[Child], stop_seconds: float) -> None:
        self.children = children
        self.stop_seconds = stop_seconds
        self.stopping = False

    def _on_signal(self, signum: int, _frame: object) -> None:
        if not self.stopping:
            log(f"{signal.Signals(signum).name}: stopping {len(self.children)} processes")
        self.stopping = True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        clear_metrics_dir()
        for child in self.children:
            child.start()
        while not self.stopping:
            now = time.monotonic()
            for child in self.children:
                if child.restart_at is not None:
                    if now >= child.restart_at and not self.stopping:
                        child.restarts += 1
                        child.start()
                    continue
                code = child.proc.poll() if child.proc is not None else None
                if code is None:
                    continue
                if now - child.started_at >= STABLE_AFTER:
                    child.backoff = BACKOFF_FIRST
                forget_live_gauges(child.proc.pid)
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
                log(f"{child.name} (pid {child.proc.pid}) exited with {how}; restarting in {child.backoff:.0f} s")
                child.restart_at = now + child.backoff
                child.backoff = min(child.backoff * 2, BACKOFF_MAX)
            time.sleep(POLL)
        return self.stop()

    def stop(self) -> int:
        for child in self.children:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_seconds
        while time.monotonic() < deadline and any(c.proc is not None and c.proc.poll() is None for c in self.children):
            time.sleep(POLL)
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                log(f"{child.name} (pid {child.proc.pid}) still running after {self.stop_seconds:.0f} s: SIGKILL")
                child.signal(signal.SIGKILL)
                child.proc.wait()
        log("all processes stopped")
        return 0


def parse_process(spec: str) -> Child:
    name, sep, command = spec.partition("=")
    if not sep or not name or not command.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=COMMAND, got {spec!r}")
    return Child(name=name, argv=shlex.split(command))


def main(argv: list[str] | None = None) -> int:
    drain = float(os.environ.get("AGENTRUN_DRAIN_SECONDS", "10"))
    parser = argparse.ArgumentParser(prog="python -m agentrun.server.supervisor", description=__doc__.split("\n")[0])
    parser.add_argument("--process", action="append", type=parse_process, required=True, metavar="NAME=COMMAND")
    parser.add_argument("--stop-seconds", type=float, default=drain + 5, help="SIGTERM to SIGKILL (drain + 5)")
    args = parser.parse_args(argv)
    return Supervisor(args.process, args.stop_seconds).run()


if __name__ == "__main__":
    sys.exit(main())

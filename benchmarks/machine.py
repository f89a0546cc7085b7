"""How fast this machine runs plain Python now, printed beside every figure.

The benchmarks run on shared machines whose speed changes from day to day (the same code's decision
cycle took twice as long on one day as on another, at the same load average): a figure is comparable
with another only beside this one. ``reference_ms()`` times a fixed pure-Python workload (a million
additions in a loop, in CPU time, the best of three) — the kind of work the engine's own code does.
"""

from __future__ import annotations

import time


def reference_ms() -> float:
    """CPU milliseconds of the reference workload, the best of three runs."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        total = 0
        for i in range(1_000_000):
            total += i
        best = min(best, time.process_time() - started)
    return round(1000 * best, 1)


def describe() -> str:
    return f"reference loop {reference_ms()} ms (a million additions in Python; lower is a faster machine)"

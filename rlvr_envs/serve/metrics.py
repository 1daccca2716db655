"""Counters and latency samples behind ``GET /metrics``.

Steps run in per-session executor threads, so every update takes one lock (a few hundred ns; negligible next to a
step). Latencies keep the most recent ``window`` samples, so percentiles follow the current load rather than the
whole uptime; steps/s counts completed steps per wall-clock second over the last ``rate_seconds`` seconds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import numpy as np


def percentiles(samples: deque[float] | list[float]) -> dict[str, float | int | None]:
    """p50 / p99 / max of ``samples`` in ms (None when empty) and their count."""
    if not samples:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    values = np.fromiter(samples, dtype=np.float64, count=len(samples))
    p50, p99 = np.percentile(values, [50, 99])
    return {"p50": round(float(p50), 3), "p99": round(float(p99), 3), "max": round(float(values.max()), 3),
            "n": int(values.size)}


class ServeMetrics:
    """What the server has done: sessions, resets, steps, episodes, errors, and step / verify latencies."""

    def __init__(self, *, window: int = 10_000, rate_seconds: int = 10):
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.rate_seconds = rate_seconds
        self.counters: dict[str, int] = {
            "sessions_opened_total": 0, "sessions_rejected_total": 0, "resets_total": 0, "steps_total": 0,
            "episodes_total": 0, "errors_total": 0, "step_timeouts_total": 0, "idle_closed_total": 0,
        }
        self.step_ms: deque[float] = deque(maxlen=window)
        self.verify_ms: deque[float] = deque(maxlen=window)
        self._per_second: dict[int, int] = {}  # whole monotonic second -> steps completed in it

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def record_step(self, step_ms: float, verify_ms: float | None, done: bool) -> None:
        now = int(time.monotonic())
        with self._lock:
            self.counters["steps_total"] += 1
            self.counters["episodes_total"] += int(done)
            self.step_ms.append(step_ms)
            if verify_ms is not None:
                self.verify_ms.append(verify_ms)
            self._per_second[now] = self._per_second.get(now, 0) + 1
            if len(self._per_second) > 2 * self.rate_seconds:  # drop seconds that left the window
                for second in [s for s in self._per_second if s < now - self.rate_seconds]:
                    del self._per_second[second]

    def steps_per_s(self) -> float:
        """Steps completed per second over the last ``rate_seconds`` complete seconds (fewer just after start)."""
        now = time.monotonic()
        current = int(now)
        span = min(self.rate_seconds, max(current - int(self.started), 1))
        with self._lock:
            done = sum(n for s, n in self._per_second.items() if current - span <= s < current)
        return done / span

    def snapshot(self, **extra: Any) -> dict[str, Any]:
        with self._lock:
            counters = dict(self.counters)
            step_ms, verify_ms = list(self.step_ms), list(self.verify_ms)
        return {**extra, **counters, "uptime_s": round(time.monotonic() - self.started, 3),
                "steps_per_s": round(self.steps_per_s(), 3), "step_ms": percentiles(step_ms),
                "verify_ms": percentiles(verify_ms)}

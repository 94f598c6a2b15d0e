"""What every benchmark here measures with: percentiles, CPU seconds of other
processes, resident memory, and pacing a load at a fixed rate."""

from __future__ import annotations

import os
import time

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes (and their reaped children) used so far."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue   # gone: it used what it used
        # fields[0] is field 3 of stat(5): utime, stime, cutime, cstime are fields 14-17
        total += sum(int(x) for x in fields[11:15]) / CLOCK_TICKS
    return total


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Pacer:
    """How many messages are due now to keep `rate` per second since the start."""

    def __init__(self, rate: float):
        self.rate = rate
        self.started = time.perf_counter()
        self.sent = 0

    def due(self) -> int:
        return max(0, int((time.perf_counter() - self.started) * self.rate) - self.sent)

    def took(self, count: int) -> None:
        self.sent += count

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


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # fields[0] is field 3 of stat(5): ppid is field 4, utime..cstime fields 14-17
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None   # gone: it used what it used, and its parent's cutime has it once reaped


def descendants(pids: list[int]) -> list[int]:
    """The processes and every live process below them (a node may run several)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes, their live descendants and
    their reaped children used so far."""
    total = 0.0
    for pid in descendants(pids):
        fields = _stat_fields(pid)
        if fields is not None:
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

"""What every benchmark here measures with: percentiles, CPU seconds of other
processes, resident memory, the memory the machine has left, pacing a load at
a fixed rate, and the machine's size, which counts and waits that depend on
it follow; and the command-line type of a list of counts (processes, groups)."""

from __future__ import annotations

import argparse
import os
import time

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# The cores this process may run on (a container or taskset can give fewer than the machine has).
CORES = len(os.sched_getaffinity(0))


def machine() -> dict:
    """What a report says about where it ran."""
    return {"cores": CORES, "cpu_count": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}


def patience(seconds: float, processes: int = 1) -> float:
    """A wait for `processes` busy processes, stretched when they outnumber the cores."""
    return seconds * max(1.0, processes / CORES)


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes (and their reaped children) used so far."""
    return sum(cpu_by_process(pids).values())   # one gone used what it used


def cpu_by_process(pids: list[int]) -> dict[int, float]:
    """`cpu_seconds` of each of the processes still running."""
    return {pid: user + system for pid, (user, system) in user_system_by_process(pids).items()}


def user_system_by_process(pids: list[int]) -> dict[int, tuple[float, float]]:
    """(user, system) CPU seconds of each of the processes still running, their reaped children's included."""
    used = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is field 3 of stat(5): utime, stime, cutime, cstime are fields 14-17
        user, system, children_user, children_system = (int(x) / CLOCK_TICKS for x in fields[11:15])
        used[pid] = (user + children_user, system + children_system)
    return used


def process_name(pid: int) -> str | None:
    """The process's name (comm: raftq's processes name themselves, engine/lifetime.py); None once gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def group_pids(leaders: list[int]) -> list[int]:
    """Every live process in the process groups these PIDs lead: a raftq node is
    its engine and the fronts it forked, which are not reaped while they run."""
    wanted = set(leaders)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in wanted:      # field 5 of stat(5): the process group
            found.append(int(entry))
    return found


def memory_mib(pids: list[int]) -> float | None:
    """Proportional set size of the processes together: pages a forked front
    shares with its engine count once, not once per process."""
    total, seen = 0.0, False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) / 1024
                        seen = True
                        break
        except OSError:
            continue
    return total if seen else None


def available_mib() -> float:
    """Memory the machine can still give without swapping (MemAvailable: free memory
    plus page cache it can drop)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


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


def counts(what: str):
    """The argument type of a comma-separated list of `what` counts, each >= 1 (sorted, each once)."""
    def parse(value: str) -> list[int]:
        try:
            found = sorted({int(v) for v in value.split(",") if v.strip()})
        except ValueError:
            found = []
        if not found or found[0] < 1:
            raise argparse.ArgumentTypeError(f"a comma-separated list of {what} counts, each >= 1")
        return found
    return parse

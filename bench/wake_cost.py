"""What waking up costs on this machine, with its CPUs idle and kept awake.

    .venv/bin/python bench/wake_cost.py [--rounds 1000] [--dir /tmp]

Two hand-offs that every replicated write makes, each after 1 ms of idle:
a one-byte round trip through pipes between two processes, and an
fdatasync of a 283-byte append (a lone put's log entry). Each is measured
twice, interleaved: with the machine idle, and with one spinner per CPU at
SCHED_IDLE priority, which runs only when nothing else wants that CPU and so
keeps it from halting without taking time from anything. On a virtual
machine whose idle vCPUs halt to the host (no guest halt-polling), the idle
figures are many times the awake ones. The last line printed is one JSON
object with the p50s in microseconds.
"""

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import time

IDLE_S = 0.001
RECORD = b"x" * 283


def _spin(cpu: int, stop) -> None:
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    while not stop.is_set():
        for _ in range(100_000):
            pass


def _echo(inbox: int, outbox: int) -> None:
    while (byte := os.read(inbox, 1)) not in (b"", b"q"):
        os.write(outbox, byte)


def round_trips(rounds: int) -> list[float]:
    to_echo, from_me = os.pipe()
    from_echo, to_me = os.pipe()
    echo = multiprocessing.Process(target=_echo, args=(to_echo, to_me))
    echo.start()
    try:
        samples = []
        for _ in range(rounds):
            time.sleep(IDLE_S)
            started = time.perf_counter()
            os.write(from_me, b"x")
            os.read(from_echo, 1)
            samples.append((time.perf_counter() - started) * 1e6)
        return samples
    finally:
        os.write(from_me, b"q")
        echo.join()
        for fd in (to_echo, from_me, from_echo, to_me):
            os.close(fd)


def syncs(rounds: int, folder: str) -> list[float]:
    fd = os.open(os.path.join(folder, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        samples = []
        for _ in range(rounds):
            time.sleep(IDLE_S)
            os.write(fd, RECORD)
            started = time.perf_counter()
            os.fdatasync(fd)
            samples.append((time.perf_counter() - started) * 1e6)
        return samples
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1000, help="hand-offs per measurement and state")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="a folder on the disk to measure")
    args = parser.parse_args()
    per_pass = max(1, args.rounds // 2)
    samples = {(what, state): [] for what in ("pipe_round_trip", "fdatasync") for state in ("idle", "awake")}
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for _ in range(2):
            for state in ("idle", "awake"):
                stop = multiprocessing.Event()
                spinners = []
                if state == "awake":
                    spinners = [multiprocessing.Process(target=_spin, args=(cpu, stop))
                                for cpu in sorted(os.sched_getaffinity(0))]
                    for spinner in spinners:
                        spinner.start()
                    time.sleep(0.2)
                try:
                    samples[("pipe_round_trip", state)] += round_trips(per_pass)
                    samples[("fdatasync", state)] += syncs(per_pass, folder)
                finally:
                    stop.set()
                    for spinner in spinners:
                        spinner.join()
    figures = {}
    print(f"{'after 1 ms idle':>18}  {'CPUs idle p50 us':>17}  {'CPUs awake p50 us':>18}")
    for what in ("pipe_round_trip", "fdatasync"):
        idle, awake = (statistics.median(samples[(what, state)]) for state in ("idle", "awake"))
        print(f"{what:>18}  {idle:17.0f}  {awake:18.0f}")
        figures[f"{what}_p50_us_idle"] = round(idle)
        figures[f"{what}_p50_us_awake"] = round(awake)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

"""Idle CPU and failover of a 3-node cluster, for one checkout or two side by side.

    .venv/bin/python bench/idle_bench.py [--idle-seconds 20] [--failovers 5]
    .venv/bin/python bench/idle_bench.py --against /path/to/old/checkout   # before/after in one run

Idle CPU is the CPU seconds every process of every node (a node's children
included) used per 10 s of an idle cluster: leader elected, barrier applied,
one queue, no clients.  Failover is kill -9 of the leader -> the next
acknowledged put (bench/put_bench.py's round), median over the rounds.  With
``--against`` each checkout is measured in a child process whose nodes run
that checkout's code, the older one first; the last line is one JSON object
with both sides and the ratios (after / before).
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.measure import cpu_seconds  # noqa: E402


def measure(args) -> dict:
    # The nodes and the cluster harness come from the checkout being measured:
    # its directory goes first on this process's path and on the nodes' (which
    # run from a scratch directory, so that no other checkout shadows it).
    checkout = str(Path(args.checkout).resolve())
    sys.path.insert(0, checkout)
    from bench.put_bench import failover_once
    from raftq.local import LocalCluster

    figures: dict = {"checkout": checkout}
    with tempfile.TemporaryDirectory(prefix="raftq-idle-") as tmp:
        os.chdir(tmp)
        cluster = LocalCluster.create(Path(tmp) / "cluster", 3,
                                      env={**os.environ, "PYTHONPATH": checkout})
        try:
            cluster.start()
            if cluster.wait_for_leader(60) is None or not cluster.wait_all_ready(60):
                raise SystemExit("the cluster did not come up")
            with cluster.client(retry_for=30) as client:
                client.put("idle", "warm-up")
            time.sleep(args.settle_seconds)   # start-up work (imports, first connections) is not idle cost
            pids = [cluster.pid(n) for n in cluster.ids]
            before, started = cpu_seconds(pids), time.monotonic()
            time.sleep(args.idle_seconds)
            used, elapsed = cpu_seconds(pids) - before, time.monotonic() - started
            figures["idle_cpu_s_per_10s"] = round(used / elapsed * 10, 3)
            print(f"{checkout}: idle 3-node cluster {figures['idle_cpu_s_per_10s']:.3f} CPU-s per 10 s "
                  f"(over {elapsed:.0f} s)", flush=True)
            times = [asyncio.run(failover_once(cluster)) for _ in range(args.failovers)]
            figures["failover_median_s"] = round(statistics.median(times), 3)
            figures["failover_rounds_s"] = [round(t, 3) for t in times]
            print(f"{checkout}: failover (kill -9 leader -> next acked put) median "
                  f"{figures['failover_median_s']:.3f} s, rounds {figures['failover_rounds_s']}", flush=True)
        finally:
            cluster.close()
    return figures


def side_by_side(args) -> dict:
    sides = {}
    for name, checkout in (("before", args.against), ("after", args.checkout)):
        child = subprocess.run(
            [sys.executable, __file__, "--checkout", checkout, "--idle-seconds", str(args.idle_seconds),
             "--settle-seconds", str(args.settle_seconds), "--failovers", str(args.failovers)],
            stdout=subprocess.PIPE, text=True, check=True)
        lines = child.stdout.strip().splitlines()
        print("\n".join(lines[:-1]), flush=True)
        sides[name] = json.loads(lines[-1])
    ratios = {key: round(sides["after"][key] / sides["before"][key], 3)
              for key in ("idle_cpu_s_per_10s", "failover_median_s") if sides["before"][key]}
    print(f"after / before: {ratios}", flush=True)
    return {**sides, "ratio": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", default=str(ROOT), help="the raftq checkout to measure (default: this one)")
    parser.add_argument("--against", help="an older checkout to measure first, in the same run")
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--settle-seconds", type=float, default=3.0)
    parser.add_argument("--failovers", type=int, default=5)
    args = parser.parse_args()
    figures = side_by_side(args) if args.against else measure(args)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

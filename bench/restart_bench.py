"""Restart to ready with many stored messages: two commits' code side by side, in one run.

For each side (the baseline, then the candidate: git refs exported with
`git archive`, so edits made while it runs change nothing) a fresh 3-node cluster on 127.0.0.1 is filled with `--stored`
100-byte messages by batched puts (the way compare.py fills its backlog), and
then:
- the memory of the nodes (each node's process group, engine and fronts,
  proportional set size as bench/measure.py counts it): the peak sampled
  every 0.5 s while they are filled, and once they have been idle for 5 s
  (holding the messages);
- one follower stopped (SIGTERM) and started again: seconds until it is ready
  and has applied everything the leader committed;
- the whole cluster stopped and started again: seconds until every node is
  ready and caught up (compare.py's `restart_1m_s`);
- the journal and snapshot on disk of each node after the fill.
Each side runs in a child process with that side's tree first on PYTHONPATH,
so the nodes it starts run that side's code. Everything started is stopped by
PID, whatever happens.

    .venv/bin/python bench/restart_bench.py                  # main vs HEAD, 1 M messages
    .venv/bin/python bench/restart_bench.py --baseline HEAD~3 --candidate HEAD --stored 200000

Each side's figures are printed as soon as it is done; the last line printed
is one JSON object with both sides' figures and the ratios new ÷ old.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def disk_bytes(data_dir: Path) -> dict:
    raft = data_dir / "raft"
    journal = sum(p.stat().st_size for p in (raft / "journal").glob("seg-*.log"))
    snapshot = raft / "snapshot.bin"
    return {"journal_bytes": journal, "snapshot_bytes": snapshot.stat().st_size if snapshot.exists() else 0}


def measure(root: Path, stored: int) -> dict:
    """One side, in this process: the code importable from PYTHONPATH is that side's."""
    import asyncio

    import raftq.engine
    from bench.measure import group_pids, memory_mib
    from bench.raftq_side import RaftqHttp

    side = RaftqHttp(root)
    side.start()
    try:
        cluster = side.cluster
        pids = [cluster.pid(n) for n in cluster.ids]
        peak, filling = [0.0], threading.Event()

        def node_mib(pid: int) -> float:
            return memory_mib(group_pids([pid])) or 0.0

        def sample():
            while not filling.wait(0.5):
                peak[0] = max([peak[0]] + [node_mib(p) for p in pids])

        sampler = threading.Thread(target=sample)
        sampler.start()
        queue = side._queue("restart")
        started = time.perf_counter()
        try:
            asyncio.run(side._fill(queue, stored))
            fill_s = time.perf_counter() - started
            for node_id in cluster.ids:
                side._caught_up(node_id)
        finally:
            filling.set()
            sampler.join()
        time.sleep(5)
        rss = {n: node_mib(cluster.pid(n)) for n in cluster.ids}
        disk = {n: disk_bytes(cluster.root / n) for n in cluster.ids}

        leader = cluster.wait_for_leader(30)
        follower = next(n for n in cluster.ids if n != leader)
        cluster.stop(follower)
        started = time.perf_counter()
        cluster.start(follower)
        side._caught_up(follower, timeout=300)
        restart_one_s = time.perf_counter() - started

        cluster.stop()
        started = time.perf_counter()
        cluster.start()
        if cluster.wait_for_leader(300) is None or not cluster.wait_all_ready(300):
            raise RuntimeError(f"the cluster did not come back; see {cluster.root}")
        for node_id in cluster.ids:
            side._caught_up(node_id, timeout=300)
        restart_all_s = time.perf_counter() - started
        rss_after = {n: node_mib(cluster.pid(n)) for n in cluster.ids}
        return {"code_path": str(Path(raftq.engine.__file__).parent.parent), "stored": stored, "fill_s": round(fill_s, 2),
                "fill_msgs_per_s": round(stored / fill_s), "rss_mib_max": round(max(rss.values()), 1),
                "rss_mib_peak_while_filling": round(peak[0], 1),
                "rss_mib_max_after_restart": round(max(rss_after.values()), 1),
                "restart_one_s": round(restart_one_s, 2), "restart_all_s": round(restart_all_s, 2),
                "disk": disk}
    finally:
        side.stop()


def run_side(tree: Path, stored: int) -> dict:
    """Measure `tree`'s code in a child process; its nodes inherit the path."""
    work = Path(tempfile.mkdtemp(prefix="raftq-restart-"))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    try:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(work),
                               "--stored", str(stored)], cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the side in {tree} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure_ref(ref: str, stored: int) -> dict:
    tree = Path(tempfile.mkdtemp(prefix="raftq-restart-code-"))
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        side = run_side(tree, stored)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    side["code"] = ref
    print(f"{ref}: filled {side['stored']:,} in {side['fill_s']} s ({side['fill_msgs_per_s']:,}/s); "
          f"RSS max {side['rss_mib_max']} MiB idle, {side['rss_mib_peak_while_filling']} MiB peak; one follower restart {side['restart_one_s']} s; "
          f"whole cluster restart {side['restart_all_s']} s; disk {side['disk']}", flush=True)
    return side


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="main", help="git ref of the old code (default: main)")
    parser.add_argument("--candidate", default="HEAD", help="git ref of the new code (default: HEAD)")
    parser.add_argument("--stored", type=int, default=1_000_000)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.stored)))
        return

    old = measure_ref(args.baseline, args.stored)
    new = measure_ref(args.candidate, args.stored)
    ratios = {key: round(new[key] / old[key], 3) for key in ("restart_one_s", "restart_all_s", "rss_mib_max",
                                                             "rss_mib_peak_while_filling", "fill_msgs_per_s")
              if old[key]}
    print(json.dumps({"baseline": args.baseline, "candidate": args.candidate, "stored": args.stored,
                      "old": old, "new": new,
                      "new_vs_old": ratios}))


if __name__ == "__main__":
    main()

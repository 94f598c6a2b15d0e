"""A node of this tree against a node of another revision, side by side in one run.

    .venv/bin/python -m bench.node_compare [--baseline REV] [--seconds 5] [--reps 2] [--failovers 3] [--nodes 3]

Both revisions run as 3-node clusters (or `--nodes`: 1 is a single-node
cluster, a Raft group of one voter, without failover) on this machine at the same time, the
baseline from a detached git worktree (its code first on PYTHONPATH).  Every
workload alternates between them, repetition by repetition, so that drifting
load on a shared machine falls on both; figures are medians over the
repetitions, and each ratio is this tree's figure over the baseline's
(throughput above 1 and latency below 1 favour this tree). Run against
itself (`--baseline HEAD`) on the 2-core machine, one run of three reps gave
ratios from 0.77 to 1.35 (docs/benchmarks.md, "Entries without pickle"):
a change smaller than that needs more runs, or a figure that does not move
with the machine's load.

- lone put: one producer, one message per request, acked: p50 and p99, the
  server CPU per put (every process of every node), and the leader's ticks
  per put (its `raftq_raft_leader_ticks_total`: heartbeats included; a
  revision without that metric has no figure);
- 64 concurrent single-message puts (64 connections): messages/s;
- batched puts: 4 producers, 100 messages per request: messages/s;
- receive + ack: 8 consumers, 100 per receive: messages/s;
- leader reads: a queue's stats at the default consistency, one reader alone
  (p50) and 16 at once (reads/s);
- failover: kill -9 of the leader, then the next acked put: median seconds;
- idle: CPU seconds of the whole cluster (every process of every node) per 10 s;
- the leader's CPU under the 64-connection load, its engine apart from its fronts.

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.measure import cpu_seconds, group_pids, percentile, process_name  # noqa: E402
from bench.put_bench import failover_once, put_load, read_load, receive_ack_load  # noqa: E402
from raftq.client import Client  # noqa: E402
from raftq.local import LocalCluster  # noqa: E402

# The last commit before a node was split into an engine and fronts.
DEFAULT_BASELINE = "510d88b"


def log(message: str) -> None:
    print(message, flush=True)


def cluster_cpu(cluster: LocalCluster) -> float:
    return cpu_seconds(group_pids([p for p in map(cluster.pid, cluster.ids) if p is not None]))


def leader_ticks(cluster: LocalCluster) -> float | None:
    """The leader's count of the ticks it ran while leading, None where its release has none."""
    leader = cluster.wait_for_leader(30)
    with Client(cluster.url(leader), token=cluster.token, retry_for=0, timeout=30) as client:
        found = re.search(r"^raftq_raft_leader_ticks_total (\S+)$", client.metrics(), re.MULTILINE)
    return None if found is None else float(found.group(1))


async def idle_cpu(clusters: dict[str, LocalCluster], seconds: float) -> dict[str, float]:
    """CPU seconds per 10 s of each cluster while nothing is asked of any."""
    await asyncio.sleep(2.0)   # let start-up work (elections, first snapshots) settle
    before = {name: cluster_cpu(c) for name, c in clusters.items()}
    await asyncio.sleep(seconds)
    return {name: (cluster_cpu(c) - before[name]) * 10 / seconds for name, c in clusters.items()}


async def leader_split(cluster: LocalCluster, queue: str, seconds: float) -> dict:
    """The leader's CPU during 64 concurrent single puts: its engine (group 0's, the only
    group here), and its fronts; this tree's processes name themselves (engine/lifetime.py)."""
    leader = cluster.wait_for_leader(30)
    processes = group_pids([cluster.pid(leader)])
    [engine] = [p for p in processes if process_name(p) == "raftq-group-0"]
    fronts = [p for p in processes if (process_name(p) or "").startswith("raftq-front-")]
    engine0, fronts0 = cpu_seconds([engine]), cpu_seconds(fronts)
    started = time.perf_counter()
    rate, _ = await put_load(cluster.urls, cluster.token, queue, 64, 1, seconds)
    took = time.perf_counter() - started
    return {"msgs_per_s": rate, "engine_cores": (cpu_seconds([engine]) - engine0) / took,
            "fronts_cores": (cpu_seconds(fronts) - fronts0) / took}


async def one_round(cluster: LocalCluster, tag: str, seconds: float) -> dict:
    urls, token = cluster.urls, cluster.token
    ticks, cpu = leader_ticks(cluster), cluster_cpu(cluster)
    _, lone = await put_load(urls, token, f"lone-{tag}", 1, 1, seconds)
    cpu, ticks_after = cluster_cpu(cluster) - cpu, leader_ticks(cluster)
    single, _ = await put_load(urls, token, f"single-{tag}", 64, 1, seconds)
    batched, _ = await put_load(urls, token, f"batched-{tag}", 4, 100, seconds)
    drained = await receive_ack_load(urls, token, f"batched-{tag}", 8, seconds)
    _, lone_reads = await read_load(urls, token, f"batched-{tag}", 1, seconds)
    reads, _ = await read_load(urls, token, f"batched-{tag}", 16, seconds)
    figures = {"lone_put_p50_ms": percentile(lone, 50) * 1000, "lone_put_p99_ms": percentile(lone, 99) * 1000,
               "lone_put_server_cpu_ms": cpu * 1000 / len(lone),
               "single_64_msgs_per_s": single, "batched_msgs_per_s": batched, "receive_ack_msgs_per_s": drained,
               "lone_read_p50_ms": percentile(lone_reads, 50) * 1000, "reads_16_per_s": reads}
    if ticks is not None and ticks_after is not None:
        figures["lone_put_leader_ticks"] = (ticks_after - ticks) / len(lone)
    return figures


async def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="raftq-node-compare-") as tmp:
        tmp = Path(tmp)
        tree = tmp / "baseline-tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.baseline],
                       check=True, capture_output=True)
        # `python -m raftq` puts the working directory first on sys.path
        os.chdir(tmp)
        clusters: dict[str, LocalCluster] = {}
        try:
            clusters["baseline"] = LocalCluster.create(tmp / "baseline", args.nodes,
                                                       env={**os.environ, "PYTHONPATH": str(tree)})
            clusters["current"] = LocalCluster.create(tmp / "current", args.nodes,
                                                      env={**os.environ, "PYTHONPATH": str(ROOT)})
            for cluster in clusters.values():
                cluster.start()
            for name, cluster in clusters.items():
                if cluster.wait_for_leader(60) is None or not cluster.wait_all_ready(60):
                    raise SystemExit(f"{name} did not come up; see {cluster.root}")
            idle = await idle_cpu(clusters, args.idle_seconds)
            log("idle CPU-s per 10 s: " + ", ".join(f"{n} {v:.3f}" for n, v in idle.items()))
            rounds: dict[str, list[dict]] = {name: [] for name in clusters}
            for rep in range(args.reps):
                order = list(clusters) if rep % 2 == 0 else list(reversed(clusters))
                for name in order:
                    figures = await one_round(clusters[name], f"{rep}", args.seconds)
                    rounds[name].append(figures)
                    log(f"rep {rep} {name:<8} " + "  ".join(f"{k} {v:,.2f}" for k, v in figures.items()))
            split = await leader_split(clusters["current"], "split", args.seconds)
            log(f"current leader under 64 concurrent puts: engine {split['engine_cores']:.2f} cores, "
                f"fronts {split['fronts_cores']:.2f} cores")
            failovers: dict[str, list[float]] = {name: [] for name in clusters}
            for _ in range(args.failovers if args.nodes > 1 else 0):
                for name, cluster in clusters.items():
                    failovers[name].append(await failover_once(cluster))
            log("failover s: " + ", ".join(f"{n} {[round(t, 3) for t in ts]}" for n, ts in failovers.items()))
        finally:
            for cluster in clusters.values():
                cluster.close()
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           capture_output=True)
    figures: dict = {"baseline": args.baseline, "nodes": args.nodes}
    for name in clusters:
        for key in rounds[name][0]:
            figures[f"{name}_{key}"] = round(statistics.median(r[key] for r in rounds[name]), 3)
        if failovers[name]:
            figures[f"{name}_failover_median_s"] = round(statistics.median(failovers[name]), 3)
        figures[f"{name}_idle_cpu_s_per_10s"] = round(idle[name], 3)
    for key in [*rounds["current"][0], "failover_median_s", "idle_cpu_s_per_10s"]:
        if f"current_{key}" not in figures or f"baseline_{key}" not in figures:
            continue
        base = figures[f"baseline_{key}"]
        figures[f"{key}_ratio"] = round(figures[f"current_{key}"] / base, 3) if base else None
    figures["current_leader_engine_cores"] = round(split["engine_cores"], 3)
    figures["current_leader_fronts_cores"] = round(split["fronts_cores"], 3)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="the git revision to compare against")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each workload")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--nodes", type=int, choices=(1, 3, 5), default=3,
                        help="nodes of each cluster (1: one voter per Raft group; no failover)")
    figures = asyncio.run(run(parser.parse_args()))
    for key in sorted(k for k in figures if k.endswith("_ratio")):
        log(f"{key[:-6]:<28} current/baseline {figures[key]}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

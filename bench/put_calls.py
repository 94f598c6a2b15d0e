"""How many Python function calls a lone put costs each process of a node: counted, not timed.

    .venv/bin/python -m bench.put_calls [--puts 500] [--reps 3] [--wire http|stream]
                                        [--warm-seconds 8] [--baseline REV] [--top 12]

A lone put's latency is the CPU of the chain of processes it waits for
(`bench.put_cpu`), and on this 2-core shared machine a timed figure of one
run moves by a third (docs/benchmarks.md), more than a step on the put's
path changes it. A count moves far less: a fresh 3-node cluster takes
`--puts` lone puts (HTTP, or the streaming wire's `Producer` with window 1),
each awaited, while cProfile runs in every engine and front
(`bench/profiled_site`, switched on and off by signal around the puts).
For each process, by its role: Python function calls per put (a coroutine's
every resumption counts as a call, as cProfile counts it; built-in ones such
as `len` included), the Python functions with the most calls per put, and
those with the largest share of the process's profiled CPU time, their own
(that share is the profiler's: many small calls weigh more under it than
they cost without it). What the processes do
between puts (heartbeats, timers) is counted with the puts, and whether two
answers are read in one turn of a loop or two depends on the moment, so
one cluster's count moves by up to a tenth; `--reps` fresh clusters are
counted, and the medians reported (a kind of process over its repetitions:
the leader's engine, a follower's engine, the leader's front). `--warm-seconds` of lone puts first let the
cluster's features open (plain entries: engine/raft/node.py, item 19).

With `--baseline REV`, the same for that revision's tree (exported with
`git archive`; its node and client), the trees alternating repetition by
repetition, and each kind of process's calls per put as this tree's over
the baseline's.

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "bench" / "profiled_site"
BODY = "x" * 100


def _function(key: tuple) -> str:
    path, line, name = key
    return f"{Path(path).name}:{line}({name})" if line else name


def process_figures(path: str, puts: int, top: int) -> dict:
    stats = pstats.Stats(path)
    rows = [(_function(key), calls, own) for key, (_, calls, own, _, _) in stats.stats.items()]
    total_time = sum(own for _, _, own in rows) or 1.0
    python = [row for row in rows if ".py:" in row[0]]
    by_calls = sorted(python, key=lambda row: -row[1])[:top]
    by_time = sorted(rows, key=lambda row: -row[2])[:top]
    return {"calls_per_put": round(stats.total_calls / puts, 1),
            "most_calls": [[name, round(calls / puts, 1)] for name, calls, _ in by_calls],
            "most_time": [[name, round(100 * own / total_time, 1)] for name, _, own in by_time]}


async def lone_puts(cluster, wire: str, queue: str, *, count: int = 0, seconds: float = 0.0) -> None:
    """`count` lone puts, or as many as `seconds` allow, each awaited before the next."""
    from raftq.client import AsyncClient, Producer

    stop_at = time.perf_counter() + seconds
    done = 0

    def more() -> bool:
        return done < count if count else time.perf_counter() < stop_at

    if wire == "stream":
        async with Producer(cluster.urls, token=cluster.token, window=1, linger_ms=0) as producer:
            while more():
                await (await producer.send(queue, BODY))
                done += 1
        return
    client = AsyncClient(cluster.urls, token=cluster.token)
    try:
        while more():
            await client.put_batch(queue, [{"body": BODY}])
            done += 1
    finally:
        await client.close()


def one_tree(tree: Path, args) -> dict:
    """In the child: a cluster of `tree` (node and client), counted."""
    sys.path.insert(0, str(ROOT))
    from bench.measure import group_pids, process_name
    sys.path.insert(0, str(tree))
    from raftq.local import LocalCluster

    with tempfile.TemporaryDirectory(prefix="raftq-put-calls-") as tmp:
        profiles = Path(tmp) / "profiles"
        profiles.mkdir()
        os.chdir(tmp)    # `python -m raftq` puts the working directory first on sys.path
        cluster = LocalCluster.create(Path(tmp) / "cluster", 3, env={
            **os.environ, "PYTHONPATH": f"{SITE}:{tree}", "RAFTQ_PROFILE_DIR": str(profiles)})
        cluster.start()
        try:
            leader = cluster.wait_for_leader(60)
            if leader is None or not cluster.wait_all_ready(60):
                raise SystemExit(f"the cluster did not come up; see {cluster.root}")
            asyncio.run(lone_puts(cluster, args.wire, "warm-up", seconds=args.warm_seconds))
            roles = {}
            for node_id in cluster.ids:
                for pid in group_pids([cluster.pid(node_id)]):
                    name = (process_name(pid) or "").removeprefix("raftq-")
                    if name.startswith(("group-", "front-")):
                        roles[pid] = f"{'leader' if node_id == leader else 'follower ' + node_id} {name}"
            for pid in roles:
                os.kill(pid, signal.SIGUSR2)
            asyncio.run(lone_puts(cluster, args.wire, "lone", count=args.puts))
            for pid in roles:
                os.kill(pid, signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while len(glob.glob(str(profiles / "*.prof"))) < len(roles) and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            cluster.close()
        figures = {}
        for pid, role in sorted(roles.items(), key=lambda item: item[1]):
            found = glob.glob(str(profiles / f"*.{pid}.prof"))
            if found:
                figures[role] = process_figures(found[0], args.puts, args.top)
        return figures


def counted(tree: Path, args) -> dict:
    child = [sys.executable, str(Path(__file__).resolve()), "--child", str(tree), "--puts", str(args.puts),
             "--wire", args.wire, "--warm-seconds", str(args.warm_seconds), "--top", str(args.top)]
    done = subprocess.run(child, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def by_kind(figures: dict) -> dict[str, list[float]]:
    """Calls per put by the kind of process ("leader group-0", "follower group-0", ...): the
    followers' ids differ from one cluster to the next."""
    kinds: dict[str, list[float]] = {}
    for role, process in figures.items():
        kinds.setdefault(f"{role.split()[0]} {role.split()[-1]}", []).append(process["calls_per_put"])
    return kinds


def report(name: str, figures: dict) -> None:
    print(f"{name}, one repetition: Python calls per lone put")
    for role, process in figures.items():
        print(f"  {role:<24} {process['calls_per_put']:>8}")
    for role, process in figures.items():
        if process["calls_per_put"] < 100:
            continue
        print(f"  {role}: most calls per put: " + ", ".join(f"{fn} {n}" for fn, n in process["most_calls"]))
        print(f"  {role}: most profiled CPU time, own (%): " + ", ".join(f"{fn} {n}" for fn, n in process["most_time"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--puts", type=int, default=500)
    parser.add_argument("--reps", type=int, default=3, help="fresh clusters per tree; medians are reported")
    parser.add_argument("--wire", choices=("http", "stream"), default="http")
    parser.add_argument("--warm-seconds", type=float, default=8.0)
    parser.add_argument("--baseline", default=None, help="a git revision to count beside this tree")
    parser.add_argument("--top", type=int, default=12, help="functions listed per process")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_tree(Path(args.child), args)))
        return
    from bench.stream_compare import export

    with tempfile.TemporaryDirectory(prefix="raftq-put-calls-tree-") as tmp:
        trees = {"current": ROOT}
        if args.baseline:
            trees["baseline"] = export(args.baseline, Path(tmp) / "baseline")
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        for rep in range(args.reps):
            for name in (list(trees) if rep % 2 == 0 else list(reversed(trees))):
                runs[name].append(counted(trees[name], args))
                print(f"rep {rep} {name:<8} " + "  ".join(
                    f"{kind} {statistics.median(calls)}" for kind, calls in sorted(by_kind(runs[name][-1]).items())),
                    flush=True)
    result: dict = {"puts": args.puts, "reps": args.reps, "wire": args.wire, "baseline_rev": args.baseline}
    for name, figures in runs.items():
        report("this tree" if name == "current" else f"baseline {args.baseline}", figures[0])
        pooled: dict[str, list[float]] = {}
        for rep in figures:
            for kind, calls in by_kind(rep).items():
                pooled.setdefault(kind, []).extend(calls)
        result[f"{name}_calls_per_put"] = {kind: round(statistics.median(calls), 1) for kind, calls in sorted(pooled.items())}
        result[f"{name}_first_rep"] = figures[0]
    print("medians over the repetitions, calls per put: " + ", ".join(
        f"{kind} {calls}" for kind, calls in result["current_calls_per_put"].items()))
    if args.baseline:
        base = result["baseline_calls_per_put"]
        result["calls_per_put_ratio"] = {kind: round(calls / base[kind], 3)
                                         for kind, calls in result["current_calls_per_put"].items() if base.get(kind)}
        print("this tree ÷ baseline: " + ", ".join(f"{kind} {r}" for kind, r in result["calls_per_put_ratio"].items()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

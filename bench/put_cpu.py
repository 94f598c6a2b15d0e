"""Where a lone put's server CPU goes, process by process, and what each process costs idle.

    .venv/bin/python -m bench.put_cpu [--seconds 10] [--idle-seconds 10] [--floor-seconds 5] [--nodes 3]
                                      [--wire http|stream]

A fresh local cluster of this tree; one producer puts one message per
request and waits for its answer (as `bench.node_compare`'s lone put) for
`--seconds`; then nothing is asked for `--idle-seconds`. `--wire stream`
sends each message through the streaming wire's `Producer` instead (window
1, no linger: `bench compare`'s W1), one at a time, each awaited; the bare
aiohttp floor is then skipped (it is an HTTP request's). This process is
the client, and its own CPU per put is printed beside the servers': on
this machine it competes with them for the same cores. A lone put waits
for a chain of processes, one after another: the client, the leader's
front and engine, and the follower engine whose answer completes the
majority (with two followers needed, the slower of the two cheapest); the
CPU of that chain per put is printed beside p50, which it bounds from
below on an otherwise idle machine. For each process
of each node (the supervisor, each Raft group's engine, each front), by
its role (the group's leader or a follower): user and system CPU
microseconds per put, and CPU seconds per 10 s idle. Then, for
`--floor-seconds`, the same lone requests to a bare aiohttp server
(`bench.http_floor`): the leader's front's CPU per put over that floor says
how much of the front is raftq's own. What a change to a put's path (issue
50) must move is read here; `bench.node_compare` says whether it moved
against another revision.

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import http_floor  # noqa: E402
from bench.measure import group_pids, machine, percentile, process_name, user_system_by_process  # noqa: E402
from bench.put_bench import BODY, put_load  # noqa: E402
from raftq.client import Producer  # noqa: E402
from raftq.local import LocalCluster  # noqa: E402


def roles(cluster: LocalCluster, leader: str) -> dict[int, str]:
    """Each process of each node by what it is: "leader engine", "follower n2 front-0", ..."""
    named = {}
    for node_id in cluster.ids:
        role = "leader" if node_id == leader else f"follower {node_id}"
        for pid in group_pids([cluster.pid(node_id)]):
            name = (process_name(pid) or "gone").removeprefix("raftq-")
            named[pid] = f"{role} {'supervisor' if name == 'node' else name}"
    return named


def spent(before: dict, after: dict, named: dict[int, str]) -> dict[str, tuple[float, float]]:
    return {named[pid]: (after[pid][0] - before[pid][0], after[pid][1] - before[pid][1])
            for pid in named if pid in before and pid in after}


async def streamed_puts(cluster: LocalCluster, queue: str, seconds: float) -> list[float]:
    """Per-message latencies (s) of single messages through a Producer with
    window 1 and no linger, each awaited before the next is sent."""
    latencies = []
    async with Producer(cluster.urls, token=cluster.token, window=1, linger_ms=0) as producer:
        stop_at = time.perf_counter() + seconds
        while time.perf_counter() < stop_at:
            sent = time.perf_counter()
            await (await producer.send(queue, BODY))
            latencies.append(time.perf_counter() - sent)
    return latencies


async def lone_puts(cluster: LocalCluster, wire: str, queue: str, seconds: float) -> list[float]:
    if wire == "stream":
        return await streamed_puts(cluster, queue, seconds)
    return (await put_load(cluster.urls, cluster.token, queue, 1, 1, seconds))[1]


def own_cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def chain_cpu(per_put: dict[str, dict], client: dict, nodes: int) -> int:
    """CPU µs per put of the processes a lone put waits for in turn (the module's docstring)."""
    def cost(figures: dict) -> int:
        return figures["user_us"] + figures["system_us"]
    leader = sum(cost(f) for name, f in per_put.items()
                 if name.startswith("leader ") and not name.endswith("supervisor"))
    followers = sorted(cost(f) for name, f in per_put.items()
                       if name.startswith("follower ") and " group-" in name)
    return cost(client) + leader + (followers[nodes // 2 - 1] if nodes > 1 else 0)


async def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="raftq-put-cpu-") as tmp:
        os.chdir(tmp)    # `python -m raftq` puts the working directory first on sys.path
        cluster = LocalCluster.create(Path(tmp) / "cluster", args.nodes,
                                      env={**os.environ, "PYTHONPATH": str(ROOT)})
        cluster.start()
        try:
            leader = cluster.wait_for_leader(60)
            if leader is None or not cluster.wait_all_ready(60):
                raise SystemExit(f"the cluster did not come up; see {cluster.root}")
            await lone_puts(cluster, args.wire, "warm-up", 2.0)
            named = roles(cluster, leader)
            before, client_before = user_system_by_process(list(named)), own_cpu()
            latencies = await lone_puts(cluster, args.wire, "lone", args.seconds)
            after, client_after = user_system_by_process(list(named)), own_cpu()
            loaded = spent(before, after, named)
            await asyncio.sleep(2.0)     # the last puts' followers' applies, the next heartbeats
            before = user_system_by_process(list(named))
            await asyncio.sleep(args.idle_seconds)
            idle = spent(before, user_system_by_process(list(named)), named)
        finally:
            cluster.close()
    floor = await http_floor.measure(args.floor_seconds) if args.wire == "http" else None
    puts = len(latencies)
    per_put = {name: {"user_us": round(user * 1e6 / puts), "system_us": round(system * 1e6 / puts)}
               for name, (user, system) in sorted(loaded.items())}
    idle_per_10s = {name: round((user + system) * 10 / args.idle_seconds, 3) for name, (user, system) in sorted(idle.items())}
    leader_fronts = sum(cost["user_us"] + cost["system_us"] for name, cost in per_put.items()
                        if name.startswith("leader front-"))
    client = {"user_us": round((client_after[0] - client_before[0]) * 1e6 / puts),
              "system_us": round((client_after[1] - client_before[1]) * 1e6 / puts)}
    chain = chain_cpu(per_put, client, args.nodes)
    return {"wire": args.wire, "http_floor": floor,
            "leader_front_vs_http_floor":
                round(leader_fronts / (floor["user_us"] + floor["system_us"]), 2) if floor else None,
            "client_cpu_us_per_put": client, "chain_cpu_us_per_put": chain,
            "machine": machine(), "nodes": args.nodes, "puts": puts,
            "p50_ms": round(percentile(latencies, 50) * 1000, 3), "p99_ms": round(percentile(latencies, 99) * 1000, 3),
            "server_cpu_us_per_put": sum(f["user_us"] + f["system_us"] for f in per_put.values()),
            "per_put": per_put, "idle_cpu_s_per_10s": round(sum(idle_per_10s.values()), 3), "idle": idle_per_10s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the lone puts")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--floor-seconds", type=float, default=5.0, help="length of the bare aiohttp server's requests")
    parser.add_argument("--nodes", type=int, choices=(1, 3, 5), default=3)
    parser.add_argument("--wire", choices=("http", "stream"), default="http",
                        help="each put as an HTTP request, or through the streaming wire's Producer")
    figures = asyncio.run(run(parser.parse_args()))
    print(f"{figures['puts']} lone puts ({figures['wire']}): p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms, "
          f"server CPU {figures['server_cpu_us_per_put']} µs per put")
    print(f"the chain a put waits for (client, leader's front and engine, the follower completing the majority): "
          f"{figures['chain_cpu_us_per_put']} µs of CPU per put")
    print(f"{'process':<34} {'user µs/put':>12} {'system µs/put':>14} {'idle CPU-s/10 s':>16}")
    for name, cost in figures["per_put"].items():
        print(f"{name:<34} {cost['user_us']:>12} {cost['system_us']:>14} {figures['idle'].get(name, 0):>16}")
    client = figures["client_cpu_us_per_put"]
    print(f"{'the client (this process)':<34} {client['user_us']:>12} {client['system_us']:>14}")
    print(f"idle, every process: {figures['idle_cpu_s_per_10s']} CPU-s per 10 s")
    floor = figures["http_floor"]
    if floor:
        print(f"a bare aiohttp server: {floor['user_us']} µs user, {floor['system_us']} µs system per request; "
              f"the leader's front {figures['leader_front_vs_http_floor']}× that per put")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

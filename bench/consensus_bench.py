"""Commit latency and throughput of engine.raft.consensus: 3 node processes on 127.0.0.1, fsync on.

    .venv/bin/python bench/consensus_bench.py [--lone 1000] [--seconds 5] [--window 64]

The leader's process measures, through the commit callbacks: the latency of
one entry at a time (propose -> applied on the leader after a majority fsynced
it), then the throughput with --window entries in flight, for small and for
64 KiB entries. The last line printed is one JSON object with the figures.
"""

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SECRET = "bench-secret"


async def measure(node, args) -> dict:
    loop = asyncio.get_running_loop()

    async def one(entry):
        done = loop.create_future()
        node.propose(entry, lambda r, e: done.done() or done.set_result(e), term=node.term())
        try:
            return await asyncio.wait_for(done, 30)
        except asyncio.TimeoutError:
            return "no-callback"

    for _ in range(50):   # warm up connections and caches
        await one(b"w" * args.entry_bytes)
    lat = []
    errors = 0
    for i in range(args.lone):
        t0 = time.perf_counter()
        errors += await one(os.urandom(args.entry_bytes)) is not None
        lat.append(time.perf_counter() - t0)
    lat.sort()

    async def throughput(size):
        slots = asyncio.Semaphore(args.window)
        counted = [0, 0]

        def callback(result, error):
            counted[error is not None] += 1
            slots.release()

        payload = os.urandom(size)
        deadline = time.perf_counter() + args.seconds
        t0 = time.perf_counter()
        while time.perf_counter() < deadline:
            await slots.acquire()
            node.propose(payload, callback, term=node.term())
        for _ in range(args.window):
            await slots.acquire()
        elapsed = time.perf_counter() - t0
        return counted[0] / elapsed, counted[1]

    small_rate, small_err = await throughput(args.entry_bytes)
    big_rate, big_err = await throughput(64 * 1024)
    status = node.status()
    return {
        "nodes": 3,
        "fsync_policy": status["fsync_policy"],
        "entry_bytes": args.entry_bytes,
        "lone_commit_p50_ms": round(lat[len(lat) // 2] * 1000, 3),
        "lone_commit_p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1000, 3),
        "entries_per_s": round(small_rate),
        "entries_per_s_64k": round(big_rate),
        "mib_per_s_64k": round(big_rate * 64 / 1024, 1),
        "window": args.window,
        "errors": errors + small_err + big_err,
        "leader_journal_syncs": status["journal_syncs"],
        "leader_log_entries": status["log_entries"],
    }


async def run_node(args) -> None:
    from raftq.engine.config import Peer
    from raftq.engine.raft.consensus import Consensus
    peers = [Peer(f"n{i}", a) for i, a in enumerate(args.addrs.split(","))]
    me = peers[args.node]
    applied = [0]

    def apply(entry):
        applied[0] += 1
        return applied[0]

    node = Consensus(self_peer=me, peers=[p for p in peers if p != me], data_dir=Path(args.dir) / me.id,
                     apply=apply, write_snapshot=lambda out: None, restore=lambda b: None, secret=SECRET,
                     compaction_min_entries=100_000)
    loop = asyncio.get_running_loop()
    node.start(loop)   # ticks on this loop, as in an engine
    try:
        while node.status()["role"] != "leader" and node.leader_id() is None:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)
        if node.status()["role"] == "leader":
            print("RESULT " + json.dumps(await measure(node, args)), flush=True)
        else:
            print("FOLLOWER", flush=True)
        stdin_closed = asyncio.Event()
        loop.add_reader(0, lambda: os.read(0, 4096) or stdin_closed.set())
        await stdin_closed.wait()
        loop.remove_reader(0)
    finally:
        await node.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lone", type=int, default=1000, help="sequential entries for the latency figures")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput run")
    parser.add_argument("--window", type=int, default=64, help="entries in flight during throughput runs")
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--node", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--addrs", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.node is not None:
        asyncio.run(run_node(args))
        return

    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
    addrs = ",".join("127.0.0.1:%d" % s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    data = tempfile.mkdtemp(prefix="consensus-bench-", dir=os.environ.get("BENCH_DIR"))
    procs = []
    try:
        for i in range(3):
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--node", str(i), "--addrs", addrs, "--dir", data,
                 "--lone", str(args.lone), "--seconds", str(args.seconds), "--window", str(args.window),
                 "--entry-bytes", str(args.entry_bytes)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        result = None
        for p in procs:
            line = p.stdout.readline().strip()
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(data, ignore_errors=True)
    if result is None:
        sys.exit("no node reported a result (no stable leader?)")
    print(f"lone-entry commit latency ({result['entry_bytes']} B, fsync on, 3 nodes): "
          f"p50 {result['lone_commit_p50_ms']} ms, p99 {result['lone_commit_p99_ms']} ms")
    print(f"throughput with {result['window']} in flight: {result['entries_per_s']} entries/s of "
          f"{result['entry_bytes']} B; {result['entries_per_s_64k']} entries/s of 64 KiB "
          f"({result['mib_per_s_64k']} MiB/s); errors {result['errors']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

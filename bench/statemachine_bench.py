"""Apply throughput of the queue state machine, and snapshot cost, by queue depth.

Every command carries a batch of 100 messages (or receipts) of 100 bytes and
travels as the node sends it: encoded into a log entry with `encode_entry`,
applied with `apply_entry`.  Only `apply_entry` is timed; encoding belongs to
the leader's submit path.  Between timed commands the queue is brought back to
its depth by untimed commands, so each figure is the cost at that depth, not
at a depth that drifts while it is measured.

Workloads, each at a depth of 1 k, 100 k and 1 M stored messages:
- put:          put 100;                                  counts 100 messages
- receive+ack:  receive 100, ack their 100 receipts;      counts 100 messages
- mixed:        put 100, receive 100, ack 90, nack 10 (they come back), and a
                tick every 10 rounds;                       counts 100 messages

Each workload runs seven times and the best run counts (as `timeit` does):
other processes share the two cores, and the least disturbed run is the
closest to the machine's own cost.  The cyclic garbage collector stays on, as
in a node; it is run once after each fill so that no run pays for the fill.

Then snapshot and restore at 1 M messages.  The last line printed is one JSON
object with every figure.  Run: .venv/bin/python bench/statemachine_bench.py
"""

import gc
import json
import os
import sys
import time
from itertools import islice

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from statemachine import StateMachine, encode_entry, is_error  # noqa: E402

BATCH = 100
BODY = bytes(range(100))
DEPTHS = (1_000, 100_000, 1_000_000)
ROUNDS = {"put": 500, "receive_ack": 500, "mixed": 300}   # rounds of 100 messages
REPEATS = 7
QUEUE = "bench"
# A long lease: nothing may expire while a round is measured.
LEASE_MS = 3_600_000


class Bench:
    def __init__(self):
        self.sm = StateMachine()
        self.now = 1_000_000
        self.elapsed = 0.0
        self.timed(self.entry({"op": "create_queue", "queue": QUEUE, "config": {"lease_ms": LEASE_MS}}))

    def entry(self, *commands) -> bytes:
        self.now += 1
        return encode_entry([{**c, "now_ms": self.now} for c in commands])

    def apply(self, entry: bytes) -> list:
        results = self.sm.apply_entry(entry)
        for result in results:
            if is_error(result):
                raise RuntimeError(f"the bench broke a rule: {result}")
        return results

    def timed(self, entry: bytes) -> list:
        start = time.perf_counter()
        results = self.apply(entry)
        self.elapsed += time.perf_counter() - start
        return results

    # ---- commands --------------------------------------------------------------------
    @staticmethod
    def put():
        return {"op": "put", "queue": QUEUE, "messages": [{"body": BODY}] * BATCH}

    @staticmethod
    def receive(n=BATCH):
        return {"op": "receive", "queue": QUEUE, "group": "default", "max": n}

    @staticmethod
    def settle(op, receipts):
        return {"op": op, "queue": QUEUE, "receipts": receipts}

    def depth(self) -> int:
        return len(self.sm.queues[QUEUE].messages)

    def fill(self, depth: int) -> None:
        """Untimed puts up to `depth`."""
        while self.depth() < depth:
            self.apply(self.entry(self.put()))

    def trim(self, depth: int) -> None:
        """Untimed: commit the oldest messages away until `depth` are left."""
        queue = self.sm.queues[QUEUE]
        extra = len(queue.messages) - depth
        if extra > 0:
            upto = next(islice(queue.messages, extra - 1, None))
            self.apply(self.entry({"op": "commit", "queue": QUEUE, "group": "default", "seq": upto}))

    # ---- workloads -------------------------------------------------------------------------
    def run_put(self, depth: int, rounds: int) -> float:
        self.elapsed = 0.0
        for _ in range(rounds):
            self.timed(self.entry(self.put()))
            self.trim(depth)
        return rounds * BATCH / self.elapsed

    def run_receive_ack(self, depth: int, rounds: int) -> float:
        self.elapsed = 0.0
        for _ in range(rounds):
            self.fill(depth + BATCH)
            [got] = self.timed(self.entry(self.receive()))
            receipts = [m["receipt"] for m in got["messages"]]
            assert len(receipts) == BATCH
            self.timed(self.entry(self.settle("ack", receipts)))
        return rounds * BATCH / self.elapsed

    def run_mixed(self, depth: int, rounds: int) -> float:
        self.elapsed = 0.0
        for i in range(rounds):
            self.timed(self.entry(self.put()))
            [got] = self.timed(self.entry(self.receive()))
            receipts = [m["receipt"] for m in got["messages"]]
            self.timed(self.entry(self.settle("ack", receipts[:90]), self.settle("nack", receipts[90:])))
            if i % 10 == 9:
                self.timed(self.entry({"op": "tick"}))
            self.trim(depth)
        return rounds * BATCH / self.elapsed


def measure_depth(depth: int) -> dict:
    bench = Bench()
    bench.fill(depth)
    gc.collect()
    runs = {"put": bench.run_put, "receive_ack": bench.run_receive_ack, "mixed": bench.run_mixed}
    best = {name: max(run(depth, ROUNDS[name]) for _ in range(REPEATS)) for name, run in runs.items()}
    return {**best, "bench": bench}


def measure_snapshot(bench: Bench) -> dict:
    bench.trim(1_000_000)
    assert bench.depth() == 1_000_000
    snapshot_s = restore_s = float("inf")
    for _ in range(2):
        gc.collect()
        start = time.perf_counter()
        data = bench.sm.snapshot()
        snapshot_s = min(snapshot_s, time.perf_counter() - start)
        restored = StateMachine()
        start = time.perf_counter()
        restored.restore(data)
        restore_s = min(restore_s, time.perf_counter() - start)
        if restored.snapshot() != data:
            raise RuntimeError("the restored machine differs from the original")
        del restored
    return {"snapshot_s": snapshot_s, "restore_s": restore_s, "bytes": len(data)}


def main() -> None:
    started = time.perf_counter()
    results = {}
    for depth in DEPTHS:
        results[depth] = measure_depth(depth)
        print(f"measured depth {depth:>9,}  ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
        if depth != DEPTHS[-1]:
            del results[depth]["bench"]
    snap = measure_snapshot(results[DEPTHS[-1]].pop("bench"))

    names = {"put": "put", "receive_ack": "receive+ack", "mixed": "mixed"}
    print(f"state machine apply throughput, messages/s (batches of {BATCH} x {len(BODY)} B, via apply_entry)")
    print(f"{'workload':<14}" + "".join(f"{f'depth {d:,}':>16}" for d in DEPTHS) + f"{'1M / 1k':>10}")
    for key, label in names.items():
        row = "".join(f"{results[d][key]:>16,.0f}" for d in DEPTHS)
        print(f"{label:<14}{row}{results[1_000_000][key] / results[1_000][key]:>10.2f}")
    print(f"snapshot of 1,000,000 messages: {snap['snapshot_s']:.2f} s, {snap['bytes'] / 1e6:.1f} MB; "
          f"restore {snap['restore_s']:.2f} s")
    print(f"total bench time {time.perf_counter() - started:.0f} s")
    print(json.dumps({
        "put_msgs_per_s": round(results[1_000]["put"]),
        "receive_ack_msgs_per_s": round(results[1_000]["receive_ack"]),
        "mixed_msgs_per_s": round(results[1_000]["mixed"]),
        "put_msgs_per_s_100k_depth": round(results[100_000]["put"]),
        "receive_ack_msgs_per_s_100k_depth": round(results[100_000]["receive_ack"]),
        "mixed_msgs_per_s_100k_depth": round(results[100_000]["mixed"]),
        "put_msgs_per_s_1m_depth": round(results[1_000_000]["put"]),
        "receive_ack_msgs_per_s_1m_depth": round(results[1_000_000]["receive_ack"]),
        "mixed_msgs_per_s_1m_depth": round(results[1_000_000]["mixed"]),
        "snapshot_1m_s": round(snap["snapshot_s"], 3),
        "restore_1m_s": round(snap["restore_s"], 3),
        "snapshot_1m_bytes": snap["bytes"],
    }))


if __name__ == "__main__":
    main()

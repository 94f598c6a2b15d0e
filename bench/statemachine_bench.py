"""Apply throughput of the queue state machine, its memory per stored message,
and snapshot cost, by queue depth.

Every command carries a batch of 100 messages (or receipts) of 100 bytes and
travels as the node sends it: encoded into a log entry with `encode_entry`,
applied with `apply_entry` and the entry's log index, as a node applies it:
stored bodies are references into their entries (which a node keeps in its
log, not in the state machine's memory).  Only `apply_entry` is timed; encoding belongs to
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

Then snapshot and restore at 1 M messages, and memory: a fresh process puts
1 M messages (batches of 100, via apply_entry) and reports its resident-memory
growth per message; another restores their snapshot and reports the same;
a third stages 1 M messages (stages of 100, committed 100 stages at a time,
as the Spark sink writes) and reports the same once they are committed.

And timers among 10 000 queues, each holding one lease: the leader's
`next_timer` read and a tick that one lease falls due in, the two questions
the engine's loop asks (statemachine/due.py).

And issue 51's workloads (priorities, redelivery back-off), at their depths:
- consume, 1 M:   receive+ack at a depth of 1 M messages of one priority, and
                  of 1 M messages of priorities 0-9 mixed at random (the refill
                  too): a receive takes the highest first (statemachine/ready.py);
- nack, 100 k:    receive 100, nack the 100 without a delay, a tick every 10
                  rounds; without a back-off policy (they are ready again at
                  once) and with one (1 ms doubling to 1 s: each nack computes a
                  delay and parks the message in the group's delayed set).
A tree whose state machine knows neither (an older REF of --against) has no
figure for the mixed priorities or the back-off: the comparison then sets the
working tree's mixed priorities against that tree's one priority.

    .venv/bin/python bench/statemachine_bench.py
    .venv/bin/python bench/statemachine_bench.py --against main [REF ...]

`--against` measures the statemachine/ of each git REF (exported with `git
archive`) and of the working tree in the same run, in child processes that
take turns, and reports each figure per tree with the ratio of each tree to
the one before it (so a list of commits gives each commit's effect) and of
the working tree to the first REF.

The last line printed is one JSON object with every figure.
"""

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The statemachine/ measured: the working tree's, or an exported REF's in a child of --against.
TREE = os.environ.get("RAFTQ_BENCH_TREE", REPO)
sys.path[:0] = [TREE, REPO]

from bench.measure import memory_mib  # noqa: E402
from raftq.statemachine import StateMachine, encode_entry, is_error  # noqa: E402

BATCH = 100
BODY = bytes(range(100))
DEPTHS = (1_000, 100_000, 1_000_000)
ROUNDS = {"put": 500, "receive_ack": 500, "mixed": 300}   # rounds of 100 messages
REPEATS = 7
QUEUE = "bench"
# A long lease: nothing may expire while a round is measured.
LEASE_MS = 3_600_000


class Bench:
    def __init__(self, config=None, priorities: bool = False):
        self.sm = StateMachine()
        self.now = 1_000_000
        self.index = 0
        self.elapsed = 0.0
        # mixed priorities: each message's drawn from a fixed sequence, the same in every tree
        self.priorities = random.Random(51) if priorities else None
        self.timed(self.entry({"op": "create_queue", "queue": QUEUE,
                               "config": {"lease_ms": LEASE_MS, **(config or {})}}))

    def entry(self, *commands) -> bytes:
        self.now += 1
        return encode_entry([{**c, "now_ms": self.now} for c in commands])

    def apply(self, entry: bytes) -> list:
        self.index += 1
        results = self.sm.apply_entry(entry, self.index)
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
    def put(self):
        if self.priorities is None:
            return {"op": "put", "queue": QUEUE, "messages": [{"body": BODY}] * BATCH}
        draw = self.priorities.randrange
        return {"op": "put", "queue": QUEUE, "messages": [{"body": BODY, "priority": draw(10)} for _ in range(BATCH)]}

    @staticmethod
    def receive(n=BATCH):
        return {"op": "receive", "queue": QUEUE, "group": "default", "max": n}

    @staticmethod
    def settle(op, receipts):
        return {"op": op, "queue": QUEUE, "receipts": receipts}

    # Through the machine's reads, not its attributes: --against runs this
    # against other trees' statemachine/, whose queues may be built otherwise.
    def depth(self) -> int:
        return self.sm.queue_info(QUEUE)["stats"]["depth"]

    def fill(self, depth: int) -> None:
        """Untimed puts up to `depth`."""
        while self.depth() < depth:
            self.apply(self.entry(self.put()))

    def trim(self, depth: int) -> None:
        """Untimed: commit the oldest messages away until `depth` are left."""
        extra = self.depth() - depth
        if extra > 0:
            # the default group, the only one, holds every stored message
            upto = self.sm.browse(QUEUE, "default", 0, extra)["messages"][-1]["seq"]
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

    def run_nack(self, depth: int, rounds: int) -> float:
        self.elapsed = 0.0
        for i in range(rounds):
            self.fill(depth)
            [got] = self.timed(self.entry(self.receive()))
            self.timed(self.entry(self.settle("nack", [m["receipt"] for m in got["messages"]])))
            if i % 10 == 9:
                self.timed(self.entry({"op": "tick"}))
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


def measure_depth(depth: int, repeats: int = REPEATS) -> dict:
    bench = Bench()
    bench.fill(depth)
    gc.collect()
    runs = {"put": bench.run_put, "receive_ack": bench.run_receive_ack, "mixed": bench.run_mixed}
    best = {name: max(run(depth, ROUNDS[name]) for _ in range(repeats)) for name, run in runs.items()}
    return {**best, "bench": bench}


# ---- issue 51: priorities and back-off -----------------------------------------------------------
FEATURE_DEPTHS = {"consume": 1_000_000, "nack": 100_000}
FEATURE_ROUNDS = {"consume": 300, "nack": 300}
BACKOFF = {"initial_ms": 1, "factor": 2, "max_ms": 1_000}
FEATURE_FIGURES = ["consume_one_priority_1m", "consume_mixed_priorities_1m", "nack_without_backoff_100k",
                   "nack_with_backoff_100k"]


def knows_issue_51() -> bool:
    """Whether this tree's state machine takes priorities and back-off policies."""
    answer = StateMachine().apply({"op": "put", "queue": QUEUE, "messages": [{"body": b"", "priority": 1}],
                                   "now_ms": 1})
    return not is_error(answer)


def measure_features(repeats: int = REPEATS) -> dict:
    """Messages/s of issue 51's workloads (best of `repeats`); None where the tree lacks the feature."""
    known = knows_issue_51()
    figures = {}
    for name, options, workload in (
            ("consume_one_priority_1m", {}, "consume"),
            ("consume_mixed_priorities_1m", {"priorities": True}, "consume"),
            ("nack_without_backoff_100k", {}, "nack"),
            ("nack_with_backoff_100k", {"config": {"backoff": BACKOFF}}, "nack")):
        if options and not known:
            figures[name] = None
            continue
        bench = Bench(**options)
        bench.fill(FEATURE_DEPTHS[workload])
        gc.collect()
        run = bench.run_receive_ack if workload == "consume" else bench.run_nack
        figures[name] = max(run(FEATURE_DEPTHS[workload], FEATURE_ROUNDS[workload]) for _ in range(repeats))
        del bench
    return figures


def measure_snapshot(bench: Bench) -> dict:
    bench.trim(MEMORY_MESSAGES)
    assert bench.depth() == MEMORY_MESSAGES
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


# ---- timers among many queues -----------------------------------------------------------------
TIMER_QUEUES = 10_000
TIMER_REPEATS = 20


def measure_timers() -> dict:
    """Best seconds of a `next_timer` read, and of a tick that one lease falls due in, with
    TIMER_QUEUES queues each holding one lease that ends a millisecond after the one before."""
    sm = StateMachine()
    now = 1_000_000
    for i in range(TIMER_QUEUES):
        name = f"timers-{i}"
        sm.apply_entry(encode_entry([
            {"op": "create_queue", "queue": name, "config": {"lease_ms": LEASE_MS + i}, "now_ms": now},
            {"op": "put", "queue": name, "messages": [{"body": BODY}] * 2, "now_ms": now},
            {"op": "receive", "queue": name, "group": "default", "max": 1, "now_ms": now}]))
    read_s = tick_s = float("inf")
    for i in range(TIMER_REPEATS):
        start = time.perf_counter()
        sm.read("next_timer")
        read_s = min(read_s, time.perf_counter() - start)
        tick = encode_entry([{"op": "tick", "now_ms": now + LEASE_MS + i}])
        start = time.perf_counter()
        sm.apply_entry(tick)
        tick_s = min(tick_s, time.perf_counter() - start)
    if sm.read("next_timer") != now + LEASE_MS + TIMER_REPEATS:
        raise RuntimeError("the ticks did not end one lease each")
    return {"next_timer_10k_queues_s": read_s, "tick_10k_queues_s": tick_s}


# ---- memory, each in a fresh process so that no freed memory is reused ----------------------
MEMORY_MESSAGES = 1_000_000


def rss_bytes() -> float:
    gc.collect()
    return memory_mib([os.getpid()]) * 2**20     # (PSS: what the process alone holds)


def memory_of_puts(snapshot_path: str) -> dict:
    """Resident memory per message of 1 M put messages; leaves their snapshot at `snapshot_path`."""
    before = rss_bytes()
    bench = Bench()
    bench.fill(MEMORY_MESSAGES)
    per_message = (rss_bytes() - before) / MEMORY_MESSAGES
    start = time.perf_counter()
    data = bench.sm.snapshot()
    snapshot_s = time.perf_counter() - start
    with open(snapshot_path, "wb") as f:
        f.write(data)
    return {"put_rss_bytes_per_msg": per_message, "snapshot_s": snapshot_s, "snapshot_bytes": len(data)}


# Staged as the Spark sink writes: stages of one chunk of BATCH messages, a commit of this many at once
STAGES_PER_COMMIT = 100


def memory_of_staged_commits() -> dict:
    """Resident memory per message of 1 M messages staged and committed (the Spark sink's
    exactly-once writes), each stage entry applied with its log index as a node applies it."""
    before = rss_bytes()
    bench = Bench()
    batch = 0
    while bench.depth() < MEMORY_MESSAGES:
        tokens = [f"t{batch}-{n}" for n in range(STAGES_PER_COMMIT)]
        for token in tokens:
            bench.apply(bench.entry({"op": "stage", "producer": "bench", "token": token, "chunk": 0,
                                     "queue": QUEUE, "messages": [{"body": BODY}] * BATCH}))
        bench.apply(bench.entry({"op": "stage_commit", "producer": "bench", "batch": batch,
                                 "parts": [{"token": token, "chunks": 1} for token in tokens]}))
        batch += 1
    return {"staged_rss_bytes_per_msg": (rss_bytes() - before) / MEMORY_MESSAGES}


def memory_of_restore(snapshot_path: str) -> dict:
    """Resident memory per message, and time, of restoring that snapshot."""
    before = rss_bytes()     # (before the snapshot's bytes, which are freed again below)
    with open(snapshot_path, "rb") as f:
        data = f.read()
    machine = StateMachine()
    start = time.perf_counter()
    machine.restore(data)
    restore_s = time.perf_counter() - start
    del data
    return {"restored_rss_bytes_per_msg": (rss_bytes() - before) / MEMORY_MESSAGES, "restore_s": restore_s}


def child(tree: str, *args: str) -> dict:
    """Run this script's --child mode on `tree`'s statemachine/; its JSON line."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args],
                         env={**os.environ, "RAFTQ_BENCH_TREE": tree}, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure_memory(tree: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="raftq-smbench-") as scratch:
        path = os.path.join(scratch, "snapshot")
        return {**child(tree, "memory", path), **child(tree, "restore", path), **child(tree, "staged", "-")}


def run_child(args: list) -> None:
    kind, arg = args
    if kind == "depth":
        figures = measure_depth(int(arg), repeats=COMPARE_REPEATS)
        del figures["bench"]
    elif kind == "timers":
        figures = measure_timers()
    elif kind == "features":
        figures = measure_features(repeats=COMPARE_REPEATS)
    elif kind == "memory":
        figures = memory_of_puts(arg)
    elif kind == "staged":
        figures = memory_of_staged_commits()
    else:
        figures = memory_of_restore(arg)
    print(json.dumps(figures))


# ---- one tree against others -----------------------------------------------------------------
COMPARE_DEPTHS = (1_000, 100_000)
COMPARE_REPEATS = 2        # per child; the children of each tree take turns over --rounds
COMPARE_FIGURES = [(f"{w}_msgs_per_s_{d // 1000}k_depth", w, d)
                   for d in COMPARE_DEPTHS for w in ("put", "receive_ack", "mixed")]
MEMORY_FIGURES = ["put_rss_bytes_per_msg", "restored_rss_bytes_per_msg", "staged_rss_bytes_per_msg", "snapshot_s",
                  "restore_s"]
TIMER_FIGURES = ["next_timer_10k_queues_s", "tick_10k_queues_s"]
LOWER_IS_BETTER = {*MEMORY_FIGURES, *TIMER_FIGURES}


def export(ref: str, into: str) -> str:
    tree = os.path.join(into, ref.replace("/", "_"))
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", REPO, "archive", ref, "statemachine"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def compare(refs: list, rounds: int) -> None:
    started = time.perf_counter()
    labels = [*refs, "working tree"]
    with tempfile.TemporaryDirectory(prefix="raftq-smbench-trees-") as scratch:
        trees = [export(ref, scratch) for ref in refs] + [REPO]
        figures = {label: {} for label in labels}
        for turn in range(rounds):
            for depth in COMPARE_DEPTHS:
                # each round starts with another tree, so none always runs first
                order = list(range(len(trees)))[turn % len(trees):] + list(range(len(trees)))[:turn % len(trees)]
                for i in order:
                    got = child(trees[i], "depth", str(depth))
                    for name, workload, d in COMPARE_FIGURES:
                        if d == depth:
                            figures[labels[i]][name] = max(figures[labels[i]].get(name, 0), got[workload])
            for i in list(range(len(trees)))[turn % len(trees):] + list(range(len(trees)))[:turn % len(trees)]:
                for name, value in child(trees[i], "features", "-").items():
                    best = figures[labels[i]].get(name)
                    figures[labels[i]][name] = value if best is None or (value or 0) > best else best
            print(f"round {turn + 1}/{rounds} done ({time.perf_counter() - started:.0f} s)", file=sys.stderr,
                  flush=True)
        for label, tree in zip(labels, trees):
            figures[label].update(measure_memory(tree))
            figures[label].update(child(tree, "timers", "-"))
    names = [name for name, _, _ in COMPARE_FIGURES] + FEATURE_FIGURES + MEMORY_FIGURES + TIMER_FIGURES

    def ratio(new, old):
        return round(new / old, 3) if new is not None and old else None
    steps = {f"{labels[i + 1]} / {labels[i]}": {n: ratio(figures[labels[i + 1]][n], figures[labels[i]][n])
                                                for n in names}
             for i in range(len(labels) - 1)}
    overall = {n: ratio(figures[labels[-1]][n], figures[labels[0]][n]) for n in names}
    print(f"state machine, {' vs '.join(labels)} (throughput msgs/s: higher is better; memory per message "
          f"and seconds: lower is better); best of {rounds} rounds x {COMPARE_REPEATS} runs")
    width = max(12, *(len(label) for label in labels)) + 2
    print(f"{'figure':<34}" + "".join(f"{label[:width - 2]:>{width}}" for label in labels)
          + "".join(f"{'step ' + str(i + 1):>9}" for i in range(len(steps))) + f"{'last/first':>12}")
    def cell(value, width: int, form: str) -> str:
        return f"{'-':>{width}}" if value is None else f"{value:>{width}{form}}"
    for n in names:
        form = ",.4f" if n in TIMER_FIGURES else ",.1f"
        print(f"{n:<34}" + "".join(cell(figures[label][n], width, form) for label in labels)
              + "".join(cell(step[n], 9, ".3f") for step in steps.values()) + cell(overall[n], 12, ".3f"))
    for i, key in enumerate(steps):
        print(f"step {i + 1}: {key}")
    # priorities against a tree without them: its one priority is what the mixed ones replace
    base = figures[labels[0]]
    if base.get("consume_mixed_priorities_1m") is None:
        overall["consume_mixed_priorities_1m_vs_one_priority_of_first"] = ratio(
            figures[labels[-1]]["consume_mixed_priorities_1m"], base["consume_one_priority_1m"])
        overall["nack_with_backoff_100k_vs_without_of_first"] = ratio(
            figures[labels[-1]]["nack_with_backoff_100k"], base["nack_without_backoff_100k"])
        print(f"working tree's mixed priorities / {labels[0]}'s one priority, consume at 1 M: "
              f"{overall['consume_mixed_priorities_1m_vs_one_priority_of_first']:.3f}; nacks with back-off / "
              f"{labels[0]}'s without: {overall['nack_with_backoff_100k_vs_without_of_first']:.3f}")
    print(f"total bench time {time.perf_counter() - started:.0f} s")
    print(json.dumps({"trees": labels, "figures": figures, "ratio_steps": steps,
                      "ratio_last_vs_first": overall, "lower_is_better": sorted(LOWER_IS_BETTER)}))


def main() -> None:
    started = time.perf_counter()
    results = {}
    for depth in DEPTHS:
        results[depth] = measure_depth(depth)
        print(f"measured depth {depth:>9,}  ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
        if depth != DEPTHS[-1]:
            del results[depth]["bench"]
    snap = measure_snapshot(results[DEPTHS[-1]].pop("bench"))
    memory = measure_memory(TREE)
    timers = measure_timers()
    features = measure_features()

    names = {"put": "put", "receive_ack": "receive+ack", "mixed": "mixed"}
    print(f"state machine apply throughput, messages/s (batches of {BATCH} x {len(BODY)} B, via apply_entry)")
    print(f"{'workload':<14}" + "".join(f"{f'depth {d:,}':>16}" for d in DEPTHS) + f"{'1M / 1k':>10}")
    for key, label in names.items():
        row = "".join(f"{results[d][key]:>16,.0f}" for d in DEPTHS)
        print(f"{label:<14}{row}{results[1_000_000][key] / results[1_000][key]:>10.2f}")
    print(f"snapshot of 1,000,000 messages: {snap['snapshot_s']:.2f} s, {snap['bytes'] / 1e6:.1f} MB; "
          f"restore {snap['restore_s']:.2f} s")
    print(f"resident memory per stored message ({MEMORY_MESSAGES:,} in a fresh process): "
          f"{memory['put_rss_bytes_per_msg']:.0f} B put, {memory['restored_rss_bytes_per_msg']:.0f} B restored, "
          f"{memory['staged_rss_bytes_per_msg']:.0f} B staged and committed")
    print(f"timers among {TIMER_QUEUES:,} queues holding leases: next_timer "
          f"{timers['next_timer_10k_queues_s'] * 1e3:.3f} ms, a tick with one due {timers['tick_10k_queues_s'] * 1e3:.3f} ms")
    print(f"receive+ack at 1,000,000 deep: {features['consume_one_priority_1m']:,.0f} msgs/s of one priority, "
          f"{features['consume_mixed_priorities_1m']:,.0f} of ten mixed; receive+nack at 100,000 deep: "
          f"{features['nack_without_backoff_100k']:,.0f} msgs/s without back-off, "
          f"{features['nack_with_backoff_100k']:,.0f} with")
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
        "put_rss_bytes_per_msg_1m": round(memory["put_rss_bytes_per_msg"], 1),
        "restored_rss_bytes_per_msg_1m": round(memory["restored_rss_bytes_per_msg"], 1),
        "staged_rss_bytes_per_msg_1m": round(memory["staged_rss_bytes_per_msg"], 1),
        "next_timer_10k_queues_s": round(timers["next_timer_10k_queues_s"], 6),
        "tick_10k_queues_s": round(timers["tick_10k_queues_s"], 6),
        **{name: round(value) for name, value in features.items()},
    }))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", nargs="+", metavar="REF",
                        help="git refs whose statemachine/ to measure before the working tree's, in turns")
    parser.add_argument("--rounds", type=int, default=3, help="turns of every tree, with --against")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        run_child(options.child)
    elif options.against:
        compare(options.against, options.rounds)
    else:
        main()

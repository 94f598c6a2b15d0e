"""The dedup window: what a remembered id costs, and put throughput with ids,
for the working tree's statemachine/ and a git ref's, side by side.

- bytes per id: what a state machine holds (tracemalloc: exact, no timing)
  after --ids puts with ids, less what it holds after the same puts without
  ids; every message is committed away, so only the remembered ids differ;
- put throughput with ids: puts of 100 messages of 100 B, each with a fresh
  32-character id (the clients send `uuid4().hex`), into a queue whose
  dedup window holds --window-ids ids (the window is --window-ids / 100 ms
  and each put is 1 ms later than the last, so each put also forgets 100
  ids); only `apply_entry` is timed, and the queue is kept at 1 000
  messages by untimed commits. The same puts without ids, for reference.

Each tree runs in its own child processes (statemachine/ exported from the
ref with `git archive`), the trees taking turns for --rounds rounds; the
best run of each figure counts (other processes share the cores).

--instructions counts instead what a put with ids costs under valgrind's
callgrind, which no other process disturbs: 200 puts of 100 messages with
ids, each followed by a commit, into a window of 10 000 ids, less the same
run without those 200 puts, per message.

    .venv/bin/python bench/dedup_bench.py                  # against 8baf810, ids kept whole
    .venv/bin/python bench/dedup_bench.py --against main
    .venv/bin/python bench/dedup_bench.py --instructions   # minutes: callgrind runs 50 times slower

The last line printed is one JSON object with every figure and the ratios
(working tree / ref).
"""

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tracemalloc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREE = os.environ.get("RAFTQ_BENCH_TREE", REPO)
sys.path[:0] = [TREE, REPO]

from bench.statemachine_bench import export  # noqa: E402
from raftq.statemachine import StateMachine, encode_entry, is_error  # noqa: E402

BASE = "8baf810"        # the last revision that kept each remembered id whole
BATCH = 100
BODY = bytes(range(100))
QUEUE = "bench"
DEPTH = 1_000
TIMED_PUTS = 300
REPEATS = 3


class Machine:
    def __init__(self, window_ms: int = 300_000):
        self.sm = StateMachine()
        self.now = 1_000_000
        self.next_id = 0
        self.apply({"op": "create_queue", "queue": QUEUE, "config": {"dedup_window_ms": window_ms}})

    def entry(self, command: dict, later: bool = True) -> bytes:
        """`command` as its log entry, 1 ms after the last one (`later`) or at the same log time."""
        self.now += later
        return encode_entry([{**command, "now_ms": self.now}])

    def apply(self, command: dict, later: bool = True) -> None:
        [result] = self.sm.apply_entry(self.entry(command, later))
        if is_error(result):
            raise RuntimeError(f"the bench broke a rule: {result}")

    def put(self, with_ids: bool) -> dict:
        if not with_ids:
            return {"op": "put", "queue": QUEUE, "messages": [{"body": BODY}] * BATCH}
        first, self.next_id = self.next_id, self.next_id + BATCH
        return {"op": "put", "queue": QUEUE, "messages": [{"body": BODY, "id": f"{i:032x}"}
                                                          for i in range(first, first + BATCH)]}

    def trim(self, depth: int) -> None:
        stats = self.sm.queue_info(QUEUE)["stats"]
        extra = stats["depth"] - depth
        if extra > 0:
            upto = stats["first_seq"] + extra - 1      # (seqs are dense: nothing is removed but by commits)
            self.apply({"op": "commit", "queue": QUEUE, "group": "default", "seq": upto}, later=False)


def held_bytes(ids: int, with_ids: bool) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        machine = Machine()
        for _ in range(ids // BATCH):
            machine.apply(machine.put(with_ids))
        machine.trim(0)
        gc.collect()
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def bytes_per_id(ids: int) -> float:
    return (held_bytes(ids, True) - held_bytes(ids, False)) / ids


def put_throughput(window_ids: int) -> dict:
    """Messages per second of timed puts, with ids and without, into a queue whose window is full."""
    machine = Machine(window_ms=max(window_ids // BATCH, 1))
    for _ in range(window_ids // BATCH):                  # the window fills, untimed
        machine.apply(machine.put(True))
        machine.trim(DEPTH)
    gc.collect()
    best = {True: 0.0, False: 0.0}
    for _ in range(REPEATS):
        for with_ids in best:
            elapsed = 0.0
            for _ in range(TIMED_PUTS):
                entry = machine.entry(machine.put(with_ids))
                start = time.perf_counter()
                machine.sm.apply_entry(entry)
                elapsed += time.perf_counter() - start
                machine.trim(DEPTH)
            best[with_ids] = max(best[with_ids], TIMED_PUTS * BATCH / elapsed)
    return {"put_with_ids_msgs_per_s": best[True], "put_without_ids_msgs_per_s": best[False]}


COUNTED_PUTS = 200


def counted_puts(puts: int) -> None:
    """The run callgrind counts: a window of 10 000 ids filled, then `puts` puts with ids."""
    machine = Machine(window_ms=100)
    for _ in range(100 + puts):
        machine.apply(machine.put(True))
        machine.trim(0)


def instructions(tree: str, puts: int) -> subprocess.Popen:
    return subprocess.Popen(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                             os.path.abspath(__file__), "--child", "count", str(puts)],
                            env={**os.environ, "RAFTQ_BENCH_TREE": tree}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def collected(run: subprocess.Popen) -> int:
    return int(re.search(r"Collected : (\d+)", run.communicate()[1]).group(1))


def main_instructions(ref: str) -> None:
    with tempfile.TemporaryDirectory(prefix="raftq-dedupbench-") as scratch:
        trees = {ref: export(ref, scratch), "working tree": REPO}
        runs = {(label, puts): instructions(tree, puts) for label, tree in trees.items() for puts in (0, COUNTED_PUTS)}
        counts = {key: collected(run) for key, run in runs.items()}
    per_message = {label: (counts[label, COUNTED_PUTS] - counts[label, 0]) / (COUNTED_PUTS * BATCH) for label in trees}
    ratio = round(per_message["working tree"] / per_message[ref], 3)
    print(f"instructions per message of a put with an id (and its commit): {ref} {per_message[ref]:,.0f}, "
          f"working tree {per_message['working tree']:,.0f}, ratio {ratio}")
    print(json.dumps({"instructions_per_message": per_message, "ratio_tree_vs_ref": ratio}))


def run_child(kind: str, ids: int) -> None:
    if kind == "count":
        counted_puts(ids)
        return
    print(json.dumps({"bytes_per_id": bytes_per_id(ids)} if kind == "memory" else put_throughput(ids)))


def child(tree: str, kind: str, ids: int) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, str(ids)],
                         env={**os.environ, "RAFTQ_BENCH_TREE": tree}, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(ref: str, rounds: int, ids: int, window_ids: int) -> None:
    started = time.perf_counter()
    labels = [ref, "working tree"]
    higher_is_better = {"put_with_ids_msgs_per_s", "put_without_ids_msgs_per_s"}
    with tempfile.TemporaryDirectory(prefix="raftq-dedupbench-") as scratch:
        trees = [export(ref, scratch), REPO]
        figures = {label: {} for label in labels}
        for turn in range(rounds):
            for i in (range(2) if turn % 2 == 0 else reversed(range(2))):   # neither tree always first
                got = child(trees[i], "put", window_ids)
                if turn == 0:
                    got.update(child(trees[i], "memory", ids))       # exact: measured once
                for name, value in got.items():
                    keep = max if name in higher_is_better else min
                    figures[labels[i]][name] = keep(figures[labels[i]].get(name, value), value)
            print(f"round {turn + 1}/{rounds} done ({time.perf_counter() - started:.0f} s)", file=sys.stderr,
                  flush=True)
    names = ["bytes_per_id", "put_with_ids_msgs_per_s", "put_without_ids_msgs_per_s"]
    ratios = {n: round(figures[labels[1]][n] / figures[labels[0]][n], 3) for n in names}
    print(f"dedup window: {ids:,} ids for memory (tracemalloc), puts of {BATCH} into a window of "
          f"{window_ids:,} ids for throughput (best of {rounds} rounds x {REPEATS} runs)")
    print(f"{'figure':<30}{ref:>14}{'working tree':>14}{'tree/ref':>10}")
    for n in names:
        print(f"{n:<30}{figures[labels[0]][n]:>14,.1f}{figures[labels[1]][n]:>14,.1f}{ratios[n]:>10.3f}")
    print(f"total bench time {time.perf_counter() - started:.0f} s")
    print(json.dumps({"trees": labels, "ids": ids, "window_ids": window_ids, "figures": figures,
                      "ratio_tree_vs_ref": ratios, "higher_is_better": sorted(higher_is_better)}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default=BASE, metavar="REF", help=f"the git ref to compare with ({BASE})")
    parser.add_argument("--rounds", type=int, default=3, help="turns of each tree for throughput")
    parser.add_argument("--ids", type=int, default=200_000, help="ids remembered for the memory figure")
    parser.add_argument("--window-ids", type=int, default=1_000_000, help="ids the window holds while puts are timed")
    parser.add_argument("--instructions", action="store_true", help="count instructions under callgrind instead")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        run_child(options.child[0], int(options.child[1]))
    elif options.instructions:
        main_instructions(options.against)
    else:
        main(options.against, options.rounds, options.ids, options.window_ids)

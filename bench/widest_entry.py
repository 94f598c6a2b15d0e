"""How long the widest log entries the API accepts take to apply.

    .venv/bin/python bench/widest_entry.py [--quick]

Entries are applied in the engine's ticks, between heartbeats: one that takes
longer than the election timeout (0.3-0.6 s) costs an election. This applies
the widest entry of each kind that the node's default caps let through to a
bare state machine (no Raft, no I/O) and times it: queues created, messages
published by a put, a transaction and a staged commit, a group added to a
long queue, a producer dropped with all its stages, and the reads that walk
every producer. The last line printed is one JSON object of the seconds each
took (the median of three runs).
"""

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from raftq.api.limits import Limits  # noqa: E402
from raftq.statemachine import StateMachine, encode_entry  # noqa: E402
from raftq.statemachine.machine import MAX_NEW_QUEUES_PER_ENTRY  # noqa: E402
from raftq.statemachine.staging import STAGED_MESSAGE_OVERHEAD  # noqa: E402
from raftq.statemachine.queue import MAX_EARLIEST_GROUP_MESSAGES  # noqa: E402
from raftq.statemachine.validation import MAX_BATCH  # noqa: E402

NOW = 1_700_000_000_000
LIMITS = Limits()
CAPS = {"stages": LIMITS.max_stages, "bytes": LIMITS.max_staged_bytes,
        "producer_stages": LIMITS.max_stages_per_producer, "producer_bytes": LIMITS.max_staged_bytes_per_producer,
        "producer_messages": LIMITS.max_staged_messages_per_producer}


def timed(machine: StateMachine, commands: list) -> tuple[float, list]:
    entry = encode_entry([{**c, "now_ms": NOW} for c in commands])
    start = time.perf_counter()
    results = machine.apply_entry(entry)
    return time.perf_counter() - start, results


def ok(results: list) -> None:
    bad = [r for r in results if "error" in r]
    assert not bad, bad[:1]


def stage_all(machine: StateMachine, producer: str, stages: int, per_stage: list, queue_of) -> list:
    for n in range(stages):
        ok(machine.apply_entry(encode_entry([{
            "op": "stage", "producer": producer, "token": f"t{n}", "chunk": 0, "queue": queue_of(n),
            "messages": per_stage, "caps": CAPS, "now_ms": NOW}])))
    return [{"token": f"t{n}", "chunks": 1} for n in range(stages)]


def commit_creating_queues() -> float:
    machine = StateMachine()
    parts = stage_all(machine, "p", MAX_NEW_QUEUES_PER_ENTRY, [{"body": "x"}], lambda n: f"q{n}")
    seconds, results = timed(machine, [{"op": "stage_commit", "producer": "p", "batch": 0, "parts": parts,
                                        "max_queues": LIMITS.max_queues}])
    ok(results)
    assert len(machine.queues) == MAX_NEW_QUEUES_PER_ENTRY
    return seconds


def puts_creating_queues() -> float:
    machine = StateMachine()
    seconds, results = timed(machine, [{"op": "put", "queue": f"q{n}", "messages": [{"body": "x"}],
                                        "max_queues": LIMITS.max_queues} for n in range(MAX_NEW_QUEUES_PER_ENTRY)])
    ok(results)
    return seconds


def widest_put() -> float:
    machine = StateMachine()
    seconds, results = timed(machine, [{"op": "put", "queue": "q", "max_queues": LIMITS.max_queues,
                                        "messages": [{"body": {"n": n, "pad": "x" * 64}} for n in range(MAX_BATCH)]}])
    ok(results)
    return seconds


def widest_tx() -> float:
    machine = StateMachine()
    per_queue = MAX_BATCH // MAX_NEW_QUEUES_PER_ENTRY
    seconds, results = timed(machine, [{"op": "tx", "max_queues": LIMITS.max_queues, "put": [
        {"queue": f"q{q}", "messages": [{"body": {"n": n}} for n in range(per_queue)]}
        for q in range(MAX_NEW_QUEUES_PER_ENTRY)]}])
    ok(results)
    return seconds


def widest_commit(body_bytes: int) -> tuple[float, int]:
    """As many stages and messages as one producer may hold (its caps), into one queue."""
    machine = StateMachine()
    per_message = body_bytes + STAGED_MESSAGE_OVERHEAD
    messages = min(LIMITS.max_staged_messages_per_producer, LIMITS.max_staged_bytes_per_producer // per_message)
    stages = min(LIMITS.max_stages_per_producer, messages)
    parts = stage_all(machine, "p", stages, [{"body": "x" * body_bytes}] * (messages // stages), lambda n: "q")
    seconds, results = timed(machine, [{"op": "stage_commit", "producer": "p", "batch": 0, "parts": parts,
                                        "max_queues": LIMITS.max_queues}])
    ok(results)
    return seconds, stages * (messages // stages)


def drop_producer() -> float:
    machine = StateMachine()
    stage_all(machine, "p", LIMITS.max_stages_per_producer, [{"body": "x"}] * 5, lambda n: "q")
    seconds, results = timed(machine, [{"op": "drop_producer", "producer": "p"}])
    ok(results)
    return seconds


def add_group(depth: int) -> float:
    machine = StateMachine()
    for start in range(0, depth, MAX_BATCH):
        ok(machine.apply_entry(encode_entry([{"op": "put", "queue": "q", "now_ms": NOW,
                                              "messages": [{"body": n} for n in range(start, start + MAX_BATCH)]}])))
    seconds, results = timed(machine, [{"op": "add_group", "queue": "q", "group": "g", "start": "earliest"}])
    ok(results)
    return seconds


def producer_reads(producers: int) -> float:
    machine = StateMachine()
    for n in range(producers):
        ok(machine.apply_entry(encode_entry([
            {"op": "stage", "producer": f"p{n}", "token": f"t{n}", "chunk": 0, "queue": "q",
             "messages": [{"body": "x"}], "now_ms": NOW},
            {"op": "stage_commit", "producer": f"p{n}", "batch": 0, "parts": [{"token": f"t{n}", "chunks": 1}],
             "now_ms": NOW}])))
    start = time.perf_counter()
    machine.read("list_producers")
    return time.perf_counter() - start


def median(run, repeat: int):
    """The run of median time: the machine's other work moves single runs a lot."""
    runs = []
    for _ in range(repeat):
        gc.collect()
        runs.append(run())
    runs.sort(key=lambda got: got[0] if isinstance(got, tuple) else got)
    return runs[len(runs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run each, smaller long queue")
    args = parser.parse_args()
    repeat = 1 if args.quick else 3
    figures = {}
    new = MAX_NEW_QUEUES_PER_ENTRY
    figures[f"commit_creating_{new}_queues_s"] = median(commit_creating_queues, repeat)
    figures[f"{new}_puts_creating_queues_s"] = median(puts_creating_queues, repeat)
    figures[f"put_{MAX_BATCH}_messages_s"] = median(widest_put, repeat)
    figures[f"tx_{MAX_BATCH}_messages_{new}_new_queues_s"] = median(widest_tx, repeat)
    for body in (100, 1 << 20):
        seconds, messages = median(lambda: widest_commit(body), repeat)
        figures[f"commit_{messages}_staged_messages_of_{body}_bytes_s"] = seconds
    figures["drop_producer_with_max_stages_s"] = median(drop_producer, repeat)
    depth = 100_000 if args.quick else MAX_EARLIEST_GROUP_MESSAGES   # past it, refused
    figures[f"add_group_earliest_on_{depth}_messages_s"] = median(lambda: add_group(depth), 1)
    figures[f"list_producers_of_{LIMITS.max_producers}_s"] = median(lambda: producer_reads(LIMITS.max_producers), 1)
    for name, value in figures.items():
        print(f"{name:>55}  {value:8.3f}")
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}))


if __name__ == "__main__":
    main()

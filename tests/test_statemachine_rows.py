"""A queue's stored messages as columns (statemachine/rows.py) and a group's ready
seqs as flags (statemachine/ready.py): they hold what the objects before them
held (the model test compares every field after every step), stay the size of
what is stored while a backlog is consumed, and a snapshot of the release that
held messages as objects restores to the state this release reaches from the
same commands."""

import json
import random
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from raftq.statemachine import StateMachine
from raftq.statemachine.ready import ReadySeqs
from raftq.statemachine.rows import TRIM_MIN
from tests.test_operations import exported

T0 = 1_000_000
# The last revision whose snapshots hold each queue's messages as lists of
# their fields and each group's ready seqs as a list (snapshot version 8).
MESSAGE_LISTS_RELEASE = "3684357"


def varied_commands(seed: int) -> list:
    """Puts with keys, headers, delays and TTLs into a queue with two groups; receives,
    acks out of order, nacks, commits, expiries: rows removed everywhere but in order."""
    rnd = random.Random(seed)
    now = T0
    commands = [{"op": "create_queue", "queue": "q", "config": {"ttl_ms": 40_000, "lease_ms": 5_000}, "now_ms": now},
                {"op": "add_group", "queue": "q", "group": "audit", "start": "latest", "now_ms": now}]
    for step in range(60):
        now += rnd.choice([10, 100, 1_000, 3_000])
        messages = [{"body": f"m{step}-{i}", **({"key": f"k{rnd.randrange(5)}"} if rnd.random() < 0.3 else {}),
                     **({"headers": {"h": str(i)}} if rnd.random() < 0.2 else {}),
                     **({"delay_ms": rnd.choice([50, 2_000])} if rnd.random() < 0.2 else {}),
                     **({"ttl_ms": 500} if rnd.random() < 0.1 else {})} for i in range(rnd.randrange(1, 8))]
        commands.append({"op": "put", "queue": "q", "messages": messages, "now_ms": now})
        commands.append({"op": "receive", "queue": "q", "group": rnd.choice(["default", "audit"]),
                         "max": rnd.randrange(1, 6), "now_ms": now})
        if step % 7 == 6:
            commands.append({"op": "commit", "queue": "q", "group": "audit", "seq": step * 3, "now_ms": now})
        commands.append({"op": "tick", "now_ms": now})
    return commands


# Applies the commands of argv[1] (JSON) with the StateMachine of module argv[2] and writes the
# snapshot; acks every other receipt of the default group as it goes (receipts are only known then).
# The old release names its room `statemachine`, this one `raftq.statemachine`.
APPLY = r"""
import importlib, json, sys
StateMachine = importlib.import_module(sys.argv[2]).StateMachine
sm = StateMachine()
for n, cmd in enumerate(json.loads(sys.argv[1])):
    result = sm.apply(cmd)
    if cmd["op"] == "receive" and cmd["group"] == "default":
        receipts = [m["receipt"] for m in result.get("messages", [])][n % 2::2]
        if receipts:
            sm.apply({"op": "ack" if n % 3 else "nack", "queue": "q", "receipts": receipts, "now_ms": cmd["now_ms"]})
sys.stdout.buffer.write(sm.snapshot())
"""


def test_a_snapshot_of_the_release_with_message_lists_restores_to_the_state_this_one_reaches(tmp_path):
    commands = json.dumps(varied_commands(seed=25))
    tree = exported(MESSAGE_LISTS_RELEASE, tmp_path / "tree")
    old = subprocess.run([sys.executable, "-c", APPLY, commands, "statemachine"], env={"PYTHONPATH": str(tree)}, cwd=tree,
                         capture_output=True, check=True, timeout=120).stdout
    new = subprocess.run([sys.executable, "-c", APPLY, commands, "raftq.statemachine"], capture_output=True, check=True,
                         timeout=120).stdout
    restored, replayed = StateMachine(), StateMachine()
    restored.restore(old)
    replayed.restore(new)
    info = replayed.queue_info("q")["stats"]
    assert info["depth"] > 20 and info["first_seq"] > 1 and info["in_flight"] > 0     # the rows have holes
    assert restored.snapshot() == new
    # and both go on alike
    for now in (T0 + 200_000, T0 + 300_000):
        for machine in (restored, replayed):
            machine.apply({"op": "put", "queue": "q", "messages": [{"body": "late", "key": "k1"}], "now_ms": now})
        got = [machine.apply({"op": "receive", "queue": "q", "group": "audit", "max": 50, "now_ms": now})
               for machine in (restored, replayed)]
        assert got[0] == got[1] and got[0]["messages"]
    assert restored.state_digest() == replayed.state_digest()


def test_a_backlog_consumed_in_order_keeps_about_as_many_rows_and_flags_as_it_stores():
    sm = StateMachine()
    total, batch = 20 * TRIM_MIN, TRIM_MIN // 8
    for now in range(1, total // batch + 1):
        sm.apply({"op": "put", "queue": "q", "messages": [{"body": "x"}] * batch, "now_ms": now})
    queue = sm.queues["q"]
    for now in range(1, total // batch):
        received = sm.apply({"op": "receive", "queue": "q", "group": "default", "max": batch, "now_ms": now})
        sm.apply({"op": "ack", "queue": "q", "receipts": [m["receipt"] for m in received["messages"]],
                  "now_ms": now})
        left = len(queue.rows)
        assert len(queue.rows.pending) <= 2 * left + TRIM_MIN
        assert len(queue.groups["default"].ready.flags) <= 2 * left + TRIM_MIN
    assert sm.queue_info("q")["stats"]["first_seq"] == total - batch + 1


ops = st.lists(st.tuples(st.sampled_from(["add", "add", "remove", "pop"]), st.integers(0, 3 * TRIM_MIN)),
               max_size=200)


@settings(max_examples=200, deadline=None)
@given(ops=ops, start=st.integers(1, 2**40))
def test_ready_flags_answer_as_a_sorted_list_does(ops, start):
    """Adds anywhere (a requeue below the flags too), removes, pops of the lowest, ranges, snapshots."""
    flags, reference = ReadySeqs(), SortedList()
    for op, offset in ops:
        seq = start + offset
        if op == "add" and seq not in reference:
            flags.add(seq)
            reference.add(seq)
        elif op == "remove" and reference:
            seq = reference[offset % len(reference)]
            flags.remove(seq)
            reference.remove(seq)
        elif op == "pop" and reference:
            assert flags.pop_lowest() == reference.pop(0)
        assert len(flags) == len(reference) and (seq in flags) == (seq in reference)
        if reference:
            assert flags.lowest() == reference[0]
    assert list(flags) == list(reference)
    middle = start + TRIM_MIN
    assert list(flags.irange(minimum=middle)) == list(reference.irange(minimum=middle))
    assert list(flags.irange(maximum=middle)) == list(reference.irange(maximum=middle))
    assert list(ReadySeqs.from_state(flags.to_state())) == list(reference)

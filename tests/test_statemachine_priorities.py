"""Priorities (issue 51), one rule per test: a receive hands out the highest priority first, in
seq order within a priority, per group, and never a message of an ordering key before an
earlier one of its key (docs/api.md, "Priorities")."""

import random

import pytest

from raftq.statemachine import StateMachine
from raftq.statemachine.queue import MAX_STEPPED_OVER
from tests.test_statemachine_rules import T0, Machine, msg


@pytest.fixture
def m():
    return Machine()


def bodies(received):
    return [r["body"] for r in received]


def test_the_highest_priority_goes_first_and_each_priority_in_seq_order(m):
    m.put("q", msg("low1"), msg("high1", priority=9), msg("mid", priority=4), msg("low2", priority=0),
          msg("high2", priority=9))
    got = m.receive("q")
    assert bodies(got) == ["high1", "high2", "mid", "low1", "low2"]
    assert [r["priority"] for r in got] == [9, 9, 4, 0, 0]


def test_a_message_without_a_priority_is_priority_0_the_lowest(m):
    m.put("q", msg("plain"), msg("one", priority=1))
    assert bodies(m.receive("q", n=1)) == ["one"]
    assert [(r["body"], r["priority"]) for r in m.receive("q")] == [("plain", 0)]


def test_a_receive_of_one_at_a_time_follows_priority_then_seq(m):
    m.put("q", *[msg(f"{p}-{i}", priority=p) for i in range(3) for p in (2, 7, 0)])
    order = [bodies(m.receive("q", n=1))[0] for _ in range(9)]
    assert order == [f"{p}-{i}" for p in (7, 2, 0) for i in range(3)]


def test_a_message_that_comes_back_goes_out_again_at_its_priority(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 1_000})
    m.put("q", msg("high", priority=8), msg("low"))
    first = m.receive("q", n=1)
    m.ok("nack", queue="q", receipts=[first[0]["receipt"]])
    assert bodies(m.receive("q", n=1)) == ["high"]
    m.tick(T0 + 5_000)                       # its lease ran out
    assert [(r["body"], r["deliveries"]) for r in m.receive("q")] == [("high", 3), ("low", 1)]


def test_each_fanout_group_takes_its_own_highest_first(m):
    m.put("q", msg("a"))
    m.ok("add_group", queue="q", group="audit", start="earliest")
    m.put("q", msg("b", priority=5))
    assert bodies(m.receive("q", n=1)) == ["b"]
    assert bodies(m.receive("q", n=1, group="audit")) == ["b"]
    assert bodies(m.receive("q", group="audit")) == ["a"]


def test_priority_never_breaks_an_ordering_keys_order(m):
    m.put("q", msg("k-first", ordering_key="k"), msg("k-urgent", ordering_key="k", priority=9),
          msg("other", ordering_key="o", priority=5), msg("plain"))
    # k's first message is free to go at priority 0; its urgent one waits behind it
    assert bodies(m.receive("q")) == ["other", "k-first", "k-urgent", "plain"]


def test_a_keys_next_message_competes_at_its_own_priority_once_the_earlier_one_is_taken(m):
    m.put("q", msg("k1", ordering_key="k", priority=1), msg("k2", ordering_key="k", priority=9),
          msg("mid", priority=5))
    # k1 (1) loses to mid (5); once k1 is taken, k2 (9) goes before anything else left
    assert bodies(m.receive("q", n=1)) == ["mid"]
    first = m.receive("q", n=1)
    assert bodies(first) == ["k1"]
    assert m.receive("q") == []              # k2 waits while k1 is in flight
    m.ack("q", first[0]["receipt"])
    assert bodies(m.receive("q")) == ["k2"]


def test_a_key_whose_earlier_message_is_in_flight_lets_other_priorities_pass(m):
    m.put("q", msg("k1", ordering_key="k"), msg("k2", ordering_key="k", priority=9), msg("low"))
    held = m.receive("q", n=1)               # k1 (0), before low (0) by seq
    assert bodies(held) == ["k1"]
    assert bodies(m.receive("q")) == ["low"]


def test_priorities_survive_a_snapshot_a_dead_letter_move_and_a_redrive(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 1_000, "max_deliveries": 1, "dead_letter": "dl"})
    m.put("q", msg("urgent", priority=7), msg("plain"))
    m.receive("q")
    m.tick(T0 + 2_000)                       # both spent: dead-lettered, in seq order
    restored = StateMachine()
    restored.restore(m.sm.snapshot())
    m.sm = restored
    assert [(r["body"], r["priority"]) for r in m.sm.browse("dl", "default", 0, 10)["messages"]] == \
        [("urgent", 7), ("plain", 0)]
    m.ok("redrive", queue="dl")
    assert [(r["body"], r["priority"]) for r in m.receive("q")] == [("urgent", 7), ("plain", 0)]


def test_a_malformed_priority_is_refused(m):
    for bad in (-1, 10, "1", True, 1.0, None):
        m.fails("bad_request", "put", queue="q", messages=[msg(priority=bad)])


def test_a_thousand_mixed_priorities_come_out_in_priority_then_seq_order(m):
    rng = random.Random(5)
    priorities = [rng.choice([0, 0, 0, 3, 9]) for _ in range(1_000)]
    seqs = m.put("q", *[msg(str(i), priority=p) for i, p in enumerate(priorities)])
    m.ok("nack", queue="q", receipts=[r["receipt"] for r in m.receive("q", n=100)])   # back near the head
    out = [r["seq"] for _ in range(10) for r in m.receive("q", n=100)]
    assert out == sorted(seqs, key=lambda seq: (-priorities[seq - 1], seq))


def test_a_restored_replica_hands_out_in_the_same_order(m):
    rng = random.Random(9)
    m.put("q", *[msg(str(i), priority=rng.randint(0, 9)) for i in range(300)])
    m.receive("q", n=40)
    restored = StateMachine()
    restored.restore(m.sm.snapshot())
    assert restored.snapshot() == m.sm.snapshot()
    cmd = {"op": "receive", "queue": "q", "group": "default", "max": 100, "now_ms": T0}
    assert restored.apply(dict(cmd)) == m.sm.apply(dict(cmd))


@pytest.mark.parametrize("waiting, urgent_found", [(MAX_STEPPED_OVER - 1, True), (MAX_STEPPED_OVER, False)])
def test_with_keys_and_priorities_a_receive_looks_at_most_10_000_ready_messages_ahead(m, waiting, urgent_found):
    # one key in flight, `waiting` of its later messages ready, then an urgent message of another key
    m.put("q", msg("head", ordering_key="hot"), *[msg("hot", ordering_key="hot") for _ in range(5_000)])
    m.put("q", *[msg("hot", ordering_key="hot") for _ in range(waiting - 5_000)],
          msg("urgent", ordering_key="b", priority=9))
    m.receive("q", n=1)
    assert bodies(m.receive("q")) == (["urgent"] if urgent_found else [])

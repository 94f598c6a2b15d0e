"""Retention and replay (issue 51), one rule per test: a queue with retention keeps what every group
is done with, for retention_ms of log time since its put and within retention_bytes, counted
toward max_length and max_bytes; a group made at or moved to a position holds every stored
message from there on, retained ones too (docs/api.md, "Retention and replay";
statemachine/retention.py)."""

import pytest

from raftq.statemachine import StateMachine, encode_entry
from raftq.statemachine.retention import MAX_EARLIEST_GROUP_MESSAGES
from tests.test_statemachine_rules import T0, Machine, msg


@pytest.fixture
def m():
    machine = Machine()
    machine.ok("create_queue", queue="q", config={"retention_ms": 60_000})
    return machine


def consume_all(m, group="default"):
    got = m.receive("q", n=1_000, group=group)
    for r in got:
        m.ack("q", r["receipt"])
    return got


def bodies(received):
    return [r["body"] for r in received]


def test_acked_messages_are_retained_apart_from_what_groups_hold(m):
    m.put("q", msg("a"), msg("bb"), msg("ccc"))
    consume_all(m)
    stats = m.stats("q")
    assert (stats["depth"], stats["bytes"], stats["retained"], stats["retained_bytes"]) == (0, 0, 3, 6)
    assert stats["first_seq"] == 1 and m.stored("q") == []


def test_a_seek_to_the_earliest_replays_every_retained_message_in_order_as_new(m):
    m.put("q", msg("a"), msg("b", priority=3), msg("c"))
    consume_all(m)
    moved = m.ok("seek_group", queue="q", group="default", to="earliest")
    assert (moved["replayed"], moved["acked"], moved["depth"]) == (3, 0, 3)
    again = m.receive("q")
    assert [(r["body"], r["deliveries"]) for r in again] == [("b", 1), ("a", 1), ("c", 1)]
    assert m.stats("q")["retained"] == 0


def test_a_seek_to_a_seq_replays_exactly_from_it(m):
    seqs = m.put("q", *[msg(str(i)) for i in range(6)])
    consume_all(m)
    m.ok("seek_group", queue="q", group="default", to={"seq": seqs[3]})
    assert [r["seq"] for r in m.receive("q")] == seqs[3:]


def test_a_seek_to_a_log_time_replays_from_the_first_message_put_then_or_after(m):
    early = m.put("q", msg("early"))
    m.now = T0 + 1_000
    late = m.put("q", msg("late1"), msg("late2"))
    consume_all(m)
    m.ok("seek_group", queue="q", group="default", to={"time_ms": T0 + 1})
    assert [r["seq"] for r in m.receive("q")] == late
    m.ok("seek_group", queue="q", group="default", to={"time_ms": T0})
    assert [r["seq"] for r in m.receive("q")] == early + late


def test_a_seek_forward_acks_what_the_group_held_before_it_and_latest_holds_nothing(m):
    seqs = m.put("q", *[msg(str(i)) for i in range(4)])
    m.receive("q", n=1)
    moved = m.ok("seek_group", queue="q", group="default", to={"seq": seqs[2]})
    assert (moved["acked"], moved["cursor"]) == (2, seqs[2])
    assert m.stats("q")["acked_total"] == 2
    assert m.ok("seek_group", queue="q", group="default", to="latest")["depth"] == 0
    assert m.stats("q")["retained"] == 4


def test_a_seek_makes_what_the_group_still_held_new_again_and_its_receipts_stale(m):
    m.put("q", msg("a"))
    held = m.receive("q")
    m.ok("seek_group", queue="q", group="default", to="earliest")
    m.fails("stale_receipt", "ack", queue="q", receipts=[held[0]["receipt"]])
    assert [(r["body"], r["deliveries"]) for r in m.receive("q")] == [("a", 1)]


def test_a_new_group_starts_at_a_position_among_the_retained_messages(m):
    seqs = m.put("q", *[msg(str(i)) for i in range(5)])
    consume_all(m)
    assert m.ok("add_group", queue="q", group="late", start={"seq": seqs[2]})["depth"] == 3
    assert m.ok("add_group", queue="q", group="all", start="earliest")["depth"] == 5
    assert m.ok("add_group", queue="q", group="none", start="latest")["depth"] == 0
    assert [r["seq"] for r in m.receive("q", group="late")] == seqs[2:]


def test_retained_messages_go_once_put_longer_ago_than_retention_ms(m):
    m.put("q", msg("old"))
    m.now = T0 + 30_000
    m.put("q", msg("new"))
    consume_all(m)
    assert m.sm.next_timer() == T0 + 60_000
    m.tick(T0 + 60_000)
    assert m.stats("q")["retained"] == 1
    m.tick(T0 + 90_000)
    assert m.stats("q")["retained"] == 0 and m.stats("q")["first_seq"] is None


def test_retention_bytes_keeps_the_newest_retained_messages_within_it():
    m = Machine()
    m.ok("create_queue", queue="q", config={"retention_bytes": 5})
    m.put("q", *[msg("xx") for _ in range(4)])
    consume_all(m)
    m.tick()
    assert (m.stats("q")["retained"], m.stats("q")["retained_bytes"]) == (2, 4)
    m.ok("seek_group", queue="q", group="default", to="earliest")
    assert [r["seq"] for r in m.receive("q")] == [3, 4]


def test_retained_messages_count_toward_the_limits_and_go_first_when_a_put_needs_the_room():
    m = Machine()
    m.ok("create_queue", queue="q", config={"retention_ms": 60_000, "max_length": 3, "max_bytes": 100})
    m.put("q", msg("a"), msg("b"), msg("c"))
    consume_all(m)
    m.put("q", msg("d"), msg("e"))            # a reject queue full of retained messages takes puts
    assert (m.stats("q")["depth"], m.stats("q")["retained"]) == (2, 1)
    m.ok("seek_group", queue="q", group="default", to="earliest")
    assert bodies(m.receive("q")) == ["c", "d", "e"]


def test_turning_retention_off_lets_the_retained_messages_go_at_the_next_tick(m):
    m.put("q", msg(), msg())
    consume_all(m)
    m.ok("patch_queue", queue="q", config={"retention_ms": None})
    assert m.sm.next_timer() <= m.now
    m.tick()
    assert m.stats("q")["retained"] == 0


def test_a_retained_message_keeps_its_log_entry_live():
    m = Machine()
    m.ok("create_queue", queue="q", config={"retention_ms": 60_000})
    m.sm.apply({"op": "put", "queue": "q", "messages": [{"body": b"kept"}], "now_ms": T0}, index=7)
    assert m.sm.live_entry_indexes() == []      # applied without its entry: the body is in the heap
    m.sm.apply_entry(encode_entry([{"op": "put", "queue": "q", "messages": [{"body": b"kept"}], "now_ms": T0}]), 9)
    consume_all(m)
    assert m.stats("q")["retained"] == 2
    assert m.sm.live_entry_indexes() == [9]
    m.tick(T0 + 60_000)
    assert m.sm.live_entry_indexes() == []


def test_a_dead_lettered_message_is_retained_where_it_died_too():
    m = Machine()
    m.ok("create_queue", queue="q", config={"retention_ms": 60_000, "max_deliveries": 1, "dead_letter": "dl"})
    m.put("q", msg("poison"))
    m.ok("nack", queue="q", receipts=[m.receive("q")[0]["receipt"]])
    assert bodies(m.receive("dl")) == ["poison"]
    assert m.stats("q")["retained"] == 1


def test_the_dedup_window_is_its_own_a_retained_id_is_still_a_duplicate_within_it(m):
    first = m.put("q", msg("once", id="i1"))
    consume_all(m)
    assert m.put_result("q", msg("once", id="i1")) == [{"seq": first[0], "duplicate": True, "replaced_seq": None}]
    m.ok("seek_group", queue="q", group="default", to="earliest")
    assert bodies(m.receive("q")) == ["once"]


def test_a_keyed_put_never_replaces_a_retained_version(m):
    m.put("q", msg("v1", key="k"))
    consume_all(m)
    m.put("q", msg("v2", key="k"))
    assert m.stats("q")["replaced_total"] == 0
    m.ok("seek_group", queue="q", group="default", to="earliest")
    assert bodies(m.receive("q")) == ["v1", "v2"]


def test_retained_messages_survive_a_snapshot(m):
    m.put("q", msg("a"), msg("b"), msg("c"))
    consume_all(m)
    restored = StateMachine()
    restored.restore(m.sm.snapshot())
    assert restored.snapshot() == m.sm.snapshot()
    m.sm = restored
    assert m.stats("q")["retained"] == 3
    m.ok("seek_group", queue="q", group="default", to={"seq": 2})
    assert bodies(m.receive("q")) == ["b", "c"]


def test_a_seek_that_would_replay_more_than_one_entry_can_is_refused_and_changes_nothing(m):
    for _ in range(MAX_EARLIEST_GROUP_MESSAGES // 10_000 + 1):
        m.put("q", *[msg() for _ in range(10_000)])
    m.ok("commit", queue="q", group="default", seq=10 ** 9)
    before = m.sm.snapshot()
    for position in ("earliest", {"seq": 10_000}, {"time_ms": 0}):
        m.fails("conflict", "seek_group", queue="q", group="default", to=position)
        assert m.sm.snapshot() == before
    assert m.ok("seek_group", queue="q", group="default", to={"seq": 10_001})["replayed"] == \
        MAX_EARLIEST_GROUP_MESSAGES


@pytest.mark.parametrize("to", [None, "first", {"seq": -1}, {"seq": "1"}, {"time_ms": 1.5}, {"seq": 1, "time_ms": 1},
                                {}, [1]])
def test_a_malformed_position_is_refused(m, to):
    m.fails("bad_request", "seek_group", queue="q", group="default", to=to)
    m.fails("bad_request", "add_group", queue="q", group="g", start=to if to is not None else 7)


def test_a_seek_of_a_missing_group_is_not_found(m):
    m.fails("not_found", "seek_group", queue="q", group="nope", to="earliest")


def test_retained_messages_count_toward_the_clusters_stored_bytes_until_retention_lets_them_go(m):
    m.put("q", msg(b"12345"), msg(b"1234"), max_stored_bytes=10)
    consume_all(m)
    assert m.stats("q")["retained_bytes"] == 9 and m.sm.stored_usage() == {"bytes": 9}   # on disk all the same
    refused = m.fails("insufficient_storage", "put", queue="q", messages=[msg(b"12")], max_stored_bytes=10)
    assert refused["stored_bytes"] == 9
    m.ok("patch_queue", queue="q", config={"retention_bytes": 4})
    m.tick(m.now + 1)
    assert m.sm.stored_usage() == {"bytes": 4}
    assert m.put("q", msg(b"12"), max_stored_bytes=10) == [3]
    m.ok("delete_queue", queue="q")
    assert m.sm.stored_usage() == {"bytes": 0}

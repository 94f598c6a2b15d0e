"""The queue semantics of docs/api.md and issue 2, one rule (or edge case) per test.

Every test drives the state machine only through `apply` (or `apply_entry`)
and its read-only queries, as the node does; times are explicit `now_ms`
values so that leases, delays, TTLs and dedup windows are exact.
"""

import cbor2
import pytest

from raftq.statemachine import StateMachine, check_command, decode_entry, encode_entry, is_error
from raftq.statemachine.machine import OPS
from raftq.statemachine.queue import MAX_EARLIEST_GROUP_MESSAGES, Queue
from raftq.statemachine.wall import MAX_EPOCHS, TOLERANCE_MS
from tests.older_snapshots import downgraded, message_lists

T0 = 1_000_000
NOT_PAUSED = {"paused": False, "resume_at_ms": None, "rate_limit": None}   # a group's settings by default


class Machine:
    """A state machine plus a log clock that tests move by hand."""

    def __init__(self):
        self.sm = StateMachine()
        self.now = T0

    def __call__(self, op, now=None, **fields):
        return self.sm.apply({"op": op, "now_ms": self.now if now is None else now, **fields})

    def ok(self, op, now=None, **fields):
        result = self(op, now, **fields)
        assert not is_error(result), result
        return result

    def fails(self, code, op, now=None, **fields):
        result = self(op, now, **fields)
        assert is_error(result) and result["error"] == code, result
        return result

    # shorthands for the commands most tests need
    def put(self, queue, *messages, **fields):
        return [m["seq"] for m in self.ok("put", queue=queue, messages=list(messages), **fields)["messages"]]

    def put_result(self, queue, *messages, **fields):
        return self.ok("put", queue=queue, messages=list(messages), **fields)["messages"]

    def receive(self, queue, n=10, group="default", **fields):
        return self.ok("receive", queue=queue, group=group, max=n, **fields)["messages"]

    def seqs(self, queue, n=10, group="default", **fields):
        return [m["seq"] for m in self.receive(queue, n, group, **fields)]

    def ack(self, queue, *receipts):
        return self("ack", queue=queue, receipts=list(receipts))

    def tick(self, now=None):
        if now is not None:
            self.now = now
        return self.ok("tick")

    def stats(self, queue):
        return self.sm.queue_info(queue)["stats"]

    def stored(self, queue, group="default"):
        return [m["seq"] for m in self.sm.browse(queue, group, 0, 1_000_000)["messages"]]


def msg(body="x", **fields):
    return {"body": body, **fields}


@pytest.fixture
def m():
    return Machine()


# ---- queues -----------------------------------------------------------------------

def test_create_queue_fills_defaults_and_answers_created(m):
    result = m.ok("create_queue", queue="q", config={"lease_ms": 5_000})
    assert result["created"] is True
    assert result["config"] == {"lease_ms": 5_000, "max_deliveries": None, "dead_letter": None,
                                "ttl_ms": None, "max_length": None, "max_bytes": None,
                                "overflow": "reject", "dedup_window_ms": 300_000, "backoff": None,
                                "retention_ms": None, "retention_bytes": None, "tags": None, "sqs_attributes": None}


def test_create_queue_again_with_same_config_is_not_a_change(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 5_000})
    m.put("q", msg())
    result = m.ok("create_queue", queue="q", config={"lease_ms": 5_000})
    assert result["created"] is False
    assert m.stats("q")["depth"] == 1


def test_create_queue_with_defaults_spelled_out_equals_empty_config(m):
    m.ok("create_queue", queue="q", config={})
    assert m.ok("create_queue", queue="q", config={"lease_ms": 30_000})["created"] is False


def test_create_queue_with_other_config_conflicts_and_keeps_the_old_one(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 5_000})
    m.fails("conflict", "create_queue", queue="q", config={"lease_ms": 6_000})
    assert m.sm.queue_info("q")["config"]["lease_ms"] == 5_000


def test_patch_changes_only_the_given_fields(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 5_000, "max_length": 10})
    result = m.ok("patch_queue", queue="q", config={"max_length": 20, "overflow": "drop_oldest"})
    assert result["config"]["lease_ms"] == 5_000
    assert result["config"]["max_length"] == 20
    assert m.sm.queue_info("q")["config"]["overflow"] == "drop_oldest"


def test_patch_of_a_missing_queue_is_not_found(m):
    m.fails("not_found", "patch_queue", queue="nope", config={"lease_ms": 5})


def test_a_queue_cannot_be_its_own_dead_letter_queue(m):
    m.fails("bad_request", "create_queue", queue="q", config={"dead_letter": "q"})
    m.ok("create_queue", queue="q", config={})
    m.fails("bad_request", "patch_queue", queue="q", config={"dead_letter": "q"})
    assert m.sm.queue_info("q")["config"]["dead_letter"] is None


def test_delete_queue_removes_it_and_its_messages(m):
    m.put("q", msg())
    assert m.ok("delete_queue", queue="q") == {"deleted": True}
    assert m.sm.queue_info("q")["error"] == "not_found"
    m.fails("not_found", "delete_queue", queue="q")
    m.fails("not_found", "receive", queue="q", group="default", max=1)


def test_list_queues(m):
    m.put("a", msg(), msg())
    m.put("b", msg())
    m.receive("a", 1)
    assert m.sm.list_queues() == {"queues": [
        {"name": "a", "depth": 2, "in_flight": 1, "groups": ["default"]},
        {"name": "b", "depth": 1, "in_flight": 0, "groups": ["default"]}]}


# ---- put --------------------------------------------------------------------------------

def test_put_auto_creates_the_queue_with_defaults(m):
    assert m.put_result("q", msg("a"), msg("b")) == [
        {"seq": 1, "duplicate": False, "replaced_seq": None},
        {"seq": 2, "duplicate": False, "replaced_seq": None}]
    assert m.sm.queue_info("q")["config"]["lease_ms"] == 30_000
    assert m.stats("q")["put_total"] == 2


def test_put_without_auto_create_to_a_missing_queue_is_not_found(m):
    m.fails("not_found", "put", queue="q", messages=[msg()], auto_create=False)
    assert m.sm.list_queues() == {"queues": []}


def test_put_batch_with_one_invalid_message_stores_nothing(m):
    m.put("q", msg())
    m.fails("bad_request", "put", queue="q", messages=[msg("ok"), {"key": "no body"}])
    assert m.stats("q")["depth"] == 1
    assert m.put("q", msg()) == [2]


def test_idempotent_id_within_the_window_answers_the_original_seq(m):
    m.ok("create_queue", queue="q", config={"dedup_window_ms": 1_000})
    assert m.put("q", msg("a", id="x")) == [1]
    m.now += 999
    again = m.put_result("q", msg("changed", id="x"))
    assert again == [{"seq": 1, "duplicate": True, "replaced_seq": None}]
    assert m.stats("q")["depth"] == 1 and m.stats("q")["put_total"] == 1
    assert [r["body"] for r in m.receive("q")] == ["a"]


def test_idempotent_id_still_deduplicates_after_the_message_was_acked(m):
    m.put("q", msg(id="x"))
    m.ack("q", m.receive("q")[0]["receipt"])
    assert m.put_result("q", msg(id="x"))[0] == {"seq": 1, "duplicate": True, "replaced_seq": None}
    assert m.stats("q")["depth"] == 0


def test_idempotent_id_after_the_window_is_a_new_message(m):
    m.ok("create_queue", queue="q", config={"dedup_window_ms": 1_000})
    m.put("q", msg(id="x"))
    m.now += 1_000
    assert m.put_result("q", msg(id="x")) == [{"seq": 2, "duplicate": False, "replaced_seq": None}]
    # and the window restarts from the new copy
    m.now += 500
    assert m.put_result("q", msg(id="x"))[0]["seq"] == 2


def test_an_emptied_queue_still_ticks_to_forget_the_ids_it_remembers(m):
    m.ok("create_queue", queue="q", config={"dedup_window_ms": 1_000})
    m.put("q", msg(id="x"))
    m.ack("q", m.receive("q")[0]["receipt"])
    assert m.stats("q")["depth"] == 0 and m.sm.read("next_timer") == T0 + 1_000
    m.now += 1_000
    m.ok("tick")
    assert m.sm.read("next_timer") is None


def test_duplicate_ids_within_one_batch_store_one_copy(m):
    result = m.put_result("q", msg("a", id="x"), msg("b"), msg("c", id="x"))
    assert result == [{"seq": 1, "duplicate": False, "replaced_seq": None},
                      {"seq": 2, "duplicate": False, "replaced_seq": None},
                      {"seq": 1, "duplicate": True, "replaced_seq": None}]
    assert m.stored("q") == [1, 2]


def test_idempotency_ids_are_per_queue(m):
    m.put("a", msg(id="x"))
    assert m.put_result("b", msg(id="x"))[0]["duplicate"] is False


def test_keyed_put_replaces_an_unreceived_version(m):
    m.put("q", msg("v1", key="k"), msg("other"))
    result = m.put_result("q", msg("v2", key="k"))
    assert result == [{"seq": 3, "duplicate": False, "replaced_seq": 1}]
    assert m.stored("q") == [2, 3]
    assert [r["body"] for r in m.receive("q")] == ["other", "v2"]
    assert m.stats("q")["replaced_total"] == 1


def test_keyed_put_leaves_a_leased_version_alone_and_appends(m):
    m.put("q", msg("v1", key="k"))
    leased = m.receive("q")
    assert m.put_result("q", msg("v2", key="k")) == [{"seq": 2, "duplicate": False, "replaced_seq": None}]
    assert m.stored("q") == [1, 2]
    assert [r["body"] for r in m.receive("q")] == ["v2"]
    assert m.ack("q", leased[0]["receipt"])["acked"] == 1


def test_keyed_put_leaves_a_once_received_version_alone_even_after_a_nack(m):
    m.put("q", msg("v1", key="k"))
    m.ok("nack", queue="q", receipts=[m.receive("q")[0]["receipt"]])
    assert m.put_result("q", msg("v2", key="k"))[0]["replaced_seq"] is None
    assert [r["body"] for r in m.receive("q")] == ["v1", "v2"]


def test_keyed_put_leaves_a_version_that_one_fanout_group_acked_alone(m):
    m.put("q", msg("v1", key="k"))
    m.ok("add_group", queue="q", group="g2", start="earliest")
    m.ok("commit", queue="q", group="g2", seq=1)
    assert m.put_result("q", msg("v2", key="k"))[0]["replaced_seq"] is None
    assert [r["body"] for r in m.receive("q")] == ["v1", "v2"]


def test_keyed_put_replaces_the_newest_version_only_after_an_older_one_was_received(m):
    m.put("q", msg("v1", key="k"))
    m.receive("q")
    m.put("q", msg("v2", key="k"))
    assert m.put_result("q", msg("v3", key="k"))[0]["replaced_seq"] == 2
    assert m.stored("q") == [1, 3]


def test_keyed_puts_within_one_batch_keep_the_last(m):
    result = m.put_result("q", msg("v1", key="k"), msg("v2", key="k"))
    assert [r["replaced_seq"] for r in result] == [None, 1]
    assert [r["body"] for r in m.receive("q")] == ["v2"]


def test_seq_numbers_are_not_reused_after_removal(m):
    m.put("q", msg(), msg())
    for r in m.receive("q"):
        m.ack("q", r["receipt"])
    assert m.put("q", msg()) == [3]


# ---- receive --------------------------------------------------------------------------

def test_receive_hands_out_in_seq_order_with_the_message_fields(m):
    m.put("q", msg("a", key="k", headers={"h": "1"}), msg(b"\x00raw"))
    m.now += 5
    out = m.receive("q", 1)
    assert len(out) == 1
    first = out[0]
    assert {k: v for k, v in first.items() if k != "receipt"} == {
        "seq": 1, "body": "a", "key": "k", "headers": {"h": "1"}, "deliveries": 1, "put_at_ms": T0,
        "first_received_at_ms": T0 + 5, "ordering_key": None, "priority": 0}
    assert isinstance(first["receipt"], str)
    second = m.receive("q", 5)
    assert [(r["seq"], r["body"], r["key"], r["headers"]) for r in second] == [(2, b"\x00raw", None, None)]
    assert m.receive("q", 5) == []


def test_a_lease_hides_the_message_from_the_rest_of_the_group(m):
    m.put("q", msg())
    assert len(m.receive("q")) == 1
    assert m.receive("q") == []
    assert m.stats("q")["in_flight"] == 1
    assert m.stats("q")["groups"]["default"] == {"depth": 0, "in_flight": 1, "cursor": 1, **NOT_PAUSED}


def test_receive_from_a_missing_group_is_not_found(m):
    m.put("q", msg())
    m.fails("not_found", "receive", queue="q", group="nope", max=1)


# ---- ack / nack / extend ------------------------------------------------------------

def test_ack_removes_the_message(m):
    m.put("q", msg(), msg())
    out = m.receive("q")
    assert m.ack("q", out[0]["receipt"]) == {"acked": 1, "stale": []}
    assert m.stored("q") == [2]
    assert m.stats("q")["acked_total"] == 1


def test_ack_after_lease_expiry_is_stale_and_cannot_touch_the_next_delivery(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 100})
    m.put("q", msg())
    old = m.receive("q")[0]["receipt"]
    m.now += 100
    again = m.receive("q")
    assert [(r["seq"], r["deliveries"]) for r in again] == [(1, 2)]
    result = m.fails("stale_receipt", "ack", queue="q", receipts=[old])
    assert result["stale"] == [old]
    assert m.stats("q")["in_flight"] == 1
    assert m.ack("q", again[0]["receipt"])["acked"] == 1


def test_ack_with_some_stale_receipts_acks_the_rest_and_lists_the_stale(m):
    m.put("q", msg(), msg())
    a, b = (r["receipt"] for r in m.receive("q"))
    m.ack("q", a)
    assert m.ack("q", a, b, "garbage") == {"acked": 1, "stale": [a, "garbage"]}
    assert m.stats("q")["depth"] == 0


def test_a_receipt_with_digits_raftq_never_writes_is_stale_not_an_internal_error(m):
    m.put("q", msg())
    r = m.receive("q")[0]["receipt"]
    incarnation, group, seq, token = r.split(":")
    odd = [f"\u00b2:{group}:{seq}:{token}", f"{incarnation}:{group}:\u0661:{token}", f"{r}:1", f"+{r}"]
    assert m.fails("stale_receipt", "ack", queue="q", receipts=odd)["stale"] == odd
    assert m.ack("q", r) == {"acked": 1, "stale": []}


def test_ack_where_every_receipt_is_stale_is_a_stale_receipt_error(m):
    m.put("q", msg())
    r = m.receive("q")[0]["receipt"]
    m.ack("q", r)
    before = m.sm.snapshot()
    assert m.ack("q", r, "x:1:2")["error"] == "stale_receipt"
    assert m.sm.snapshot() == before


def test_a_stale_receipt_given_twice_is_still_all_stale(m):
    m.put("q", msg())
    r = m.receive("q")[0]["receipt"]
    m.ack("q", r)
    assert m.fails("stale_receipt", "ack", queue="q", receipts=[r, r])["stale"] == [r]


def test_the_same_receipt_twice_in_one_ack_counts_once(m):
    m.put("q", msg())
    r = m.receive("q")[0]["receipt"]
    assert m.ack("q", r, r) == {"acked": 1, "stale": []}
    assert m.stats("q")["acked_total"] == 1


def test_nack_of_an_already_acked_message_is_stale(m):
    m.put("q", msg())
    r = m.receive("q")[0]["receipt"]
    m.ack("q", r)
    m.fails("stale_receipt", "nack", queue="q", receipts=[r])
    assert m.stats("q")["depth"] == 0


def test_a_receipt_only_works_on_the_queue_that_issued_it(m):
    m.put("a", msg())
    m.put("b", msg())
    ra = m.receive("a")[0]["receipt"]
    m.receive("b")
    m.fails("stale_receipt", "ack", queue="b", receipts=[ra])
    assert m.stats("b")["in_flight"] == 1


def test_a_receipt_from_a_deleted_queue_is_stale_in_the_queue_recreated_under_its_name(m):
    m.put("q", msg())
    old = m.receive("q")[0]["receipt"]
    m.ok("delete_queue", queue="q")
    m.put("q", msg())
    m.receive("q")
    m.fails("stale_receipt", "ack", queue="q", receipts=[old])
    assert m.stats("q")["in_flight"] == 1


def test_nack_makes_the_message_ready_again_keeping_its_seq(m):
    m.put("q", msg(), msg(), msg())
    first = m.receive("q", 1)[0]
    assert m.seqs("q", 1) == [2]
    assert m.ok("nack", queue="q", receipts=[first["receipt"]]) == {"nacked": 1, "stale": []}
    again = m.receive("q", 5)
    assert [(r["seq"], r["deliveries"]) for r in again] == [(1, 2), (3, 1)]
    assert m.stats("q")["redelivered_total"] == 1


def test_nack_with_delay_hides_the_message_until_the_delay_has_passed(m):
    m.put("q", msg())
    m.ok("nack", queue="q", receipts=[m.receive("q")[0]["receipt"]], delay_ms=500)
    assert m.stats("q")["delayed"] == 1
    m.now += 499
    assert m.receive("q") == []
    m.now += 1
    assert m.seqs("q") == [1]


def test_requeued_messages_keep_their_place_in_seq_order(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 100})
    m.put("q", msg(), msg(), msg(), msg())
    out = m.receive("q", 3)
    m.ok("nack", queue="q", receipts=[out[2]["receipt"]])
    m.now += 100   # 1 and 2 expire
    assert m.seqs("q") == [1, 2, 3, 4]


def test_extend_pushes_the_lease_out(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 100})
    m.put("q", msg())
    r = m.receive("q")[0]["receipt"]
    m.now += 50
    assert m.ok("extend", queue="q", receipts=[r], lease_ms=200) == {"extended": 1, "stale": []}
    m.now = T0 + 249
    assert m.receive("q") == []
    assert m.ack("q", r)["acked"] == 1


def test_extend_defaults_to_the_queue_lease_and_never_shortens(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 100})
    m.put("q", msg())
    r = m.receive("q", lease_ms=1_000)[0]["receipt"]
    m.ok("extend", queue="q", receipts=[r])        # now + 100 < the current deadline
    m.now += 999
    assert m.receive("q") == []
    m.now += 1
    assert m.seqs("q") == [1]


def test_extend_after_expiry_is_stale(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 100})
    m.put("q", msg())
    r = m.receive("q")[0]["receipt"]
    m.now += 100
    m.fails("stale_receipt", "extend", queue="q", receipts=[r])


# ---- leases and log time -----------------------------------------------------------------

def test_lease_expires_on_tick(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 100})
    m.put("q", msg())
    m.receive("q")
    m.tick(T0 + 99)
    assert m.stats("q")["in_flight"] == 1
    m.tick(T0 + 100)
    assert m.stats("q")["in_flight"] == 0
    assert m.stats("q")["groups"]["default"]["depth"] == 1


def test_a_tick_fires_the_queues_with_a_timer_due_and_no_other(m, monkeypatch):
    """Thousands of stored-into queues, one lease due: the tick (and the leader's next_timer read
    before it) cost the queues that are due, not every queue (statemachine/due.py)."""
    for i in range(2_000):
        m.put(f"idle{i}", msg())
    for name, lease_ms in (("soon", 100), ("later", 500)):
        m.ok("create_queue", queue=name, config={"lease_ms": lease_ms})
        m.put(name, msg())
        m.receive(name)
    assert m.sm.read("next_timer") == T0 + 100
    fired = []
    advance = Queue.advance
    monkeypatch.setattr(Queue, "advance", lambda queue, clock: (fired.append(queue.name), advance(queue, clock)))
    m.tick(T0 + 100)
    assert fired == ["soon"]
    assert m.stats("soon")["in_flight"] == 0 and m.stats("later")["in_flight"] == 1
    assert m.sm.read("next_timer") == T0 + 500


def test_lease_expires_lazily_on_the_next_command_that_looks_at_the_queue(m):
    m.put("q", msg())
    m.receive("q", lease_ms=100)
    m.now += 100
    # the stats are a read-only query: they show what the log has applied so far
    assert m.stats("q")["in_flight"] == 1
    assert [(r["seq"], r["deliveries"]) for r in m.receive("q")] == [(1, 2)]


def test_a_command_with_an_older_now_ms_does_not_move_log_time_back(m):
    m.put("q", msg())
    r = m.receive("q", lease_ms=100)[0]["receipt"]
    m.tick(T0 + 99)
    assert m.tick(T0 - 10_000) == {"clock": T0 + 99}
    # a receive stamped before the lease began still lives at log time T0+99
    assert m.receive("q", now=T0 - 10_000, lease_ms=1) == []
    assert m.ack("q", r) == {"acked": 1, "stale": []}


# ---- the wall time of log time (statemachine/wall.py) ------------------------------------

DOWN_MS = 600_000    # a whole cluster down ten minutes: log time paused, the wall clock did not


def test_a_leaders_tick_records_the_wall_time_of_log_time_for_moments_before_and_after_an_outage(m):
    m.ok("tick", wall_ms=T0 + 3)                 # a brand-new cluster: log time began at the wall clock
    m.put("q", msg("before"))
    assert m.receive("q")[0]["put_at_ms"] == T0
    m.now = T0 + 1                               # the next leader, after the outage: 1 ms on from the last
    m.ok("tick", wall_ms=T0 + 1 + DOWN_MS)
    m.now = T0 + 500
    m.put("q", msg("after"))
    assert m.sm.read("wall_times", [T0, T0 + 1, T0 + 500]) == [T0 + 3, T0 + 1 + DOWN_MS, T0 + 500 + DOWN_MS]


def test_the_wall_time_of_log_time_is_not_state_a_lease_reads(m):
    m.put("q", msg())
    r = m.receive("q", lease_ms=1_000)[0]["receipt"]
    m.ok("tick", wall_ms=T0 + DOWN_MS)           # a wall clock ten minutes ahead ends no lease
    assert m.ack("q", r) == {"acked": 1, "stale": []}


def test_wall_readings_within_the_tolerance_start_no_epoch_and_a_second_reading_of_a_moment_replaces_it(m):
    m.ok("tick", wall_ms=T0)
    m.now = T0 + 1_000
    m.ok("tick", wall_ms=T0 + 1_000 + TOLERANCE_MS)       # a slewed clock: the same epoch
    m.ok("tick", wall_ms=T0 + 1_000 + 5_000)              # read again at the same moment: it wins
    assert m.sm.read("wall_times", [T0, T0 + 1_000]) == [T0, T0 + 1_000 + 5_000]


def test_the_oldest_epochs_go_first_and_a_moment_before_them_takes_the_oldest_kept(m):
    for n in range(MAX_EPOCHS + 2):
        m.now = T0 + n
        m.ok("tick", wall_ms=T0 + n + 1_000 * (n % 2))
    assert len(m.sm.wall.starts) == MAX_EPOCHS
    assert m.sm.read("wall_times", [T0]) == [T0]    # by the epoch of T0 + 2 (offset 0), the oldest kept


def test_a_tick_s_wall_clock_is_checked(m):
    for bad in (-1, "1", 1.5, True):
        m.fails("bad_request", "tick", wall_ms=bad)


def test_the_wall_time_of_log_time_survives_a_snapshot_and_a_version_15_one_restores_without_it(m):
    m.ok("tick", wall_ms=T0 + DOWN_MS)
    restored = StateMachine()
    restored.restore(m.sm.snapshot())
    assert restored.read("wall_times", [T0]) == [T0 + DOWN_MS]
    older = downgraded(m.sm.snapshot(), 15)
    del older["wall_times"]
    restored.restore(cbor2.dumps(older))
    assert restored.read("wall_times", [T0]) == [T0]


def test_leases_follow_log_time_not_the_stamp_of_the_command(m):
    m.put("q", msg())
    m.tick(T0 + 500)
    # a receive stamped in the past leases from the log clock, so its lease
    # runs to T0+600, not T0+100
    r = m.receive("q", now=T0, lease_ms=100)[0]["receipt"]
    m.tick(T0 + 599)
    assert m.stats("q")["in_flight"] == 1
    assert m.ack("q", r)["acked"] == 1


# ---- max_deliveries and dead letters -----------------------------------------------------

def dead_letter_queue(m, **config):
    m.ok("create_queue", queue="q", config={"lease_ms": 100, "max_deliveries": 2, "dead_letter": "dlq",
                                             **config})


def test_nack_and_lease_expiry_both_count_toward_max_deliveries(m):
    dead_letter_queue(m)
    m.put("q", msg("poison", key="k", headers={"h": "v"}))
    m.ok("nack", queue="q", receipts=[m.receive("q")[0]["receipt"]])
    assert [r["deliveries"] for r in m.receive("q")] == [2]
    m.tick(T0 + 100)                      # the second delivery ends by expiry
    assert m.stats("q")["depth"] == 0
    assert m.stats("q")["dead_lettered_total"] == 1
    moved = m.receive("dlq")
    assert [(r["body"], r["key"]) for r in moved] == [("poison", "k")]
    assert moved[0]["headers"] == {"h": "v", "x-raftq-from-queue": "q", "x-raftq-from-group": "default",
                                   "x-raftq-deliveries": "2", "x-raftq-reason": "max_deliveries"}


def test_a_message_is_not_delivered_more_than_max_deliveries_times(m):
    dead_letter_queue(m)
    m.put("q", msg())
    for _ in range(2):
        m.ok("nack", queue="q", receipts=[m.receive("q")[0]["receipt"]])
    assert m.receive("q") == []
    assert len(m.receive("dlq")) == 1


def test_spent_message_without_a_dead_letter_queue_is_dropped(m):
    m.ok("create_queue", queue="q", config={"max_deliveries": 1})
    m.put("q", msg(), msg())
    m.ok("nack", queue="q", receipts=[m.receive("q", 1)[0]["receipt"]])
    assert m.stored("q") == [2]
    assert m.stats("q")["dead_lettered_total"] == 1
    assert [q["name"] for q in m.sm.list_queues()["queues"]] == ["q"]


def test_lowering_max_deliveries_stops_further_deliveries_of_a_message_already_past_it(m):
    m.put("q", msg(), msg())
    for _ in range(3):
        m.ok("nack", queue="q", receipts=[m.receive("q", 1)[0]["receipt"]])
    m.ok("patch_queue", queue="q", config={"max_deliveries": 2, "dead_letter": "dlq"})
    assert m.seqs("q") == [2]
    moved = m.receive("dlq")
    assert [r["headers"]["x-raftq-deliveries"] for r in moved] == ["3"]


def test_full_dead_letter_queue_keeps_the_message_parked_until_room_appears(m):
    dead_letter_queue(m, max_deliveries=1)
    m.ok("create_queue", queue="dlq", config={"max_length": 1})
    m.put("dlq", msg("occupant"))
    m.put("q", msg("poison"), msg("next"))
    m.ok("nack", queue="q", receipts=[m.receive("q", 1)[0]["receipt"]])
    # parked: stored, neither ready nor leased, never handed out again
    assert m.stored("q") == [1, 2]
    assert m.seqs("q", lease_ms=100_000) == [2]
    assert m.sm.group_info("q", "default")["cursor"] == 1
    assert m.stats("q")["dead_lettered_total"] == 0
    m.tick(T0 + 10_000)
    assert m.stored("q") == [1, 2]
    assert m.stats("dlq")["depth"] == 1
    m.ack("dlq", m.receive("dlq")[0]["receipt"])
    m.tick(T0 + 20_000)
    assert m.stored("q") == [2]
    assert [r["body"] for r in m.receive("dlq")] == ["poison"]
    assert m.stats("q")["dead_lettered_total"] == 1


def test_dead_letter_queue_with_drop_oldest_takes_the_message_and_drops_its_oldest(m):
    dead_letter_queue(m, max_deliveries=1)
    m.ok("create_queue", queue="dlq", config={"max_length": 1, "overflow": "drop_oldest"})
    m.put("dlq", msg("occupant"))
    m.put("q", msg("poison"))
    m.ok("nack", queue="q", receipts=[m.receive("q")[0]["receipt"]])
    assert [r["body"] for r in m.receive("dlq")] == ["poison"]
    assert m.stats("dlq")["dropped_total"] == 1


def test_a_dead_letter_replaces_an_unreceived_version_of_its_key(m):
    # a move is a put into the dead-letter queue: one key keeps one unreceived version there
    dead_letter_queue(m, max_deliveries=1)
    m.put("dlq", msg("older", key="k"))
    m.put("q", msg("poison", key="k"))
    m.ok("nack", queue="q", receipts=[m.receive("q")[0]["receipt"]])
    assert [r["body"] for r in m.receive("dlq")] == ["poison"]
    assert m.stats("dlq")["replaced_total"] == 1


def test_a_dead_letter_expires_by_its_dead_letter_queue_s_ttl_on_a_tick(m):
    # The move is the dead-letter queue's first timer: the tick must come for it.
    dead_letter_queue(m, max_deliveries=1)
    m.ok("create_queue", queue="dlq", config={"ttl_ms": 1_000})
    m.put("q", msg("poison"))
    receipt = m.receive("q")[0]["receipt"]
    assert m.sm.read("next_timer") == T0 + 100             # the lease's end, as the leader asks
    m.ok("nack", queue="q", receipts=[receipt])
    assert m.stats("dlq")["depth"] == 1 and m.sm.read("next_timer") == T0 + 1_000
    m.tick(T0 + 1_000)
    assert m.stats("dlq")["depth"] == 0 and m.stats("dlq")["expired_total"] == 1


def test_dead_lettering_in_one_fanout_group_leaves_the_message_to_the_others(m):
    dead_letter_queue(m, max_deliveries=1)
    m.ok("add_group", queue="q", group="g2")
    m.put("q", msg())
    m.ok("nack", queue="q", receipts=[m.receive("q")[0]["receipt"]])
    assert m.receive("q") == []
    moved = m.receive("dlq")
    assert moved[0]["headers"]["x-raftq-from-group"] == "default"
    assert m.seqs("q", group="g2") == [1]


# ---- redrive ---------------------------------------------------------------------------

def spend(m, queue, count=1, group="default"):
    """Receive and nack `count` messages once each: with max_deliveries 1 they die."""
    for r in m.receive(queue, count, group):
        m.ok("nack", queue=queue, receipts=[r["receipt"]])


def test_redrive_moves_dead_letters_back_with_their_own_headers_and_counts_them(m):
    dead_letter_queue(m, max_deliveries=1)
    m.put("q", msg("a", key="k", headers={"h": "v"}), msg("b"))
    spend(m, "q", 2)
    assert m.stats("dlq")["depth"] == 2
    assert m.ok("redrive", queue="dlq") == {"moved": 2, "to": {"q": 2}, "duplicate": False}
    assert m.stats("dlq")["depth"] == 0
    assert m.stats("dlq")["redriven_total"] == 2
    back = m.receive("q")
    assert [(r["seq"], r["body"], r["key"], r["headers"], r["deliveries"]) for r in back] == [
        (3, "a", "k", {"h": "v"}, 1), (4, "b", None, None, 1)]
    assert m.stats("q")["put_total"] == 4


def test_redrive_honours_max_and_from_queue_in_seq_order(m):
    dead_letter_queue(m, max_deliveries=1)
    m.ok("create_queue", queue="other", config={"max_deliveries": 1, "dead_letter": "dlq"})
    m.put("q", msg("q1"), msg("q2"))
    m.put("other", msg("o1"))
    spend(m, "q", 1)
    spend(m, "other", 1)
    spend(m, "q", 1)
    assert m.ok("redrive", queue="dlq", from_queue="q", max=1)["to"] == {"q": 1}
    assert [r["body"] for r in m.receive("q")] == ["q1"]
    assert m.ok("redrive", queue="dlq", max=5)["to"] == {"other": 1, "q": 1}
    assert m.ok("redrive", queue="dlq") == {"moved": 0, "to": {}, "duplicate": False}


def test_redrive_leaves_plain_messages_leased_dead_letters_and_those_of_missing_queues(m):
    dead_letter_queue(m, max_deliveries=1)
    m.put("dlq", msg("put there by hand"))
    m.put("q", msg("leased"), msg("of a deleted queue"))
    spend(m, "q", 2)
    assert m.seqs("dlq", 1, lease_ms=10_000) == [1]           # the hand-put message
    m.receive("dlq", 1, lease_ms=10_000)                       # "leased" is being handled
    m.ok("delete_queue", queue="q")
    assert m.ok("redrive", queue="dlq")["moved"] == 0
    assert m.stored("dlq") == [1, 2, 3]
    m.ok("create_queue", queue="q", config={})
    assert m.ok("redrive", queue="dlq")["to"] == {"q": 1}      # the leased one stays
    assert [r["body"] for r in m.receive("q")] == ["of a deleted queue"]


def test_redrive_into_a_full_queue_moves_nothing_for_it_and_keeps_the_order(m):
    dead_letter_queue(m, max_deliveries=1)
    m.put("q", msg("first"), msg("second"))
    spend(m, "q", 2)
    m.ok("patch_queue", queue="q", config={"max_length": 1})
    m.put("q", msg("occupant"))
    assert m.ok("redrive", queue="dlq")["moved"] == 0
    m.ack("q", m.receive("q")[0]["receipt"])
    assert m.ok("redrive", queue="dlq")["moved"] == 1
    assert [r["body"] for r in m.receive("q")] == ["first"]
    assert [m_["body"] for m_ in m.sm.browse("dlq", "default", 0, 10)["messages"]] == ["second"]


def test_a_retried_redrive_with_the_same_id_answers_the_first_result_and_moves_nothing(m):
    dead_letter_queue(m, max_deliveries=1)
    m.put("q", msg("a"), msg("b"))
    spend(m, "q", 2)
    first = m.ok("redrive", queue="dlq", max=1, id="r-1")
    assert first == {"moved": 1, "to": {"q": 1}, "duplicate": False}
    assert m.ok("redrive", queue="dlq", max=1, id="r-1") == {"moved": 1, "to": {"q": 1}, "duplicate": True}
    assert m.stats("dlq")["depth"] == 1
    # the id is remembered for the dead-letter queue's dedup window, through a snapshot too
    data = m.sm.snapshot()
    m.sm = StateMachine()
    m.sm.restore(data)
    assert m.ok("redrive", queue="dlq", max=1, id="r-1")["duplicate"] is True
    m.now += 300_000
    assert m.ok("redrive", queue="dlq", max=1, id="r-1") == {"moved": 1, "to": {"q": 1}, "duplicate": False}


def test_a_redriven_message_expires_by_its_source_queue_s_ttl_on_a_tick(m):
    # Moved back, it is the source's only timer: the tick must come for it.
    dead_letter_queue(m, max_deliveries=1)
    m.ok("patch_queue", queue="q", config={"ttl_ms": 1_000})
    m.put("q", msg("poison"))
    spend(m, "q")
    assert m.sm.read("next_timer") is None
    m.now += 500
    m.ok("redrive", queue="dlq")
    assert m.stats("q")["depth"] == 1 and m.sm.read("next_timer") == T0 + 1_500
    m.tick(T0 + 1_500)
    assert m.stats("q")["depth"] == 0 and m.stats("q")["expired_total"] == 1


def test_a_redriven_message_that_dies_again_returns_to_the_dead_letter_queue(m):
    dead_letter_queue(m, max_deliveries=1)
    m.put("q", msg("poison"))
    spend(m, "q")
    m.ok("redrive", queue="dlq")
    spend(m, "q")
    again = m.receive("dlq")
    assert [(r["body"], r["headers"]["x-raftq-deliveries"]) for r in again] == [("poison", "1")]


def test_a_version_4_snapshot_from_before_redrive_restores_with_nothing_redriven(m):
    dead_letter_queue(m, max_deliveries=1)
    m.put("q", msg("a"))
    spend(m, "q")
    state = downgraded(m.sm.snapshot(), 4)
    state["queues"] = [q[:5] + [q[5][:7]] + q[6:10] for q in state["queues"]]
    restored = StateMachine()
    restored.restore(cbor2.dumps(state))
    assert restored.queue_info("dlq")["stats"]["redriven_total"] == 0
    assert restored.apply({"op": "redrive", "queue": "dlq", "now_ms": T0})["moved"] == 1


def test_redrive_of_a_missing_queue_is_not_found(m):
    m.fails("not_found", "redrive", queue="nothing")


# ---- TTL and delays ------------------------------------------------------------------

def test_message_ttl_expires_it_even_while_leased(m):
    m.put("q", msg(ttl_ms=100), msg())
    r = m.receive("q", 1)[0]["receipt"]
    m.tick(T0 + 99)
    assert m.stored("q") == [1, 2]
    m.tick(T0 + 100)
    assert m.stored("q") == [2]
    assert m.stats("q")["expired_total"] == 1
    m.fails("stale_receipt", "ack", queue="q", receipts=[r])


def test_queue_ttl_applies_unless_the_message_has_its_own(m):
    m.ok("create_queue", queue="q", config={"ttl_ms": 100})
    m.put("q", msg(), msg(ttl_ms=1_000))
    m.now += 100
    assert m.seqs("q") == [2]


def test_delay_ms_hides_a_message_until_it_is_due(m):
    m.put("q", msg(delay_ms=100), msg())
    assert m.stats("q")["delayed"] == 1
    assert m.seqs("q") == [2]
    m.tick(T0 + 100)
    assert m.stats("q")["delayed"] == 0
    assert m.seqs("q") == [1]


def test_a_delayed_message_can_expire_before_it_shows(m):
    m.put("q", msg(delay_ms=200, ttl_ms=100))
    m.now += 200
    assert m.receive("q") == []
    assert m.stats("q")["expired_total"] == 1


# ---- limits ----------------------------------------------------------------------------

def test_max_length_reject_refuses_a_batch_that_does_not_fit_whole(m):
    m.ok("create_queue", queue="q", config={"max_length": 3})
    m.put("q", msg(), msg())
    before = m.sm.snapshot()
    m.fails("queue_full", "put", queue="q", messages=[msg(), msg()])
    assert m.sm.snapshot() == before
    assert m.put("q", msg()) == [3]
    m.fails("queue_full", "put", queue="q", messages=[msg()])


def test_max_bytes_reject_counts_body_bytes(m):
    m.ok("create_queue", queue="q", config={"max_bytes": 10})
    m.put("q", msg(b"12345"), msg("abc"))
    m.fails("queue_full", "put", queue="q", messages=[msg(b"123")])
    assert m.put("q", msg(b"12")) == [3]
    assert m.stats("q")["bytes"] == 10


def test_headers_key_and_id_count_toward_max_bytes(m):
    m.ok("create_queue", queue="q", config={"max_bytes": 100})
    m.fails("queue_full", "put", queue="q", messages=[msg(b"", headers={"h": "v" * 100})])
    m.fails("queue_full", "put", queue="q", messages=[msg(b"", key="k" * 101)])
    m.fails("queue_full", "put", queue="q", messages=[msg(b"", id="i" * 101)])
    m.put("q", msg(b"12", key="k", id="i", headers={"ab": "cd"}))
    assert m.stats("q")["bytes"] == 2 + 1 + 1 + 4


def test_a_put_with_a_dedup_budget_forgets_the_oldest_ids_beyond_it(m):
    m.put("q", msg(id="aaaa"), msg(id="bbbb"), dedup_max_bytes=8)
    m.put("q", msg(id="cc"), dedup_max_bytes=8)          # 10 bytes of ids: "aaaa" goes
    assert [r["duplicate"] for r in m.put_result("q", msg(id="bbbb"), msg(id="cc"))] == [True, True]
    assert m.put_result("q", msg(id="aaaa"))[0]["duplicate"] is False
    m.fails("bad_request", "put", queue="q", messages=[msg()], dedup_max_bytes=-1)


def test_reject_counts_duplicates_and_replacements_as_taking_no_room(m):
    m.ok("create_queue", queue="q", config={"max_length": 2})
    m.put("q", msg(id="x"), msg(key="k"))
    result = m.put_result("q", msg(id="x"), msg("new", key="k"))
    assert [(r["duplicate"], r["replaced_seq"]) for r in result] == [(True, None), (False, 2)]
    assert m.stored("q") == [1, 3]


def test_a_retried_put_is_answered_even_when_a_patch_left_the_queue_over_its_limit(m):
    m.ok("create_queue", queue="q", config={"max_length": 3})
    m.put("q", msg(id="a"), msg(id="b"), msg(id="c"))
    m.ok("patch_queue", queue="q", config={"max_length": 1})
    retried = m.put_result("q", msg(id="b"))
    assert retried == [{"seq": 2, "duplicate": True, "replaced_seq": None}]
    m.fails("queue_full", "put", queue="q", messages=[msg(id="d")])
    assert m.stored("q") == [1, 2, 3]


def test_reject_counts_a_key_repeated_within_the_batch_once(m):
    m.ok("create_queue", queue="q", config={"max_length": 2})
    m.put("q", msg())
    result = m.put_result("q", msg("v1", key="k"), msg("v2", key="k"))
    assert [r["replaced_seq"] for r in result] == [None, 2]
    assert m.stored("q") == [1, 3]


def test_reject_counts_a_received_keyed_version_as_taking_room(m):
    m.ok("create_queue", queue="q", config={"max_length": 1})
    m.put("q", msg(key="k"))
    m.receive("q")
    m.fails("queue_full", "put", queue="q", messages=[msg(key="k")])


def test_drop_oldest_makes_room_by_dropping_the_oldest(m):
    m.ok("create_queue", queue="q", config={"max_length": 3, "overflow": "drop_oldest"})
    m.put("q", msg(), msg(), msg())
    r = m.receive("q", 1)[0]["receipt"]
    assert m.put("q", msg(), msg()) == [4, 5]
    assert m.stored("q") == [3, 4, 5]
    assert m.stats("q")["dropped_total"] == 2
    m.fails("stale_receipt", "ack", queue="q", receipts=[r])


def test_drop_oldest_by_bytes(m):
    m.ok("create_queue", queue="q", config={"max_bytes": 10, "overflow": "drop_oldest"})
    m.put("q", msg(b"1234"), msg(b"1234"))
    m.put("q", msg(b"123"))
    assert m.stored("q") == [2, 3]
    assert m.stats("q")["bytes"] == 7


def test_drop_oldest_still_refuses_a_batch_larger_than_the_limit_alone(m):
    m.ok("create_queue", queue="q", config={"max_length": 2, "overflow": "drop_oldest"})
    m.put("q", msg())
    before = m.sm.snapshot()
    m.fails("queue_full", "put", queue="q", messages=[msg(), msg(), msg()])
    assert m.sm.snapshot() == before


# ---- the cluster's stored bytes (--max-stored-bytes, issue 47) -------------------------------

CAP = {"max_stored_bytes": 10}


def test_a_put_past_the_stored_bytes_cap_is_refused_whole_and_one_up_to_it_is_taken(m):
    m.put("a", msg(b"1234"), **CAP)
    m.put("b", msg(b"12"), **CAP)
    before = m.sm.snapshot()
    refused = m.fails("insufficient_storage", "put", queue="a", messages=[msg(b"1"), msg(b"1234")], **CAP)
    assert refused["stored_bytes"] == 6 and refused["limit"] == 10
    assert "stores 6 bytes" in refused["message"] and "add 5" in refused["message"]
    assert "--max-stored-bytes" in refused["message"]
    assert m.sm.snapshot() == before
    m.fails("insufficient_storage", "put", queue="new", messages=[msg(b"12345")], **CAP)
    assert "new" not in m.sm.queues                     # refused before the queue was made
    assert m.put("new", msg(b"1234"), **CAP) == [1]     # exactly up to the cap
    assert m.sm.stored_usage() == {"bytes": 10}
    m.fails("insufficient_storage", "put", queue="a", messages=[msg(b"x")], **CAP)
    assert m.put("a", msg(b"x")) == [2]                 # a command without the cap is not capped


def test_what_the_stored_bytes_cap_counts_leaves_as_messages_go(m):
    m.put("q", msg(b"12345"), msg(b"12345", key="k", id="i"), max_stored_bytes=12)
    assert m.sm.stored_usage() == {"bytes": 12}          # the key and id count, as for max_bytes
    m.fails("insufficient_storage", "put", queue="q", messages=[msg(b"1")], max_stored_bytes=12)
    m.ack("q", m.receive("q", 1)[0]["receipt"])
    assert m.sm.stored_usage() == {"bytes": 7}
    assert m.put("q", msg(b"123"), **CAP) == [3]
    m.ok("delete_queue", queue="q")
    assert m.sm.stored_usage() == {"bytes": 0}
    m.put("q", msg(b"x", ttl_ms=100))
    m.tick(m.now + 100)
    assert m.sm.stored_usage() == {"bytes": 0}


def test_puts_that_grow_nothing_are_taken_past_the_stored_bytes_cap(m):
    m.put("q", msg(b"12345", id="a"), msg(b"12345", key="k"))
    retried = m.put_result("q", msg(b"12345", id="a"), **CAP)
    assert retried == [{"seq": 1, "duplicate": True, "replaced_seq": None}]
    assert m.put_result("q", msg(b"54321", key="k"), **CAP)[0]["replaced_seq"] == 2
    m.fails("insufficient_storage", "put", queue="q", messages=[msg(b"123456", key="k")], **CAP)


def test_a_drop_oldest_queue_at_its_max_bytes_is_taken_at_the_stored_bytes_cap(m):
    m.ok("create_queue", queue="ring", config={"max_bytes": 8, "overflow": "drop_oldest"})
    m.put("ring", msg(b"1234"), msg(b"1234"))
    m.put("other", msg(b"12"))
    assert m.put("ring", msg(b"1234"), **CAP) == [3]     # it drops as much as it takes
    m.fails("insufficient_storage", "put", queue="other", messages=[msg(b"1")], **CAP)


def test_a_transaction_past_the_stored_bytes_cap_acks_nothing_and_one_of_acks_alone_is_taken(m):
    m.put("q", msg(b"12345"), msg(b"12345"))
    first, second = (r["receipt"] for r in m.receive("q", 2))
    before = m.sm.snapshot()
    m.fails("insufficient_storage", "tx", ack=[{"queue": "q", "receipts": [first]}],
            put=[{"queue": "r", "messages": [msg(b"1")]}], **CAP)
    assert m.sm.snapshot() == before
    assert m.ok("tx", ack=[{"queue": "q", "receipts": [first]}], put=[], **CAP)["acked"] == 1
    result = m.ok("tx", ack=[{"queue": "q", "receipts": [second]}], put=[{"queue": "r", "messages": [msg(b"1")]}],
                  **CAP)
    assert result["acked"] == 1 and m.sm.stored_usage() == {"bytes": 1}


def test_a_stage_commit_past_the_stored_bytes_cap_keeps_its_stages_for_later(m):
    m.ok("stage", producer="p", token="t", chunk=0, queue="q", messages=[msg(b"123456")])
    m.put("q", msg(b"12345"))
    commit = {"producer": "p", "batch": 0, "parts": [{"token": "t", "chunks": 1}], **CAP}
    m.fails("insufficient_storage", "stage_commit", **commit)
    m.ack("q", m.receive("q", 1)[0]["receipt"])
    assert m.ok("stage_commit", **commit)["put"] == 1


def test_dead_letters_and_redrives_move_past_the_stored_bytes_cap(m):
    m.ok("create_queue", queue="q", config={"max_deliveries": 1, "dead_letter": "dlq", "lease_ms": 100})
    m.put("q", msg(b"1234567890"), **CAP)
    m.receive("q")
    m.tick(m.now + 100)                         # the lease ends: the message dies, with its reason headers
    assert m.stats("dlq")["depth"] == 1 and m.sm.stored_usage()["bytes"] > 10
    assert m.ok("redrive", queue="dlq")["moved"] == 1
    assert m.stats("q")["depth"] == 1


def test_a_restored_machine_counts_the_stored_bytes_again(m):
    m.put("a", msg(b"1234"))
    m.put("b", msg(b"123456"), msg(b"1"))
    m.ack("b", m.receive("b", 1)[0]["receipt"])
    restored = StateMachine()
    restored.restore(m.sm.snapshot())
    assert restored.stored_usage() == m.sm.stored_usage() == {"bytes": 5}
    m.sm = restored
    m.fails("insufficient_storage", "put", queue="a", messages=[msg(b"123456")], **CAP)
    m.ok("delete_queue", queue="a")
    assert m.put("a", msg(b"123456789"), **CAP) == [1]


def test_a_stored_bytes_cap_in_a_command_is_a_non_negative_integer(m):
    for op, fields in (("put", {"queue": "q", "messages": [msg()]}), ("tx", {"ack": [], "put": []}),
                       ("stage_commit", {"producer": "p", "batch": 0, "parts": []})):
        m.fails("bad_request", op, max_stored_bytes=-1, **fields)
        m.fails("bad_request", op, max_stored_bytes="10", **fields)


# ---- fanout groups -------------------------------------------------------------------

def test_group_at_earliest_sees_stored_messages_and_latest_only_later_ones(m):
    m.put("q", msg(), msg())
    m.ack("q", m.receive("q", 1)[0]["receipt"])
    assert m.ok("add_group", queue="q", group="early", start="earliest") == {
        "created": True, "name": "early", "depth": 1, "in_flight": 0, "cursor": 2, **NOT_PAUSED}
    assert m.ok("add_group", queue="q", group="late", start="latest")["created"] is True
    m.put("q", msg())
    assert m.seqs("q", group="early") == [2, 3]
    assert m.seqs("q", group="late") == [3]


def test_a_group_starts_at_the_earliest_message_only_while_one_entry_can_afford_it(m):
    for first in range(0, MAX_EARLIEST_GROUP_MESSAGES, 10_000):
        m.put("q", *[msg() for _ in range(10_000)])
    assert m.ok("add_group", queue="q", group="at-the-cap", start="earliest")["depth"] == MAX_EARLIEST_GROUP_MESSAGES
    m.put("q", msg())
    before = m.sm.snapshot()
    m.fails("conflict", "add_group", queue="q", group="past-the-cap", start="earliest")
    assert m.sm.snapshot() == before
    assert m.ok("add_group", queue="q", group="past-the-cap", start="latest")["created"] is True


def test_the_group_cap_in_the_command_counts_the_default_group_and_spares_existing_groups(m):
    m.put("q", msg())
    assert m.ok("add_group", queue="q", group="g2", max_groups=2)["created"] is True
    before = m.sm.snapshot()
    refused = m.fails("limit_reached", "add_group", queue="q", group="g3", max_groups=2)
    assert "2 groups" in refused["message"] and "--max-groups-per-queue" in refused["message"]
    assert m.sm.snapshot() == before
    assert m.ok("add_group", queue="q", group="g2", max_groups=2)["created"] is False
    assert m.ok("add_group", queue="q", group="g3", max_groups=3)["created"] is True
    m.fails("bad_request", "add_group", queue="q", group="g4", max_groups=-1)


def test_group_at_earliest_keeps_a_pending_delay(m):
    m.put("q", msg(delay_ms=100))
    m.ok("add_group", queue="q", group="g2", start="earliest")
    assert m.receive("q", group="g2") == []
    m.now += 100
    assert m.seqs("q", group="g2") == [1]


def test_group_at_latest_ignores_a_message_still_delayed_at_its_creation(m):
    m.put("q", msg(delay_ms=100))
    m.ok("add_group", queue="q", group="g2", start="latest")
    m.now += 100
    assert m.receive("q", group="g2") == []
    assert m.seqs("q") == [1]


def test_adding_an_existing_group_changes_nothing(m):
    m.put("q", msg())
    m.receive("q")
    assert m.ok("add_group", queue="q", group="default", start="latest") == {
        "created": False, "name": "default", "depth": 0, "in_flight": 1, "cursor": 1, **NOT_PAUSED}


def test_fanout_removes_a_message_only_when_every_group_acked_it(m):
    m.ok("create_queue", queue="q", config={})
    m.ok("add_group", queue="q", group="g2")
    m.put("q", msg())
    m.ack("q", m.receive("q")[0]["receipt"])
    assert m.stats("q")["depth"] == 1
    assert m.receive("q") == []                       # done for default
    m.ack("q", m.receive("q", group="g2")[0]["receipt"])
    assert m.stats("q")["depth"] == 0


def test_each_group_leases_on_its_own(m):
    m.ok("create_queue", queue="q", config={})
    m.ok("add_group", queue="q", group="g2")
    m.put("q", msg())
    a = m.receive("q")[0]
    b = m.receive("q", group="g2")[0]
    assert a["receipt"] != b["receipt"]
    m.ok("nack", queue="q", receipts=[a["receipt"]])
    assert m.stats("q")["groups"]["g2"]["in_flight"] == 1
    assert m.ack("q", b["receipt"])["acked"] == 1


def test_deleting_a_group_removes_messages_only_it_still_needed(m):
    m.ok("create_queue", queue="q", config={})
    m.ok("add_group", queue="q", group="g2")
    m.put("q", msg(), msg())
    m.ack("q", m.receive("q", 1)[0]["receipt"])
    assert m.ok("delete_group", queue="q", group="g2") == {"deleted": True}
    assert m.stored("q") == [2]
    assert m.sm.group_info("q", "g2")["error"] == "not_found"


def test_deleting_a_group_does_not_count_as_receiving_its_messages(m):
    m.ok("create_queue", queue="q", config={})
    m.ok("add_group", queue="q", group="g2")
    m.put("q", msg("v1", key="k"))
    m.ok("delete_group", queue="q", group="g2")
    assert m.put_result("q", msg("v2", key="k"))[0]["replaced_seq"] == 1


def test_the_last_group_cannot_be_deleted(m):
    m.put("q", msg())
    m.fails("conflict", "delete_group", queue="q", group="default")
    m.fails("not_found", "delete_group", queue="q", group="nope")
    assert m.stored("q") == [1]


def test_group_stats(m):
    m.put("q", msg(), msg(), msg(delay_ms=10))
    m.receive("q", 1)
    assert m.sm.list_groups("q") == {"groups": [{"name": "default", "depth": 1, "in_flight": 1, "cursor": 1,
                                                 **NOT_PAUSED}]}
    stats = m.stats("q")
    assert (stats["depth"], stats["in_flight"], stats["delayed"], stats["first_seq"], stats["last_seq"]) == (
        3, 1, 1, 1, 3)


def test_first_seq_follows_removals_in_any_order_and_a_restore(m):
    m.put("q", *[msg(str(i)) for i in range(5)])
    receipts = [r["receipt"] for r in m.receive("q")]
    m.ack("q", receipts[1], receipts[2])
    assert m.stats("q")["first_seq"] == 1
    m.ack("q", receipts[0])
    assert m.stats("q")["first_seq"] == 4
    data = m.sm.snapshot()
    m.sm = StateMachine()
    m.sm.restore(data)
    assert m.stats("q")["first_seq"] == 4
    m.ok("patch_queue", queue="q", config={"overflow": "drop_oldest", "max_length": 2})
    m.put("q", msg("5"), msg("6"))
    assert (m.stats("q")["first_seq"], m.stored("q")) == (6, [6, 7])
    m.ack("q", *[r["receipt"] for r in m.receive("q")])
    assert (m.stats("q")["first_seq"], m.stats("q")["last_seq"]) == (None, 7)


# ---- browse and commit -------------------------------------------------------------------

def test_browse_shows_unacked_messages_from_a_seq_without_leasing(m):
    m.put("q", msg("a"), msg("b"), msg("c"), msg("d"))
    m.ack("q", m.receive("q", 1)[0]["receipt"])
    m.receive("q", 1)
    page = m.sm.browse("q", "default", 2, 2)
    assert [(r["seq"], r["body"], r["deliveries"]) for r in page["messages"]] == [(2, "b", 1), (3, "c", 0)]
    assert page["last_seq"] == 4
    assert m.seqs("q") == [3, 4]


def test_commit_acks_everything_up_to_the_mark(m):
    m.put("q", msg(), msg(), msg())
    stale = m.receive("q", 1)[0]["receipt"]
    assert m.ok("commit", queue="q", group="default", seq=2) == {"acked": 2, "cursor": 3}
    assert m.stored("q") == [3]
    assert m.stats("q")["acked_total"] == 2
    m.fails("stale_receipt", "ack", queue="q", receipts=[stale])


def test_commit_is_idempotent_and_a_lower_mark_changes_nothing(m):
    m.put("q", msg(), msg(), msg())
    m.ok("commit", queue="q", group="default", seq=2)
    before = m.sm.snapshot()
    assert m.ok("commit", queue="q", group="default", seq=2) == {"acked": 0, "cursor": 3}
    assert m.ok("commit", queue="q", group="default", seq=1) == {"acked": 0, "cursor": 3}
    assert m.sm.snapshot() == before


def test_commit_in_one_group_leaves_the_others_alone(m):
    m.ok("create_queue", queue="q", config={})
    m.ok("add_group", queue="q", group="g2")
    m.put("q", msg(), msg())
    m.ok("commit", queue="q", group="g2", seq=2)
    assert m.stored("q") == [1, 2]
    assert m.stored("q", "g2") == []
    assert m.sm.group_info("q", "g2")["cursor"] == 3
    assert m.seqs("q") == [1, 2]


def test_commit_to_a_missing_group_is_not_found(m):
    m.put("q", msg())
    m.fails("not_found", "commit", queue="q", group="nope", seq=1)


# ---- transactions -----------------------------------------------------------------------

def test_transaction_acks_and_puts_across_queues(m):
    m.put("in", msg("job"))
    r = m.receive("in")[0]["receipt"]
    result = m.ok("tx", ack=[{"queue": "in", "receipts": [r]}],
                  put=[{"queue": "out", "messages": [msg("r1")]}, {"queue": "audit", "messages": [msg("a")]},
                       {"queue": "out", "messages": [msg("r2")]}])
    assert result == {"acked": 1, "put": [
        {"queue": "out", "messages": [{"seq": 1, "duplicate": False, "replaced_seq": None},
                                      {"seq": 2, "duplicate": False, "replaced_seq": None}]},
        {"queue": "audit", "messages": [{"seq": 1, "duplicate": False, "replaced_seq": None}]}]}
    assert m.stats("in")["depth"] == 0
    assert [x["body"] for x in m.receive("out")] == ["r1", "r2"]


def test_transaction_with_one_stale_receipt_changes_nothing(m):
    m.put("in", msg(), msg())
    live, dead = (x["receipt"] for x in m.receive("in"))
    m.ack("in", dead)
    before = m.sm.snapshot()
    result = m.fails("stale_receipt", "tx", ack=[{"queue": "in", "receipts": [live, dead]}],
                     put=[{"queue": "out", "messages": [msg()]}])
    assert result["stale"] == [dead]
    assert m.sm.snapshot() == before


def test_transaction_into_a_full_queue_changes_nothing(m):
    m.ok("create_queue", queue="out", config={"max_length": 1})
    m.put("out", msg())
    m.put("in", msg())
    r = m.receive("in")[0]["receipt"]
    before = m.sm.snapshot()
    m.fails("queue_full", "tx", ack=[{"queue": "in", "receipts": [r]}],
            put=[{"queue": "out", "messages": [msg()]}])
    assert m.sm.snapshot() == before


def test_transaction_without_auto_create_into_a_missing_queue_changes_nothing(m):
    m.put("in", msg())
    r = m.receive("in")[0]["receipt"]
    before = m.sm.snapshot()
    m.fails("not_found", "tx", ack=[{"queue": "in", "receipts": [r]}],
            put=[{"queue": "nope", "messages": [msg()]}], auto_create=False)
    assert m.sm.snapshot() == before


def test_transaction_fires_every_timer_before_it_checks_a_receipt(m):
    # Expiring "src"'s lease dead-letters its message into "in" (drop_oldest,
    # full), which drops the message the transaction acks: its lease ended
    # before the transaction, so the transaction is refused, not counted.
    m.ok("create_queue", queue="in", config={"max_length": 1, "overflow": "drop_oldest"})
    m.ok("create_queue", queue="src", config={"max_deliveries": 1, "dead_letter": "in"})
    m.put("in", msg("job"))
    r = m.receive("in")[0]["receipt"]
    m.put("src", msg("poison"))
    m.receive("src", lease_ms=100)
    m.now += 100
    m.fails("stale_receipt", "tx", ack=[{"queue": "in", "receipts": [r]}],
            put=[{"queue": "src", "messages": [msg()]}])
    assert (m.stats("in")["acked_total"], m.stats("in")["dropped_total"]) == (0, 1)
    assert [x["body"] for x in m.receive("in")] == ["poison"]


# ---- invalid commands ---------------------------------------------------------------------

INVALID = [
    {"op": "nope", "now_ms": T0},
    {"op": "tick"},
    {"op": "tick", "now_ms": -1},
    {"op": "tick", "now_ms": 1.5},
    {"op": "tick", "now_ms": True},
    "not a dict",
    {"op": "put", "now_ms": T0, "queue": "bad name", "messages": [msg()]},
    {"op": "put", "now_ms": T0, "queue": "q" * 129, "messages": [msg()]},
    {"op": "put", "now_ms": T0, "queue": "q", "messages": []},
    {"op": "put", "now_ms": T0, "queue": "q", "messages": [msg()] * 10_001},
    {"op": "put", "now_ms": T0, "queue": "q", "messages": [msg(), {"key": "k"}]},
    {"op": "put", "now_ms": T0, "queue": "q", "messages": [msg(extra=1)]},
    {"op": "put", "now_ms": T0, "queue": "q", "messages": [msg(key="")]},
    {"op": "put", "now_ms": T0, "queue": "q", "messages": [msg(headers={"a": 1})]},
    {"op": "put", "now_ms": T0, "queue": "q", "messages": [msg(ttl_ms=0)]},
    {"op": "put", "now_ms": T0, "queue": "q", "messages": [msg(delay_ms=-1)]},
    {"op": "put", "now_ms": T0, "queue": "q", "messages": [msg(body={1, 2})]},
    {"op": "receive", "now_ms": T0, "queue": "q", "group": "default", "max": 0},
    {"op": "receive", "now_ms": T0, "queue": "q", "group": "default", "max": 1_001},
    {"op": "receive", "now_ms": T0, "queue": "q", "group": "a:b", "max": 1},
    {"op": "receive", "now_ms": T0, "queue": "q", "group": "default", "max": 1, "lease_ms": 0},
    {"op": "ack", "now_ms": T0, "queue": "q", "receipts": []},
    {"op": "ack", "now_ms": T0, "queue": "q", "receipts": [7]},
    {"op": "nack", "now_ms": T0, "queue": "q", "receipts": ["r"], "delay_ms": "soon"},
    {"op": "extend", "now_ms": T0, "queue": "q", "receipts": ["r"], "lease_ms": 0},
    {"op": "create_queue", "now_ms": T0, "queue": "q", "config": {"colour": "red"}},
    {"op": "create_queue", "now_ms": T0, "queue": "q", "config": {"overflow": "block"}},
    {"op": "create_queue", "now_ms": T0, "queue": "q", "config": {"max_length": 0}},
    {"op": "patch_queue", "now_ms": T0, "queue": "q", "config": {"lease_ms": None}},
    {"op": "patch_queue", "now_ms": T0, "queue": "q", "config": {"dead_letter": "bad name"}},
    {"op": "add_group", "now_ms": T0, "queue": "q", "group": "g", "start": "middle"},
    {"op": "commit", "now_ms": T0, "queue": "q", "group": "default", "seq": -1},
    {"op": "tx", "now_ms": T0},
    {"op": "tx", "now_ms": T0, "ack": [{"queue": "q", "receipts": []}]},
    {"op": "tx", "now_ms": T0, "put": [{"queue": "q", "messages": [{"nobody": 1}]}]},
    {"op": "redrive", "now_ms": T0, "queue": "bad name"},
    {"op": "redrive", "now_ms": T0, "queue": "q", "from_queue": "a/b"},
    {"op": "redrive", "now_ms": T0, "queue": "q", "max": 0},
    {"op": "redrive", "now_ms": T0, "queue": "q", "max": 10_001},
    {"op": "redrive", "now_ms": T0, "queue": "q", "id": ""},
    {"op": ["put"], "now_ms": T0, "queue": "q", "messages": [msg()]},
    {"op": "list_queues", "now_ms": T0},
    {"op": "_check_dead_letter", "now_ms": T0, "queue": "q"},
]


@pytest.mark.parametrize("cmd", INVALID, ids=range(len(INVALID)))
def test_invalid_commands_are_refused_whole(m, cmd):
    m.ok("create_queue", queue="q", config={"lease_ms": 1_000})
    m.put("q", msg())
    m.receive("q", lease_ms=1_000)
    before = m.sm.snapshot()
    result = m.sm.apply(cmd)
    assert is_error(result) and result["error"] == "bad_request", result
    assert m.sm.snapshot() == before


# ---- the op table ---------------------------------------------------------------------------

def test_every_command_of_the_table_has_a_validator_and_no_read_has_one():
    assert {name for name, op in OPS.items() if not op.read} == {
        "create_queue", "patch_queue", "delete_queue", "put", "receive", "ack", "nack", "extend", "tx",
        "redrive", "add_group", "delete_group", "commit", "stage", "stage_commit", "stage_abort",
        "drop_producer", "tick", "set_member", "remove_member", "checkpoint", "assign", "record_members",
        "replica_move", "replica_moved", "node_leaving", "release_names", "retire_names", "names_released",
        "sqs_key_add", "sqs_key_remove", "relocate", "seek_group", "patch_group", "principal_add",
        "principal_update", "principal_remove"}
    assert all(op.check is not None for op in OPS.values() if not op.read)
    assert all(op.check is None for op in OPS.values() if op.read)


def test_check_command_runs_the_validator_the_table_names(m):
    assert check_command({"op": "nack", "now_ms": 0, "queue": "q", "receipts": ["r"], "delay_ms": 5}) is None
    assert check_command({"op": "nack", "now_ms": 0, "queue": "q", "receipts": ["r"], "delay_ms": -5}) == {
        "error": "bad_request", "message": "delay_ms must be an integer number of milliseconds >= 0"}
    # extend's duration is lease_ms; a nack's delay_ms means nothing to it
    assert check_command({"op": "extend", "now_ms": 0, "queue": "q", "receipts": ["r"], "delay_ms": -5}) is None


def test_read_answers_each_read_of_the_table_as_its_method_does(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 1_000})
    m.put("q", msg("a"), msg("b"))
    m.receive("q", n=1)
    m.ok("stage", producer="p", token="t", chunk=0, queue="q", messages=[msg("s")])
    args = {"list_queues": (), "queue_info": ("q",), "all_queue_stats": (),
            "list_groups": ("q",), "group_info": ("q", "default"), "browse": ("q", "default", 0, 10),
            "has_ready": ("q", "default"), "ready_count": ("q", "default"), "next_timer": (),
            "producer_info": ("p",), "list_producers": (), "staging_usage": (), "stored_usage": (),
            "catalog_lookup": (["q"],),
            "list_catalog": (), "catalog_usage": (), "group_members": (), "names_deleted": (10,),
            "names_retiring": (["q"],), "names_absent": (["q", "gone"],), "catalog_names_in": (0,),
            "wall_times": ([T0],), "list_principals": (), "principals_version": (), "principal_events": (10,)}
    assert set(args) == {name for name, op in OPS.items() if op.read}
    for name, call in args.items():
        assert m.sm.read(name, *call) == getattr(m.sm, name)(*call), name
    assert m.sm.read("ready_count", "q", "default") == 1
    assert m.sm.read("browse", "q", "default", 0, 10)["messages"][1]["body"] == "b"
    assert m.sm.read("queue_info", "nope")["error"] == "not_found"


@pytest.mark.parametrize("name", ["put", "tick", "nope", "_touch", "snapshot", "read", None])
def test_read_of_anything_but_a_read_is_a_value_error_and_changes_nothing(m, name):
    m.put("q", msg())
    before = m.sm.snapshot()
    with pytest.raises(ValueError):
        m.sm.read(name, {"op": "tick", "now_ms": T0 + 10_000_000})
    assert m.sm.snapshot() == before


# ---- log entries and snapshots ---------------------------------------------------------

def test_one_log_entry_carries_many_commands_and_answers_each(m):
    entry = encode_entry([
        {"op": "put", "now_ms": T0, "queue": "q", "messages": [msg("a"), msg("b")]},
        {"op": "receive", "now_ms": T0, "queue": "q", "group": "default", "max": 1},
        {"op": "receive", "now_ms": T0, "queue": "missing", "group": "default", "max": 1},
    ])
    assert len(decode_entry(entry)) == 3
    put, received, missing = m.sm.apply_entry(entry)
    assert [x["seq"] for x in put["messages"]] == [1, 2]
    assert [x["body"] for x in received["messages"]] == ["a"]
    assert missing["error"] == "not_found"


def test_a_corrupt_log_entry_is_refused(m):
    assert m.sm.apply_entry(b"\xff\x00garbage")[0]["error"] == "bad_request"
    assert m.sm.apply_entry(encode_entry({"op": "tick"}))[0]["error"] == "bad_request"


def test_a_restored_machine_carries_on_with_leases_deliveries_and_keys(m):
    m.put("q", msg("v1", key="k"), msg("other"))
    m.ok("nack", queue="q", receipts=[m.receive("q", 1)[0]["receipt"]])
    leased = m.receive("q", 1)[0]
    assert (leased["seq"], leased["deliveries"]) == (1, 2)
    m.put("q", msg("v2", key="k"))
    data = m.sm.snapshot()
    m.sm = StateMachine()
    m.sm.restore(data)
    assert m.sm.snapshot() == data
    assert m.put_result("q", msg("v3", key="k"))[0]["replaced_seq"] == 3
    m.ok("nack", queue="q", receipts=[leased["receipt"]])
    assert [(r["seq"], r["deliveries"]) for r in m.receive("q")] == [(1, 3), (2, 1), (4, 1)]


def test_a_restored_machine_keeps_when_each_delayed_put_shows(m):
    m.put("q", msg("now"), msg("later", delay_ms=100), msg("keyed", key="k", delay_ms=50))
    m.now += 60
    state = cbor2.loads(m.sm.snapshot())
    [queue] = state["queues"]
    assert message_lists(queue[6])[4:6] == [[T0, T0, T0], [T0, T0 + 100, T0 + 50]]    # put_at, visible_at
    m.sm = StateMachine()
    m.sm.restore(cbor2.dumps(state))
    m.ok("add_group", queue="q", group="g2", start="earliest")
    assert m.seqs("q", group="g2") == [1, 3]
    m.put_result("q", msg("keyed again", key="k"))    # appends: g2 received seq 3
    m.now += 40
    assert m.seqs("q", group="g2") == [2, 4]
    assert m.seqs("q") == [1, 2, 3, 4]


def test_restore_refuses_a_snapshot_of_another_format(m):
    with pytest.raises(ValueError):
        m.sm.restore(encode_entry({"format": "something", "version": 1}))


def test_every_queues_figures_are_read_in_pages_by_name():
    machine = StateMachine()
    for name in ("c", "a", "b", "d"):
        machine.apply({"op": "create_queue", "queue": name, "config": {}, "now_ms": T0})
    first = machine.read("all_queue_stats", "", 3)
    rest = machine.read("all_queue_stats", first[-1][0], 3)
    assert [name for name, _ in first] == ["a", "b", "c"] and [name for name, _ in rest] == ["d"]
    assert rest[0][1] == machine.queue_info("d")["stats"]


# ---- tags and SQS attributes: string maps a queue keeps for its owner -----------------

def test_tags_and_sqs_attributes_are_kept_and_a_patch_replaces_each_map_whole(m):
    m.ok("create_queue", queue="q", config={"tags": {"team": "a", "env": "dev"},
                                            "sqs_attributes": {"DelaySeconds": "5"}})
    config = m.ok("patch_queue", queue="q", config={"tags": {"team": "b"}})["config"]
    assert config["tags"] == {"team": "b"}
    assert config["sqs_attributes"] == {"DelaySeconds": "5"}
    assert m.sm.queue_info("q")["config"]["tags"] == {"team": "b"}


@pytest.mark.parametrize("field, value", [
    ("tags", {"k": 1}), ("tags", ["k"]), ("tags", {"": "v"}), ("tags", {"k" * 129: "v"}),
    ("tags", {"k": "v" * 257}), ("tags", {f"k{i}": "v" for i in range(51)}),
    ("sqs_attributes", {"DelaySeconds": 5}), ("sqs_attributes", {"Policy": "p" * 32_769}),
])
def test_malformed_tags_or_sqs_attributes_are_refused_and_change_nothing(m, field, value):
    m.fails("bad_request", "create_queue", queue="q", config={field: value})
    assert "q" not in m.sm.queues


def test_a_queue_from_a_snapshot_before_tags_equals_one_created_with_the_same_settings(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 5_000})
    state = cbor2.loads(m.sm.snapshot())
    for queue in state["queues"]:
        del queue[1]["tags"], queue[1]["sqs_attributes"]
    m.sm.restore(cbor2.dumps(state))
    assert m.ok("create_queue", queue="q", config={"lease_ms": 5_000})["created"] is False


# ---- the time of a message's first delivery (SQS's ApproximateFirstReceiveTimestamp) -----------

def test_a_redelivery_keeps_the_time_of_the_first_delivery_also_through_a_snapshot(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 1_000})
    m.put("q", msg())
    first = m.receive("q")[0]
    assert first["first_received_at_ms"] == T0
    m.tick(T0 + 5_000)
    restored = StateMachine()
    restored.restore(m.sm.snapshot())
    m.sm = restored
    again = m.receive("q")[0]
    assert (again["deliveries"], again["first_received_at_ms"]) == (2, T0)


def test_a_version_6_snapshot_restores_with_no_first_delivery_times(m):
    m.put("q", msg(), msg())
    m.receive("q", n=1)
    state = downgraded(m.sm.snapshot(), 6)
    for queue in state["queues"]:
        for group in queue[8]:
            del group[6]
    restored = StateMachine()
    restored.restore(cbor2.dumps(state))
    m.sm = restored
    m.tick(T0 + 60_000)
    assert [(r["deliveries"], r["first_received_at_ms"]) for r in m.receive("q")] == [(2, None), (1, T0 + 60_000)]


# ---- ordering keys: per key, nothing overtakes a message that is not ready ----------------

def test_a_later_message_of_an_ordering_key_waits_while_an_earlier_one_is_in_flight(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 1_000})
    m.put("q", msg("a1", ordering_key="a"), msg("a2", ordering_key="a"), msg("b1", ordering_key="b"),
          msg("plain"))
    first = m.receive("q", n=1)
    assert [(r["body"], r["ordering_key"]) for r in first] == [("a1", "a")]
    # a2 waits for a1; other keys and messages without a key go on
    assert [r["body"] for r in m.receive("q")] == ["b1", "plain"]
    assert m.receive("q") == []
    m.ack("q", first[0]["receipt"])
    assert [r["body"] for r in m.receive("q")] == ["a2"]


def test_one_receive_hands_out_several_messages_of_a_key_in_order(m):
    m.put("q", msg("a1", ordering_key="a"), msg("a2", ordering_key="a"))
    assert [r["body"] for r in m.receive("q")] == ["a1", "a2"]


def test_an_expired_or_nacked_message_goes_out_again_before_the_later_ones_of_its_key(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 1_000})
    m.put("q", msg("a1", ordering_key="a"), msg("a2", ordering_key="a"))
    m.receive("q", n=1)
    m.tick(T0 + 2_000)
    again = m.receive("q", n=1)
    assert [(r["body"], r["deliveries"]) for r in again] == [("a1", 2)]
    m.ok("nack", queue="q", receipts=[again[0]["receipt"]], delay_ms=5_000)
    assert m.receive("q") == []      # a1 is delayed: a2 still waits
    m.tick(T0 + 8_000)
    assert [r["body"] for r in m.receive("q")] == ["a1", "a2"]


def test_ordering_keys_survive_a_snapshot_and_a_dead_letter_move(m):
    m.ok("create_queue", queue="q", config={"lease_ms": 1_000, "max_deliveries": 1, "dead_letter": "dl"})
    m.put("q", msg("a1", ordering_key="a"))
    m.receive("q")
    m.tick(T0 + 2_000)
    restored = StateMachine()
    restored.restore(m.sm.snapshot())
    m.sm = restored
    assert [(r["body"], r["ordering_key"]) for r in m.receive("dl")] == [("a1", "a")]


def test_a_malformed_ordering_key_is_refused(m):
    for bad in ("", 7, "k" * 129):
        m.fails("bad_request", "put", queue="q", messages=[msg(ordering_key=bad)])


@pytest.mark.parametrize("waiting, other_handed_out", [(9_999, True), (10_000, False)])
def test_a_receive_steps_over_at_most_10_000_waiting_messages(m, waiting, other_handed_out):
    from raftq.statemachine.queue import MAX_STEPPED_OVER
    assert MAX_STEPPED_OVER == 10_000
    m.put("q", *[msg("hot", ordering_key="hot") for _ in range(waiting + 1 - 5_000)])
    m.put("q", *[msg("hot", ordering_key="hot") for _ in range(5_000)], msg("other", ordering_key="b"))
    first = m.receive("q", n=1)
    got = m.receive("q")
    assert [r["body"] for r in got] == (["other"] if other_handed_out else [])
    m.ack("q", first[0]["receipt"])
    assert [r["body"] for r in m.receive("q", n=1)] == ["hot"]


def test_a_message_whose_ordering_key_waits_is_not_ready_for_a_long_poll(m):
    m.put("q", msg("a1", ordering_key="a"), msg("a2", ordering_key="a"))
    assert m.sm.ready_count("q", "default") == 2
    first = m.receive("q", n=1)
    assert (m.sm.has_ready("q", "default"), m.sm.ready_count("q", "default")) == (False, 0)
    m.put("q", msg("b1", ordering_key="b"), msg("plain"))
    assert m.sm.ready_count("q", "default") == 2
    m.ack("q", first[0]["receipt"])
    assert m.sm.ready_count("q", "default") == 3

"""Staged writes (statemachine/staging.py), one rule per test, in the style of
test_statemachine_rules.py: only `apply` and the read-only queries, explicit log times."""

import cbor2
import pytest

from raftq.statemachine import StateMachine
from tests.test_statemachine_rules import T0, Machine, msg
from tests.older_snapshots import downgraded


@pytest.fixture
def m():
    return Machine()


def stage(m, token, chunk, *bodies, producer="p", queue="q", **fields):
    return m.ok("stage", producer=producer, token=token, chunk=chunk, queue=queue,
                messages=[msg(b) for b in bodies], **fields)


def commit(m, batch, *parts, producer="p", **fields):
    return m("stage_commit", producer=producer, batch=batch,
             parts=[{"token": t, "chunks": n} for t, n in parts], **fields)


def bodies(m, queue="q"):
    return [x["body"] for x in m.sm.browse(queue, "default", 0, 1000)["messages"]]


def test_staged_rows_are_invisible_until_the_commit(m):
    m.ok("create_queue", queue="q", config={})
    stage(m, "t1", 0, "a", "b")
    assert m.stats("q")["depth"] == 0 and bodies(m) == [] and m.receive("q") == []
    assert commit(m, 0, ("t1", 1)) == {"committed": True, "duplicate": False, "committed_batch": 0,
                                       "put": 2, "duplicate_ids": 0}
    assert bodies(m) == ["a", "b"]


def test_a_commit_publishes_every_part_in_part_then_chunk_order(m):
    stage(m, "t2", 1, "b2")
    stage(m, "t1", 0, "a1")
    stage(m, "t2", 0, "b1")
    commit(m, 7, ("t2", 2), ("t1", 1))
    assert bodies(m) == ["b1", "b2", "a1"]
    assert m.sm.producer_info("p") == {"producer": "p", "committed_batch": 7, "expires_at": None,
                                         "staged_bytes": 0, "stages": []}


def test_a_repeated_chunk_replaces_the_first_so_a_retried_request_stores_once(m):
    stage(m, "t1", 0, "a", "b")
    assert stage(m, "t1", 0, "a", "b") == {"staged": 2, "chunks": 1}
    commit(m, 0, ("t1", 1))
    assert bodies(m) == ["a", "b"]


def test_a_batch_at_or_below_the_high_water_mark_is_a_no_op_however_late(m):
    stage(m, "t1", 0, "a")
    commit(m, 3, ("t1", 1))
    m.now += 30 * 24 * 3_600_000           # a month: far past any dedup window
    stage(m, "t9", 0, "a")
    for batch in (3, 2):
        assert commit(m, batch, ("t9", 1)) == {"committed": False, "duplicate": True, "committed_batch": 3,
                                               "put": 0}
    assert bodies(m) == ["a"]
    assert m.sm.producer_info("p")["stages"] == []    # the replay's stage is dropped


def test_the_high_water_mark_is_per_producer(m):
    stage(m, "t1", 0, "a", producer="p1")
    stage(m, "t2", 0, "b", producer="p2")
    commit(m, 5, ("t1", 1), producer="p1")
    assert commit(m, 0, ("t2", 1), producer="p2")["committed"] is True
    assert bodies(m) == ["a", "b"]


def test_a_missing_stage_or_chunk_refuses_the_whole_commit_and_changes_nothing(m):
    stage(m, "t1", 0, "a")
    stage(m, "t2", 0, "b")
    stage(m, "t2", 2, "d")
    before = m.sm.snapshot()
    m.fails("conflict", "stage_commit", producer="p", batch=0, parts=[{"token": "t1", "chunks": 1},
                                                                       {"token": "nope", "chunks": 1}])
    m.fails("conflict", "stage_commit", producer="p", batch=0, parts=[{"token": "t2", "chunks": 3}])
    m.fails("conflict", "stage_commit", producer="p", batch=0, parts=[{"token": "t1", "chunks": 2}])
    assert m.sm.snapshot() == before


def test_another_producers_stage_cannot_be_committed_or_aborted(m):
    stage(m, "t1", 0, "a", producer="p1")
    m.fails("conflict", "stage_commit", producer="p2", batch=0, parts=[{"token": "t1", "chunks": 1}])
    assert m.ok("stage_abort", producer="p2", tokens=["t1"]) == {"dropped": 0}
    m.fails("conflict", "stage", producer="p2", token="t1", chunk=1, queue="q", messages=[msg()])
    m.fails("conflict", "stage", producer="p1", token="t1", chunk=1, queue="other", messages=[msg()])


def test_abort_drops_the_named_stages(m):
    stage(m, "t1", 0, "a")
    stage(m, "t2", 0, "b")
    assert m.ok("stage_abort", producer="p", tokens=["t1", "t1", "unknown"]) == {"dropped": 1}
    assert [s["token"] for s in m.sm.producer_info("p")["stages"]] == ["t2"]
    m.fails("conflict", "stage_commit", producer="p", batch=0, parts=[{"token": "t1", "chunks": 1}])


def test_an_orphaned_stage_expires_after_its_ttl_of_log_time(m):
    stage(m, "t1", 0, "a", ttl_ms=5_000)
    assert m.sm.next_timer() == T0 + 5_000
    stage(m, "t1", 1, "b", ttl_ms=5_000, now=T0 + 1_000)     # each chunk renews it
    assert m.sm.next_timer() == T0 + 6_000
    m.tick(T0 + 5_999)
    assert m.sm.producer_info("p")["stages"][0]["messages"] == 2
    m.tick(T0 + 6_000)
    assert m.sm.producer_info("p")["stages"] == [] and m.sm.next_timer() is None
    m.fails("conflict", "stage_commit", producer="p", batch=0, parts=[{"token": "t1", "chunks": 2}])


def test_a_one_off_producer_is_forgotten_retain_ms_after_its_commit(m):
    stage(m, "t1", 0, "a")
    commit(m, 0, ("t1", 1), retain_ms=10_000)
    assert m.sm.producer_info("p")["expires_at"] == T0 + 10_000
    assert commit(m, 0)["duplicate"] is True          # a retried commit within the retention
    m.tick(T0 + 10_000)
    assert m.sm.producer_info("p")["committed_batch"] is None


def test_a_full_queue_refuses_the_whole_commit_and_keeps_the_stages(m):
    m.ok("create_queue", queue="q", config={"max_length": 2})
    stage(m, "t1", 0, "a", "b", "c")
    m.fails("queue_full", "stage_commit", producer="p", batch=0, parts=[{"token": "t1", "chunks": 1}])
    assert m.sm.producer_info("p")["committed_batch"] is None
    assert m.sm.producer_info("p")["stages"][0]["messages"] == 3
    m.ok("patch_queue", queue="q", config={"max_length": 10})
    assert commit(m, 0, ("t1", 1))["put"] == 3


def test_without_auto_create_a_missing_queue_is_refused_at_stage_and_at_commit(m):
    m.fails("not_found", "stage", producer="p", token="t1", chunk=0, queue="q", messages=[msg()],
            auto_create=False)
    stage(m, "t1", 0, "a")
    m.fails("not_found", "stage_commit", producer="p", batch=0, parts=[{"token": "t1", "chunks": 1}],
            auto_create=False)
    assert commit(m, 0, ("t1", 1), auto_create=True)["put"] == 1
    assert m.sm.queue_info("q")["config"]["max_length"] is None


def test_message_ids_in_a_stage_still_deduplicate_within_the_window(m):
    m.put("q", msg("first", id="i1"))
    stage(m, "t1", 0, "x")
    m.ok("stage", producer="p", token="t1", chunk=1, queue="q", messages=[msg("again", id="i1"), msg("new")])
    result = commit(m, 0, ("t1", 2))
    assert (result["put"], result["duplicate_ids"]) == (2, 1)
    assert bodies(m) == ["first", "x", "new"]


def test_keys_ttls_and_delays_of_staged_messages_apply_from_the_commit(m):
    m.ok("stage", producer="p", token="t1", chunk=0, queue="q",
         messages=[msg("old", key="k"), msg("new", key="k"), msg("soon", ttl_ms=1_000), msg("late", delay_ms=500)])
    commit(m, 0, ("t1", 1), now=T0 + 60_000)
    assert bodies(m) == ["new", "soon", "late"]
    assert [x["body"] for x in m.receive("q", now=T0 + 60_000)] == ["new", "soon"]
    m.tick(T0 + 61_000)
    assert bodies(m) == ["new", "late"]


def test_drop_producer_forgets_its_mark_and_stages(m):
    stage(m, "t1", 0, "a")
    commit(m, 4, ("t1", 1))
    stage(m, "t2", 0, "b")
    assert m.ok("drop_producer", producer="p") == {"deleted": True, "stages_dropped": 1}
    m.fails("not_found", "drop_producer", producer="p")
    stage(m, "t3", 0, "c")
    assert commit(m, 0, ("t3", 1))["committed"] is True     # a new query under the old id starts over


@pytest.mark.parametrize("op, fields", [
    ("stage", {"producer": "p q", "token": "t", "chunk": 0, "queue": "q", "messages": [{"body": 1}]}),
    ("stage", {"producer": "p", "token": "", "chunk": 0, "queue": "q", "messages": [{"body": 1}]}),
    ("stage", {"producer": "p", "token": "t" * 65, "chunk": 0, "queue": "q", "messages": [{"body": 1}]}),
    ("stage", {"producer": "p", "token": "t", "chunk": -1, "queue": "q", "messages": [{"body": 1}]}),
    ("stage", {"producer": "p", "token": "t", "chunk": 0, "queue": "q", "messages": []}),
    ("stage", {"producer": "p", "token": "t", "chunk": 0, "queue": "q", "messages": [{"body": 1}], "ttl_ms": 0}),
    ("stage_commit", {"producer": "p", "batch": -1, "parts": []}),
    ("stage_commit", {"producer": "p", "batch": True, "parts": []}),
    ("stage_commit", {"producer": "p", "batch": 0, "parts": [{"token": "t", "chunks": 1}] * 2}),
    ("stage_commit", {"producer": "p", "batch": 0, "parts": [{"token": "t"}]}),
    ("stage_commit", {"producer": "p", "batch": 0, "parts": "t"}),
    ("stage_commit", {"producer": "p", "batch": 0, "parts": [], "retain_ms": 0}),
    ("stage_abort", {"producer": "p", "tokens": "t"}),
    ("drop_producer", {"producer": ""}),
])
def test_malformed_staging_commands_are_refused_whole(m, op, fields):
    stage(m, "t", 0, "a")
    before = m.sm.snapshot()
    m.fails("bad_request", op, **fields)
    assert m.sm.snapshot() == before


def test_stages_and_marks_survive_snapshot_and_restore(m):
    stage(m, "t1", 0, "a", ttl_ms=5_000)
    stage(m, "t2", 0, "b", producer="p2")
    commit(m, 2, ("t2", 1), producer="p2", retain_ms=9_000)
    restored = StateMachine()
    restored.restore(m.sm.snapshot())
    assert restored.snapshot() == m.sm.snapshot()
    assert restored.producer_info("p") == m.sm.producer_info("p")
    assert restored.next_timer() == m.sm.next_timer() == T0 + 5_000
    m.sm = restored
    assert commit(m, 0, ("t1", 1))["put"] == 1


def test_a_version_5_snapshot_restores_with_no_staging(m):
    m.put("q", msg("a"))
    state = downgraded(m.sm.snapshot(), 5)
    del state["staging"]
    restored = StateMachine()
    restored.restore(cbor2.dumps(state))
    assert restored.producer_info("p")["stages"] == [] and restored.queue_info("q")["stats"]["depth"] == 1


def test_list_producers_shows_marks_and_pending_stages(m):
    stage(m, "t1", 0, "a", "b", producer="p1")
    stage(m, "t2", 0, "c", producer="p2")
    commit(m, 1, ("t2", 1), producer="p2")
    stage(m, "t3", 0, "d", producer="p2")
    assert m.sm.list_producers() == {"producers": [
        {"producer": "p2", "committed_batch": 1, "stages": 1, "staged_bytes": 101, "staged_messages": 1},
        {"producer": "p1", "committed_batch": None, "stages": 1, "staged_bytes": 202, "staged_messages": 2}]}


# ---- bounds (issue 21) ---------------------------------------------------------------------------
MB = "x" * 1_000_000


def test_a_stage_past_a_producer_or_cluster_cap_is_refused_whole_and_changes_nothing(m):
    caps = {"producer_bytes": 2_500_000, "bytes": 4_000_000, "producer_stages": 3, "stages": 5}
    stage(m, "t1", 0, MB, MB, caps=caps)
    before = m.sm.snapshot()
    refused = m.fails("limit_reached", "stage", producer="p", token="t2", chunk=0, queue="q",
                      messages=[msg(MB)], caps=caps)
    assert "--max-staged-bytes-per-producer" in refused["message"] and "producer 'p'" in refused["message"]
    assert m.sm.snapshot() == before and m.sm.staging_usage()["bytes"] == 2_000_200
    # a repeated chunk counts only what it adds: the same rows again fit
    stage(m, "t1", 0, MB, MB, caps=caps)
    stage(m, "t3", 0, MB, producer="p2", caps=caps)
    refused = m.fails("limit_reached", "stage", producer="p3", token="t4", chunk=0, queue="q",
                      messages=[msg(MB)], caps=caps)
    assert "--max-staged-bytes)" in refused["message"] and "the cluster" in refused["message"]
    for token in ("a", "b"):
        stage(m, token, 0, "small", producer="p2", caps=caps)
    refused = m.fails("limit_reached", "stage", producer="p2", token="c", chunk=0, queue="q",
                      messages=[msg("small")], caps=caps)
    assert "--max-stages-per-producer" in refused["message"]
    stage(m, "d", 0, "small", producer="p4", caps=caps)
    refused = m.fails("limit_reached", "stage", producer="p5", token="e", chunk=0, queue="q",
                      messages=[msg("small")], caps=caps)
    assert "--max-stages)" in refused["message"]


def test_empty_bodies_are_not_free_every_staged_message_counts_its_overhead(m):
    stage(m, "t1", 0, "", "")
    assert m.sm.staging_usage()["bytes"] == 200
    m.fails("limit_reached", "stage", producer="p", token="t1", chunk=1, queue="q",
            messages=[msg("")] * 10_000, caps={"producer_bytes": 500_000})


def test_an_abort_a_commit_an_expiry_and_a_drop_give_back_every_staged_byte(m):
    stage(m, "t1", 0, MB, MB)
    stage(m, "t1", 1, MB)
    stage(m, "t2", 0, MB, ttl_ms=1_000)
    stage(m, "t3", 0, "c")
    stage(m, "t4", 0, "d", producer="p2")
    assert m.sm.staging_usage() == {"stages": 4, "bytes": 4_000_000 + 4 * 100 + 2 * 101, "producers": 2,
                                    "marks": 0}
    assert m.ok("stage_abort", producer="p", tokens=["t1"]) == {"dropped": 1}
    m.tick(T0 + 1_000)                                      # t2 expires
    commit(m, 0, ("t3", 1))
    assert m.ok("drop_producer", producer="p2")["stages_dropped"] == 1
    assert m.sm.staging_usage() == {"stages": 0, "bytes": 0, "producers": 0, "marks": 1}
    assert m.sm.producer_info("p")["staged_bytes"] == 0
    # everything given back: the cap holds as much again
    stage(m, "t5", 0, MB, MB, MB, MB, caps={"producer_bytes": 4_000_400, "bytes": 4_000_400})


def test_staged_bytes_are_rebuilt_from_a_snapshot(m):
    stage(m, "t1", 0, MB, "b")
    restored = StateMachine()
    restored.restore(m.sm.snapshot())
    assert restored.staging_usage() == m.sm.staging_usage()
    assert restored.producer_info("p") == m.sm.producer_info("p")


def test_a_commit_without_parts_does_not_move_the_mark(m):
    stage(m, "t1", 0, "a")
    commit(m, 1, ("t1", 1))
    assert commit(m, 5) == {"committed": False, "duplicate": False, "committed_batch": 1, "put": 0,
                            "duplicate_ids": 0}
    stage(m, "t2", 0, "b")
    assert commit(m, 2, ("t2", 1))["committed"] is True
    assert bodies(m) == ["a", "b"]
    assert commit(m, 7, producer="fresh")["committed_batch"] is None
    assert m.sm.producer_info("fresh")["committed_batch"] is None


def test_a_batch_far_past_the_mark_is_refused_and_the_real_next_batch_is_stored(m):
    stage(m, "t1", 0, "a")
    commit(m, 1, ("t1", 1))
    stage(m, "evil", 0, "x")
    for batch in ((1 << 63) - 1, 1 + 1_000_001):
        m.fails("conflict", "stage_commit", producer="p", batch=batch, parts=[{"token": "evil", "chunks": 1}])
    m.fails("conflict", "stage_commit", producer="new", batch=1_000_000, parts=[])
    assert m.sm.producer_info("p")["committed_batch"] == 1
    stage(m, "t2", 0, "b")
    assert commit(m, 2, ("t2", 1))["put"] == 1
    assert commit(m, 2 + 1_000_000, ("evil", 1))["committed"] is True     # the step itself is allowed
    assert bodies(m) == ["a", "b", "x"]


def test_every_command_that_creates_queues_keeps_max_queues(m):
    m.ok("create_queue", queue="q1", config={})
    m.fails("limit_reached", "create_queue", queue="q2", config={}, max_queues=1)
    m.fails("limit_reached", "put", queue="q2", messages=[msg()], max_queues=1)
    m.put("q1", msg(), max_queues=1)                                   # an existing queue takes puts
    m.fails("limit_reached", "tx", put=[{"queue": "q1", "messages": [msg()]},
                                        {"queue": "q2", "messages": [msg()]}], max_queues=1)
    stage(m, "t1", 0, "a", queue="q2")
    stage(m, "t2", 0, "b", queue="q3")
    before = m.sm.snapshot()
    refused = m.fails("limit_reached", "stage_commit", producer="p", batch=0,
                      parts=[{"token": "t1", "chunks": 1}, {"token": "t2", "chunks": 1}], max_queues=2)
    assert "--max-queues" in refused["message"] and m.sm.snapshot() == before
    assert commit(m, 0, ("t1", 1), ("t2", 1), max_queues=3)["put"] == 2
    assert [q["name"] for q in m.sm.list_queues()["queues"]] == ["q1", "q2", "q3"]


def test_one_log_entry_creates_at_most_500_queues(m):
    from raftq.statemachine import encode_entry
    from raftq.statemachine.machine import MAX_NEW_QUEUES_PER_ENTRY
    assert MAX_NEW_QUEUES_PER_ENTRY == 500
    for n in range(501):
        stage(m, f"t{n}", 0, "a", queue=f"q{n}")
    parts = [{"token": f"t{n}", "chunks": 1} for n in range(501)]
    refused = m.fails("limit_reached", "stage_commit", producer="p", batch=0, parts=parts)
    assert "at most 500" in refused["message"] and m.sm.list_queues()["queues"] == []
    # commands packed into one entry share the entry's 500; the next entry has its own
    puts = [{"op": "put", "queue": f"n{n}", "messages": [msg()], "now_ms": T0} for n in range(501)]
    results = m.sm.apply_entry(encode_entry(puts))
    assert [r.get("error") for r in results] == [None] * 500 + ["limit_reached"]
    assert "error" not in m.sm.apply_entry(encode_entry(puts[500:]))[0]
    assert commit(m, 0, *[(f"t{n}", 1) for n in range(500)])["put"] == 500


def test_staged_messages_per_producer_are_capped_so_one_commit_stays_small(m):
    caps = {"producer_messages": 3}
    stage(m, "t1", 0, "a", "b", caps=caps)
    refused = m.fails("limit_reached", "stage", producer="p", token="t2", chunk=0, queue="q",
                      messages=[msg("c"), msg("d")], caps=caps)
    assert "--max-staged-messages-per-producer" in refused["message"]
    stage(m, "t1", 0, "a", "b", "c", caps=caps)          # a replaced chunk counts what it adds
    stage(m, "t2", 0, "e", producer="p2", caps=caps)
    commit(m, 0, ("t1", 1))
    stage(m, "t3", 0, "x", "y", "z", caps=caps)           # published rows no longer count


def test_the_producers_whose_mark_is_kept_are_capped(m):
    stage(m, "t1", 0, "a", producer="p1")
    stage(m, "t2", 0, "b", producer="p2")
    commit(m, 0, ("t1", 1), producer="p1", max_producers=1)
    refused = m.fails("limit_reached", "stage_commit", producer="p2", batch=0,
                      parts=[{"token": "t2", "chunks": 1}], max_producers=1)
    assert "--max-producers" in refused["message"]
    stage(m, "t3", 0, "c", producer="p1")
    assert commit(m, 1, ("t3", 1), producer="p1", max_producers=1)["committed"] is True   # an existing mark moves
    m.ok("drop_producer", producer="p1")
    assert commit(m, 0, ("t2", 1), producer="p2", max_producers=1)["committed"] is True

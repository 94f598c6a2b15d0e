"""Stored bodies as references into the log entries that carried them (statemachine/bodies.py).

A machine that applies each entry with its log index keeps references where
one applied without indexes keeps the bodies themselves.  The two must be
indistinguishable once a reference is read back from its entry: the same
results for every command, the same pages of every browse, and the same
state byte for byte once each reference is replaced by its body.
"""

import struct

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from raftq.statemachine import StateMachine, decode_entry, encode_entry
from raftq.statemachine.bodies import BodyRef, read_body
from tests.test_statemachine_model import START, every_page, random_log, resolved


def bodies_in_place(machine: StateMachine, log: list) -> StateMachine:
    """A copy of `machine` whose rows hold each referenced body itself, as a machine fed no indexes would."""
    copy = StateMachine(machine.group_id, machine.group_count)
    copy.restore(machine.snapshot())
    for queue in copy.queues.values():
        rows = queue.rows
        for row, index in enumerate(rows.ref_index):
            if index:
                seq = rows.base + row
                rows.bodies[seq] = read_body(rows.body(seq), log[index - 1])
                rows.ref_index[row] = rows.ref_offset[row] = rows.ref_length[row] = rows.ref_kind[row] = 0
    for stage in copy.staging.stages.values():
        for messages in stage["chunks"].values():
            # (a body first, as the commands of random_log hold it)
            messages[:] = [{"body": resolved(m["body"], log), **{k: v for k, v in m.items() if k != "body"}}
                           for m in messages]
    return copy


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_references_and_bodies_give_the_same_results_pages_and_state(seed):
    log = random_log(seed, 200)
    by_reference, by_value = StateMachine(), StateMachine()
    for index, entry in enumerate(log, start=1):
        for cmd, got, want in zip(decode_entry(entry), by_reference.apply_entry(entry, index),
                                  by_value.apply_entry(entry)):
            # (a relocation moves references alone: none where the bodies are kept as they are)
            assert cmd["op"] == "relocate" or resolved(got, log) == want
    assert resolved(every_page(by_reference), log) == every_page(by_value)
    assert bodies_in_place(by_reference, log).snapshot() == by_value.snapshot()
    assert any(queue.rows.ref_index.zeros() < len(queue.rows.ref_index)
               for queue in by_reference.queues.values()), "the log should have stored some references"
    assert not any(queue.rows.bodies for queue in by_reference.queues.values()), \
        "every stored body, a committed stage's too, is a reference"


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32), cut=st.integers(0, 200))
def test_a_snapshot_with_references_restores_and_continues_identically(seed, cut):
    log = random_log(seed, 200)
    original = StateMachine()
    for index, entry in enumerate(log[:cut], start=1):
        original.apply_entry(entry, index)
    restored = StateMachine()
    restored.restore(original.snapshot())
    assert restored.snapshot() == original.snapshot()
    for index, entry in enumerate(log[cut:], start=cut + 1):
        assert restored.apply_entry(entry, index) == original.apply_entry(entry, index)
    assert restored.state_digest() == original.state_digest()


def put_entry(messages: list, queue: str = "q") -> bytes:
    return encode_entry([{"op": "put", "queue": queue, "now_ms": START, "messages": messages}])


def test_each_kind_of_body_reads_back_from_its_reference_even_where_its_bytes_occur_earlier():
    # b"q" and "put" lie in the entry before any body (the queue's name, the op):
    # a reference to those bytes reads back the same body.
    bodies = [b"q", "put", {"n": [1, 2.5, None, True]}, b"", "", b"\x00" * 300, "snow \u2603", [], None, 7]
    entry = put_entry([{"body": body, "key": f"k{n}"} for n, body in enumerate(bodies)])
    machine = StateMachine()
    machine.apply_entry(entry, 5)
    [received] = machine.apply_entry(encode_entry([{"op": "receive", "queue": "q", "group": "default",
                                                    "max": 20, "now_ms": START}]), 6)
    refs = [m["body"] for m in received["messages"]]
    assert all(isinstance(ref, BodyRef) and ref.index == 5 for ref in refs)
    assert [read_body(ref, entry) for ref in refs] == bodies


def test_a_snapshot_holds_references_not_bodies():
    machine = StateMachine()
    for index in range(1, 11):
        machine.apply_entry(put_entry([{"body": bytes([index]) * 10_000} for _ in range(100)]), index)
    assert len(machine.queues["q"].rows) == 1_000
    assert len(machine.snapshot()) < 8_000, "10 MB of bodies, in a snapshot of references"
    assert not machine.queues["q"].rows.bodies, "no body is held beside its reference"


def test_a_dead_letter_moves_the_reference_and_counts_its_bytes():
    entries = [encode_entry([{"op": "create_queue", "queue": "dl", "now_ms": START},
                             {"op": "create_queue", "queue": "q", "now_ms": START,
                              "config": {"max_deliveries": 1, "dead_letter": "dl", "lease_ms": 10}}]),
               put_entry([{"body": "x" * 50}]),
               encode_entry([{"op": "receive", "queue": "q", "group": "default", "max": 1, "now_ms": START}]),
               encode_entry([{"op": "tick", "now_ms": START + 100}])]
    by_reference, by_value = StateMachine(), StateMachine()
    for index, entry in enumerate(entries, start=1):
        by_reference.apply_entry(entry, index)
        by_value.apply_entry(entry)
    [moved] = by_reference.browse("dl", "default", 0, 10)["messages"]
    assert moved["body"] == BodyRef(2, entries[1].index(b"x" * 50), 50, 1)
    assert by_reference.queue_info("dl") == by_value.queue_info("dl")


def test_a_body_not_found_in_its_entry_stays_in_the_heap():
    # A JSON body whose CBOR the entry does not hold as cbor2 writes it (1.5
    # as a half-precision float, where cbor2 writes a double) gets no reference.
    placeholder = b"a body to replace"
    entry = put_entry([{"body": placeholder}]).replace(cbor2.dumps(placeholder), b"\xf9" + struct.pack(">e", 1.5))
    assert cbor2.dumps(1.5) not in entry
    machine = StateMachine()
    [result] = machine.apply_entry(entry, 1)
    assert result["messages"][0]["duplicate"] is False
    assert machine.browse("q", "default", 0, 10)["messages"][0]["body"] == 1.5
    assert machine.queues["q"].rows.ref_index[0] == 0


def stage_entry(token: str, messages: list, chunk: int = 0) -> bytes:
    return encode_entry([{"op": "stage", "producer": "p", "token": token, "chunk": chunk, "queue": "q",
                          "messages": messages, "now_ms": START}])


def commit_entry(batch: int, tokens: list) -> bytes:
    return encode_entry([{"op": "stage_commit", "producer": "p", "batch": batch, "now_ms": START,
                          "parts": [{"token": token, "chunks": 1} for token in tokens]}])


def test_a_staged_body_is_a_reference_whose_entry_stays_live_until_its_stage_goes():
    """A stage's entry is live from the stage to its commit (then the rows' references name it),
    its abort, or its expiry; a snapshot taken meanwhile restores the references."""
    machine = StateMachine()
    entries = {1: stage_entry("a", [{"body": b"alpha" * 20, "key": "k"}, {"body": {"n": 1}}]),
               2: stage_entry("b", [{"body": "beta"}]),
               3: stage_entry("c", [{"body": b"gamma"}])}
    for index, entry in entries.items():
        machine.apply_entry(entry, index)
    assert machine.live_entry_indexes() == [1, 2, 3]
    restored = StateMachine()
    restored.restore(machine.snapshot())
    assert restored.snapshot() == machine.snapshot() and restored.live_entry_indexes() == [1, 2, 3]

    for copy in (machine, restored):
        copy.apply_entry(commit_entry(0, ["a"]), 4)
        copy.apply_entry(encode_entry([{"op": "stage_abort", "producer": "p", "tokens": ["b"], "now_ms": START}]), 5)
        copy.apply_entry(encode_entry([{"op": "tick", "now_ms": START + 3_600_001}]), 6)    # c expires
        assert copy.live_entry_indexes() == [1]
        assert not copy.queues["q"].rows.bodies, "committed bodies are references, not copies"
        page = copy.browse("q", "default", 0, 10)["messages"]
        assert [read_body(m["body"], entries[1]) for m in page] == [b"alpha" * 20, {"n": 1}]
    assert restored.snapshot() == machine.snapshot()


def test_a_staged_chunk_staged_again_no_longer_holds_the_first_entry_live():
    machine = StateMachine()
    machine.apply_entry(stage_entry("a", [{"body": b"first"}]), 1)
    machine.apply_entry(stage_entry("a", [{"body": b"again"}]), 2)
    assert machine.live_entry_indexes() == [2]


# ---- relocation: live bodies copied forward into a newer entry (engine/relocation.py) -------------

class Log:
    """A machine fed entries with their log indexes, and the entries, to read references back."""

    def __init__(self):
        self.machine = StateMachine()
        self.entries: dict[int, bytes] = {}

    def append(self, *commands) -> list:
        index = len(self.entries) + 1
        self.entries[index] = encode_entry([{"now_ms": START, **command} for command in commands])
        return self.machine.apply_entry(self.entries[index], index)

    def body(self, ref):
        return read_body(ref, self.entries[ref.index]) if isinstance(ref, BodyRef) else ref

    def stored(self, queue: str = "q", group: str = "default") -> list:
        return [(m["seq"], self.body(m["body"])) for m in self.machine.browse(queue, group, 0, 1_000)["messages"]]

    def move(self, holder, ref: BodyRef, *, raw: bytes | None = None) -> list:
        """A move of the queue message (name, seq) or staged message (token, chunk, position) at
        `holder` from `ref`, carrying the bytes `ref` names (as a leader reads them), or `raw`."""
        raw = self.entries[ref.index][ref.offset:ref.offset + ref.length] if raw is None else raw
        return [*holder, *ref, raw]

    def relocate(self, queues=(), stages=()) -> dict:
        [result] = self.append({"op": "relocate", "queues": [[name, moves] for name, moves in queues],
                                "stages": list(stages)})
        return result


def ref_of(log: Log, seq: int, queue: str = "q") -> BodyRef:
    return log.machine.queues[queue].rows.body(seq)


def test_a_relocation_points_each_message_at_its_bodys_copy_and_its_old_entry_stops_being_live():
    log = Log()
    bodies = [b"\x00raw" * 10, "text \u2603", {"n": [1, 2.5, None]}, ""]
    log.append({"op": "put", "queue": "q", "messages": [{"body": body} for body in bodies] + [{"body": "x" * 5_000}]})
    [received] = log.append({"op": "receive", "queue": "q", "group": "default", "max": 5})
    log.append({"op": "ack", "queue": "q", "receipts": [received["messages"][4]["receipt"]]})
    assert log.machine.live_entry_indexes() == [1]
    result = log.relocate(queues=[("q", [log.move([seq], ref_of(log, seq)) for seq in (1, 2, 3, 4)])])
    assert result == {"moved": 4, "stale": 0, "bytes": sum(ref_of(log, seq).length for seq in (1, 2, 3, 4))}
    assert [ref_of(log, seq).index for seq in (1, 2, 3, 4)] == [4, 4, 4, 4]
    assert log.machine.live_entry_indexes() == [4], "the entry of the put serves nothing any more"
    assert log.stored() == list(zip((1, 2, 3, 4), bodies))
    # what it counts toward max_bytes, and a snapshot's replica, are the same
    assert log.machine.queue_info("q")["stats"]["bytes"] == sum(ref_of(log, seq).length for seq in (1, 2, 3, 4))
    restored = StateMachine()
    restored.restore(log.machine.snapshot())
    assert restored.snapshot() == log.machine.snapshot() and restored.live_entry_indexes() == [4]


def test_a_relocation_moves_only_references_that_still_name_what_it_read():
    log = Log()
    log.append({"op": "create_queue", "queue": "dl"},
               {"op": "create_queue", "queue": "q",
                "config": {"max_deliveries": 1, "dead_letter": "dl", "lease_ms": 10}})
    log.append({"op": "put", "queue": "q", "messages": [{"body": f"m{seq}", **({"key": "k"} if seq == 2 else {})}
                                                        for seq in range(1, 6)]})
    refs = {seq: ref_of(log, seq) for seq in range(1, 6)}
    moves = [log.move([seq], refs[seq]) for seq in range(1, 6)]
    # since the leader read them: 1 is acked, 2 replaced by a newer version of its key, 3 dead-lettered
    [received] = log.append({"op": "receive", "queue": "q", "group": "default", "max": 1})
    log.append({"op": "ack", "queue": "q", "receipts": [received["messages"][0]["receipt"]]})
    log.append({"op": "put", "queue": "q", "messages": [{"body": "m2 again", "key": "k"}]})
    log.append({"op": "receive", "queue": "q", "group": "default", "max": 1})        # 3, never acked
    log.append({"op": "tick", "now_ms": START + 100})
    assert log.stored() == [(4, "m4"), (5, "m5"), (6, "m2 again")] and log.stored("dl") == [(1, "m3")]
    # 4: a reference a byte further on, whose bytes are there to carry, is not the message's; nor
    # is the dead letter's with another kind; nor does a queue that is gone hold anything
    moves[3] = log.move([4], refs[4]._replace(offset=refs[4].offset + 1))
    result = log.relocate(queues=[("q", moves), ("dl", [log.move([1], refs[3]._replace(kind=0))]),
                                  ("gone", [log.move([1], refs[5])])])
    assert result == {"moved": 1, "stale": 6, "bytes": refs[5].length}
    assert ref_of(log, 4) == refs[4] and ref_of(log, 1, "dl") == refs[3] and ref_of(log, 5).index == 8
    assert log.stored() == [(4, "m4"), (5, "m5"), (6, "m2 again")] and log.stored("dl") == [(1, "m3")]
    assert log.machine.live_entry_indexes() == [2, 5, 8]


def test_a_message_every_group_shares_moves_once_and_reads_back_alike_in_each():
    log = Log()
    log.append({"op": "put", "queue": "q", "messages": [{"body": b"shared" * 30}, {"body": b"y" * 4_000}]})
    log.append({"op": "add_group", "queue": "q", "group": "audit", "start": "earliest"})
    assert log.relocate(queues=[("q", [log.move([1], ref_of(log, 1)), log.move([1], ref_of(log, 1))])]) \
        == {"moved": 1, "stale": 1, "bytes": 180}
    for group in ("default", "audit"):
        [got] = log.append({"op": "receive", "queue": "q", "group": group, "max": 1})
        assert [log.body(m["body"]) for m in got["messages"]] == [b"shared" * 30]


def test_a_staged_body_moves_and_its_commit_publishes_the_copy():
    log = Log()
    log.append({"op": "stage", "producer": "p", "token": "a", "chunk": 0, "queue": "q",
                "messages": [{"body": b"keep" * 10}, {"body": "x" * 3_000}]})
    log.append({"op": "stage", "producer": "p", "token": "b", "chunk": 0, "queue": "q",
                "messages": [{"body": "first"}]})
    (_, _, _, keep), (_, _, _, drop), (_, _, _, first) = sorted(log.machine.staging.references())
    stale = log.move(["b", 0, 0], first)
    log.append({"op": "stage", "producer": "p", "token": "b", "chunk": 0, "queue": "q",
                "messages": [{"body": "again"}]})                            # staged again since it was read
    assert log.relocate(stages=[log.move(["a", 0, 0], keep), stale]) == {"moved": 1, "stale": 1, "bytes": 40}
    assert log.machine.live_entry_indexes() == [1, 3, 4]
    restored = StateMachine()
    restored.restore(log.machine.snapshot())
    assert restored.snapshot() == log.machine.snapshot() and restored.live_entry_indexes() == [1, 3, 4]
    log.append({"op": "stage_commit", "producer": "p", "batch": 0, "parts": [{"token": "a", "chunks": 1}]})
    assert log.stored() == [(1, b"keep" * 10), (2, "x" * 3_000)]
    assert ref_of(log, 1).index == 4 and ref_of(log, 2) == drop


def test_a_relocation_applied_without_its_entry_moves_nothing():
    log = Log()
    log.append({"op": "put", "queue": "q", "messages": [{"body": "m"}]})
    before = log.machine.snapshot()
    move = log.move([1], ref_of(log, 1))
    assert log.machine.apply({"op": "relocate", "queues": [["q", [move]]], "now_ms": START}) \
        == {"moved": 0, "stale": 1, "bytes": 0}
    assert log.machine.snapshot() == before


def test_a_relocation_and_a_put_in_one_entry_each_find_their_own_bodies():
    log = Log()
    log.append({"op": "put", "queue": "q", "messages": [{"body": "same"}, {"body": "z" * 2_000}]})
    move = log.move([1], ref_of(log, 1))
    log.append({"op": "relocate", "queues": [["q", [move]]]},
               {"op": "put", "queue": "q", "messages": [{"body": "same"}, {"body": "other"}]})
    assert [ref_of(log, seq).index for seq in (1, 3, 4)] == [2, 2, 2]
    assert log.stored() == [(1, "same"), (2, "z" * 2_000), (3, "same"), (4, "other")]


def test_a_malformed_relocation_is_refused_whole():
    log = Log()
    log.append({"op": "put", "queue": "q", "messages": [{"body": "m"}, {"body": "n"}]})
    good = log.move([1], ref_of(log, 1))
    before = log.machine.snapshot()
    for queues, stages in (
            ([["q", [good, good[:-1] + [b"too long"]]]], []),       # bytes unlike the reference's length
            ([["q", [good, [1, 0, *good[2:]]]]], []),               # index 0: a body without a reference
            ([["q", [good, good[:4] + [True, good[5]]]]], []),      # a kind that is not one
            ([["q", [good, good[:4] + [1.0, good[5]]]]], []),
            ([["q", [good, [0, *good[1:]]]]], []),                  # seq 0
            ([["q q", [good]]], []),                                # not a queue name
            ([["q", good]], []),                                    # moves that are not lists
            ([], [["", 0, 0, *good[1:]]]),                          # a stage without a token
            ([], [["a", 0, *good[1:]]]),                            # a staged move without its position
            ("q", [])):
        [result] = log.machine.apply_entry(encode_entry([{"op": "relocate", "queues": queues, "stages": stages,
                                                          "now_ms": START}]), 9)
        assert result["error"] == "bad_request", (queues, stages)
        assert log.machine.snapshot() == before


def test_a_retained_message_moves_and_a_replay_serves_the_copy():
    log = Log()
    log.append({"op": "create_queue", "queue": "q", "config": {"retention_ms": 60_000}})
    log.append({"op": "put", "queue": "q", "messages": [{"body": b"kept" * 10}, {"body": "x" * 3_000}]})
    [received] = log.append({"op": "receive", "queue": "q", "group": "default", "max": 2})
    log.append({"op": "ack", "queue": "q", "receipts": [m["receipt"] for m in received["messages"]]})
    assert log.machine.queues["q"].rows.retained == 2 and log.machine.live_entry_indexes() == [2]
    assert log.relocate(queues=[("q", [log.move([1], ref_of(log, 1))])])["moved"] == 1
    assert ref_of(log, 1).index == 5 and log.machine.live_entry_indexes() == [2, 5]
    assert log.relocate(queues=[("q", [log.move([2], ref_of(log, 2))])])["moved"] == 1
    assert log.machine.live_entry_indexes() == [5, 6], "the put's entry serves nothing any more"
    log.append({"op": "seek_group", "queue": "q", "group": "default", "to": "earliest"})
    [again] = log.append({"op": "receive", "queue": "q", "group": "default", "max": 2})
    assert [log.body(m["body"]) for m in again["messages"]] == [b"kept" * 10, "x" * 3_000]

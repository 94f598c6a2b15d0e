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

from raftq.statemachine import StateMachine, encode_entry
from raftq.statemachine.bodies import BodyRef, read_body
from tests.test_statemachine_model import GROUPS, START, random_log


def resolved(value, log: list):
    """`value` with every BodyRef read back from `log` (entry i at log[i - 1])."""
    if isinstance(value, BodyRef):
        return read_body(value, log[value.index - 1])
    if isinstance(value, dict):
        return {k: resolved(v, log) for k, v in value.items()}
    if isinstance(value, list):
        return [resolved(v, log) for v in value]
    return value


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


def every_page(machine: StateMachine) -> list:
    return [machine.browse(name, group, 0, 10_000) for name, queue in machine.queues.items()
            for group in GROUPS if group in queue.groups]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_references_and_bodies_give_the_same_results_pages_and_state(seed):
    log = random_log(seed, 200)
    by_reference, by_value = StateMachine(), StateMachine()
    for index, entry in enumerate(log, start=1):
        assert resolved(by_reference.apply_entry(entry, index), log) == by_value.apply_entry(entry)
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

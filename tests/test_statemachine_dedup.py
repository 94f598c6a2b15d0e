"""The dedup window's hashed structure (statemachine/dedup.py) against a dict of the
ids themselves, what the window held before it was hashed, and the window through the
state machine: snapshots, and the snapshots of the releases before it.

The structure is driven far enough that its buckets split many times, its FIFO
takes every chunk size and wraps from chunk to chunk, put times jump by 2**32 ms
and more, and seqs by 2**32 and more."""

import random
import subprocess
import sys
from collections import deque

import cbor2
import pytest

from raftq.statemachine import StateMachine
from raftq.statemachine.dedup import LARGEST_CHUNK_BYTES, LOAD, LOW32, DedupWindow, ENTRY
from tests.test_operations import UPGRADE_FROM, exported

T0 = 1_000_000


class Remembered:
    """The window as it was before it was hashed: id -> (seq, put_at), and the ids in put order."""

    def __init__(self):
        self.ids = {}
        self.order = deque()
        self.id_bytes = 0

    def remember(self, mid, seq, clock):
        if mid in self.ids:
            return self.ids[mid][0]
        while self.order and seq - self.ids[self.order[0]][0] > LOW32:    # 2**32 seqs after it: forgotten
            self.forget_oldest()
        self.ids[mid] = (seq, clock)
        self.order.append(mid)
        self.id_bytes += len(mid.encode())
        return None

    def forget_oldest(self):
        mid = self.order.popleft()
        del self.ids[mid]
        self.id_bytes -= len(mid.encode())

    def expire(self, clock, window):
        while self.order and self.ids[self.order[0]][1] + window <= clock:
            self.forget_oldest()

    def forget_beyond(self, max_bytes):
        while self.id_bytes > max_bytes:
            self.forget_oldest()


def same(window: DedupWindow, model: Remembered) -> None:
    assert len(window) == len(model.order)
    assert window.id_bytes == model.id_bytes
    if model.order:
        assert window.oldest_put == model.ids[model.order[0]][1]


def restored(window: DedupWindow) -> DedupWindow:
    state = cbor2.loads(cbor2.dumps(window.to_state()))
    again = DedupWindow.from_state(state)
    assert again.to_state() == window.to_state()
    return again


@pytest.mark.parametrize("seed", range(4))
def test_the_hashed_window_answers_as_the_ids_themselves_did(seed):
    rng = random.Random(seed)
    window, model = DedupWindow(), Remembered()
    clock, seq, ids = T0, 1, []
    span_ms = 2_000                          # about 20 000 ids in the window, 100 per ms
    most_buckets = 0
    for step in range(60_000):
        roll = rng.random()
        if roll < 0.0002:
            seq += LOW32 - rng.randrange(30_000)       # about 2**32 messages without ids: some ids go
        elif roll < 0.0003:
            window.forget_beyond(model.id_bytes // 2)  # the budget
            model.forget_beyond(model.id_bytes // 2)
        elif roll < 0.0007:
            window = restored(window)
        elif roll < 0.01:
            clock += 1
        window.expire(clock, span_ms)
        model.expire(clock, span_ms)
        if rng.random() < 0.2 and ids:                 # a retry, perhaps of an id already forgotten
            mid = ids[rng.randrange(max(0, len(ids) - 30_000), len(ids))]
        else:
            mid = f"id-{len(ids)}" + "é" * rng.randrange(3)
            ids.append(mid)
        answer = window.remember(mid, seq, clock)
        assert answer == model.remember(mid, seq, clock), step
        if answer is None:
            seq += 1
        same(window, model)
        most_buckets = max(most_buckets, len(window.buckets))
    assert most_buckets > 64                        # it split, again and again
    assert max(map(len, window.fifo)) == LARGEST_CHUNK_BYTES
    for mid, (first_seq, _) in model.ids.items():
        assert mid in window and window.remember(mid, 0, clock) == first_seq
    window.expire(clock + span_ms, span_ms)
    assert len(window) == 0 and window.to_state() == [] and window.buckets == [bytearray()]


def test_the_fifo_wraps_from_chunk_to_chunk_and_its_head_time_follows():
    window = DedupWindow()
    ids = 3 * LARGEST_CHUNK_BYTES // ENTRY.size
    for i in range(ids):
        window.remember(f"m{i}", i + 1, T0 + i)
    assert len(window.fifo) > 3
    for i in range(ids - 1):
        window.forget_oldest()
        assert window.oldest_put == T0 + i + 1
        assert window.remember(f"m{ids - 1}", 0, T0 + ids) == ids
    assert len(window.fifo) == 1 and len(window) == 1


def test_the_buckets_split_in_order_and_hold_about_load_ids_each():
    window = DedupWindow()
    for i in range(100 * LOAD):
        window.remember(f"m{i}", i + 1, T0)
    assert len(window.buckets) == 100 and (window.level, window.split) == (6, 36)
    assert sum(map(len, window.buckets)) == 16 * 100 * LOAD
    assert all(window.remember(f"m{i}", 0, T0) == i + 1 for i in range(100 * LOAD))


def test_a_window_restored_from_its_snapshot_is_laid_out_for_its_size_and_encodes_alike():
    grown = DedupWindow()
    for i in range(20 * LOAD):
        grown.remember(f"m{i}", i + 1, T0 + i)
    grown.expire(T0 + 19 * LOAD, 1)                  # all but LOAD ids go; the buckets stay
    again = restored(grown)
    assert len(grown.buckets) == 20 and len(again.buckets) == 1
    assert [again.remember(f"m{i}", 0, T0) for i in range(19 * LOAD, 20 * LOAD)] == \
        list(range(19 * LOAD + 1, 20 * LOAD + 1))
    assert again.remember(f"m{19 * LOAD - 1}", 20 * LOAD + 1, T0 + 20 * LOAD) is None


def test_put_times_2_to_the_32_ms_apart_are_kept_whole():
    window = DedupWindow()
    # gaps: 1, 2**32 (kept whole), 1, 2**32 - 1 (rebuilt from its low 32 bits), then about 2**34 (whole)
    times = [T0, T0 + 1, T0 + 1 + 2**32, T0 + 2 + 2**32, T0 + 1 + 2**33, T0 + 7 * 2**32]
    for i, at in enumerate(times):
        window.remember(f"m{i}", i + 1, at)
    assert len(window.far_puts) == 2
    window = restored(window)
    for at in times:
        assert window.oldest_put == at
        window = restored(window)
        window.forget_oldest()
    assert len(window) == 0 and window.far_puts == {}


# ---- through the state machine ------------------------------------------------------------

def put(sm, now, *ids, **fields):
    result = sm.apply({"op": "put", "queue": "q", "now_ms": now, **fields,
                       "messages": [{"body": "x", "id": mid} for mid in ids]})
    return [(m["seq"], m["duplicate"]) for m in result["messages"]]


def test_a_retry_after_a_snapshot_and_restore_is_still_a_duplicate():
    sm = StateMachine()
    sm.apply({"op": "create_queue", "queue": "q", "now_ms": T0, "config": {"dedup_window_ms": 1_000}})
    assert put(sm, T0, "a", "b") == [(1, False), (2, False)]
    assert put(sm, T0 + 500, "c") == [(3, False)]
    again = StateMachine()
    again.restore(sm.snapshot())
    assert again.snapshot() == sm.snapshot()
    assert again.next_timer() == T0 + 1_000
    assert put(again, T0 + 999, "a", "c") == [(1, True), (3, True)]
    assert put(again, T0 + 1_000, "a", "c") == [(4, False), (3, True)]     # "a"'s window is over


def test_the_budget_still_counts_each_ids_utf8_bytes():
    sm = StateMachine()
    put(sm, T0, "éé", "ab", dedup_max_bytes=6)           # 4 + 2 bytes: both kept
    put(sm, T0, "c", dedup_max_bytes=6)                  # 7 bytes: "éé" goes
    assert put(sm, T0, "ab", "c", "éé") == [(2, True), (3, True), (4, False)]


OLD_RELEASE_PUTS = """
import sys
import cbor2
from statemachine import StateMachine      # the old releases' layout: the room was a top-level package
sm = StateMachine()
T0 = 1_000_000
sm.apply({"op": "create_queue", "queue": "q", "now_ms": T0, "config": {"dedup_window_ms": 10_000}})
for i in range(3 * 200):
    sm.apply({"op": "put", "queue": "q", "now_ms": T0 + i * 10, "dedup_max_bytes": 2_000,
              "messages": [{"body": i, "id": f"id-{i:04d}-é"}]})
sys.stdout.buffer.write(sm.snapshot())
"""


@pytest.mark.parametrize("revision", [UPGRADE_FROM, "8baf810"])
def test_a_snapshot_of_an_older_release_restores_its_ids_as_hashes(revision, tmp_path):
    """The release a cluster is upgraded from (snapshot version 6) and the last one
    that kept ids whole (version 7): what their window held is still a duplicate."""
    tree = exported(revision, tmp_path / "tree")
    old = subprocess.run([sys.executable, "-c", OLD_RELEASE_PUTS], env={"PYTHONPATH": str(tree)}, cwd=tree,
                         capture_output=True, check=True, timeout=120).stdout
    assert cbor2.loads(old)["version"] < 8
    sm = StateMachine()
    sm.restore(old)
    queue = sm.queues["q"]
    # 10-byte ids ("id-NNNN-é") under a 2 000-byte budget: the last 200 were kept
    assert len(queue.dedup) == 200 and queue.dedup.id_bytes == 2_000
    last = T0 + 599 * 10
    assert put(sm, last, "id-0400-é", "id-0599-é") == [(401, True), (600, True)]
    assert put(sm, last, "id-0399-é") == [(601, False)]
    assert sm.next_timer() == T0 + 400 * 10 + 10_000
    # the same puts applied by this release leave the same state
    replayed = StateMachine()
    replayed.apply({"op": "create_queue", "queue": "q", "now_ms": T0, "config": {"dedup_window_ms": 10_000}})
    for i in range(3 * 200):
        replayed.apply({"op": "put", "queue": "q", "now_ms": T0 + i * 10, "dedup_max_bytes": 2_000,
                        "messages": [{"body": i, "id": f"id-{i:04d}-é"}]})
    put(replayed, last, "id-0400-é", "id-0599-é")
    put(replayed, last, "id-0399-é")
    assert replayed.snapshot() == sm.snapshot()

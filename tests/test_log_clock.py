"""engine.node.LogClock: the leader's source of `now_ms`.

Log time stands still in a term the clock has not settled for (after an
election, until the new leader's barrier entry is applied), then continues
from 1 ms after the applied log time with the monotonic clock, never the
wall clock.
The machine's clock here starts far from the wall clock (5 s after the epoch),
so a stamp read from the wall clock cannot pass for log time.
"""

import time

import cbor2

from raftq.engine.node import LogClock, stamped
from raftq.statemachine import StateMachine
from tests.waiting import wait_until

APPLIED_MS = 5_000


def machine_at(now_ms: int) -> StateMachine:
    machine = StateMachine()
    machine.apply({"op": "tick", "now_ms": now_ms})
    assert machine.clock == now_ms
    return machine


def let_time_pass(seconds: float = 0.05) -> None:
    start = time.monotonic()
    wait_until(lambda: time.monotonic() >= start + seconds, what="time to pass")


def test_log_time_stands_still_in_a_term_not_yet_settled():
    machine = machine_at(APPLIED_MS)
    clock = LogClock(machine)
    assert not clock.settled_for(2)
    let_time_pass()
    assert clock.barrier_ms() == APPLIED_MS
    machine.apply({"op": "tick", "now_ms": APPLIED_MS + 200})   # the previous leader's last entries
    let_time_pass()
    assert clock.barrier_ms() == APPLIED_MS + 200


def test_once_settled_log_time_continues_from_the_applied_time_with_the_monotonic_clock():
    machine = machine_at(APPLIED_MS)
    clock = LogClock(machine)
    before = time.monotonic()
    clock.settle(2)
    assert clock.settled_for(2)
    first = clock.now_ms()
    let_time_pass()
    second = clock.now_ms()
    elapsed_ms = (time.monotonic() - before) * 1000
    # 1 ms on from the applied time: every moment of the term comes after every moment of the last
    assert APPLIED_MS < first <= second <= APPLIED_MS + 1 + elapsed_ms
    assert second >= APPLIED_MS + 50


def test_a_new_term_stands_still_again_until_it_is_settled():
    machine = machine_at(APPLIED_MS)
    clock = LogClock(machine)
    clock.settle(2)
    let_time_pass()
    stamped = clock.now_ms()
    machine.apply({"op": "tick", "now_ms": stamped})
    # deposed and re-elected (term 3): the term-2 base is not trusted
    assert not clock.settled_for(3)
    let_time_pass()
    assert clock.barrier_ms() == stamped
    started = time.monotonic()
    clock.settle(3)
    assert stamped < clock.now_ms() <= stamped + 1 + (time.monotonic() - started) * 1000


def test_a_wall_clock_jump_moves_no_log_time(monkeypatch):
    machine = machine_at(APPLIED_MS)
    clock = LogClock(machine)
    clock.settle(2)
    before = clock.now_ms()
    started = time.monotonic()
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600)    # an hour forward
    after = clock.now_ms()
    assert before <= after <= before + (time.monotonic() - started) * 1000 + 1
    monkeypatch.setattr(time, "time", lambda: real_time() - 3600)    # and an hour back
    assert clock.now_ms() >= after


def test_a_stamp_is_spliced_into_an_encoded_command_of_any_size():
    small = {"op": "put", "queue": "q", "messages": [{"body": b"x"}]}
    large = {f"field{i}": i for i in range(30)}
    for command in (small, {}, large):
        assert cbor2.loads(stamped(cbor2.dumps(command), 1234)) == {**command, "now_ms": 1234}

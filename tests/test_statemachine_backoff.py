"""Redelivery back-off (issue 51), one rule per test: a lease that runs out, or a nack without a
delay of its own, makes the message ready again after min(max_ms, initial_ms * factor^(n-1)) of
log time from the end of its n-th delivery, less a jitter drawn from the log (docs/api.md,
"Redelivery back-off"; statemachine/backoff.py)."""

import pytest

from raftq.statemachine import StateMachine
from raftq.statemachine.backoff import redelivery_delay
from tests.test_statemachine_rules import T0, Machine, msg

POLICY = {"initial_ms": 1_000, "factor": 2, "max_ms": 5_000}


@pytest.fixture
def m():
    machine = Machine()
    machine.ok("create_queue", queue="q", config={"lease_ms": 10_000, "backoff": POLICY})
    return machine


def nack_and_find_ready(m, expected_delay):
    """Nack the one message now; it is not ready a millisecond before `expected_delay`, and is at it."""
    got = m.receive("q")
    assert len(got) == 1
    m.ok("nack", queue="q", receipts=[got[0]["receipt"]])
    nacked_at = m.now
    assert m.sm.browse("q", "default", 0, 1)["messages"][0]["next_ready_at_ms"] == nacked_at + expected_delay
    m.now = nacked_at + expected_delay - 1
    assert m.receive("q") == []
    m.now = nacked_at + expected_delay
    return got[0]["deliveries"]


def test_a_nack_without_a_delay_waits_initial_then_grows_by_the_factor_up_to_the_maximum(m):
    m.put("q", msg())
    for delivery, delay in enumerate([1_000, 2_000, 4_000, 5_000, 5_000], start=1):
        assert nack_and_find_ready(m, delay) == delivery


def test_a_lease_that_runs_out_waits_from_its_deadline_not_from_when_a_command_noticed(m):
    m.put("q", msg())
    m.receive("q", lease_ms=500)
    m.tick(T0 + 1_300)                  # the lease ended at T0 + 500: ready at T0 + 1 500
    assert m.stats("q")["delayed"] == 1
    assert m.sm.browse("q", "default", 0, 1)["messages"][0]["next_ready_at_ms"] == T0 + 1_500
    m.now = T0 + 1_499
    assert m.receive("q") == []
    m.now = T0 + 1_500
    assert [r["deliveries"] for r in m.receive("q", lease_ms=500)] == [2]
    m.tick(T0 + 1_500 + 500 + 2_000 + 7)   # past its deadline + 2 000: ready at once
    assert [r["deliveries"] for r in m.receive("q")] == [3]


def test_a_delay_given_with_the_nack_wins_even_0(m):
    m.put("q", msg(), msg())
    first, second = m.receive("q")
    m.ok("nack", queue="q", receipts=[first["receipt"]], delay_ms=0)
    m.ok("nack", queue="q", receipts=[second["receipt"]], delay_ms=300)
    assert [r["seq"] for r in m.receive("q")] == [first["seq"]]
    m.now += 300
    assert [r["seq"] for r in m.receive("q")] == [second["seq"]]


def test_without_a_policy_a_message_is_ready_again_at_once(m):
    m.ok("patch_queue", queue="q", config={"backoff": None})
    m.put("q", msg())
    m.ok("nack", queue="q", receipts=[m.receive("q")[0]["receipt"]])
    assert m.sm.browse("q", "default", 0, 1)["messages"][0]["next_ready_at_ms"] is None
    assert [r["deliveries"] for r in m.receive("q")] == [2]


def test_the_jitter_is_drawn_from_the_log_the_same_on_every_replica():
    delays = {}
    for replica in range(2):
        machine = Machine()
        machine.ok("create_queue", queue="q", config={"backoff": {"initial_ms": 10_000, "jitter": 0.5}})
        machine.put("q", *[msg(str(i)) for i in range(50)])
        received = machine.receive("q", n=50)
        machine.ok("nack", queue="q", receipts=[r["receipt"] for r in received])
        delays[replica] = [r["next_ready_at_ms"] - T0 for r in machine.sm.browse("q", "default", 0, 50)["messages"]]
    assert delays[0] == delays[1]
    assert all(5_000 < delay <= 10_000 for delay in delays[0])
    assert len(set(delays[0])) > 40          # the seqs draw different fractions


def test_the_delay_is_the_policys_function_of_the_delivery_count():
    policy = {"initial_ms": 100, "factor": 3.0, "max_ms": 10_000, "jitter": 0.0}
    assert [redelivery_delay(policy, "q", "g", 1, n) for n in range(1, 7)] == [100, 300, 900, 2_700, 8_100, 10_000]
    assert redelivery_delay(policy, "q", "g", 1, 10 ** 9) == 10_000     # no overflow, however many
    assert redelivery_delay(None, "q", "g", 1, 3) == 0


def test_the_last_delivery_is_dead_lettered_without_waiting(m):
    m.ok("patch_queue", queue="q", config={"max_deliveries": 2, "dead_letter": "dl"})
    m.put("q", msg("poison"))
    assert nack_and_find_ready(m, 1_000) == 1
    last = m.receive("q")
    m.ok("nack", queue="q", receipts=[last[0]["receipt"]])
    assert [r["body"] for r in m.receive("dl")] == ["poison"]


def test_back_off_delays_count_in_stats_and_survive_a_snapshot(m):
    m.put("q", msg())
    m.ok("nack", queue="q", receipts=[m.receive("q")[0]["receipt"]])
    assert m.stats("q")["delayed"] == 1
    restored = StateMachine()
    restored.restore(m.sm.snapshot())
    m.sm = restored
    m.now += 999
    assert m.receive("q") == []
    m.now += 1
    assert len(m.receive("q")) == 1


def test_a_partial_policy_is_kept_whole_so_creating_the_queue_again_is_no_change():
    machine = Machine()
    created = machine.ok("create_queue", queue="q", config={"backoff": {"initial_ms": 250}})
    assert created["config"]["backoff"] == {"initial_ms": 250, "factor": 2.0, "max_ms": 60_000, "jitter": 0.0}
    assert machine.ok("create_queue", queue="q", config={"backoff": {"initial_ms": 250, "factor": 2}})["created"] \
        is False
    longer = machine.ok("create_queue", queue="slow", config={"backoff": {"initial_ms": 600_000}})
    assert longer["config"]["backoff"]["max_ms"] == 600_000      # no maximum given: it does not shrink


@pytest.mark.parametrize("policy", [
    {"initial_ms": 0}, {"factor": 0.5}, {"factor": 11}, {"factor": "2"}, {"jitter": 1.5}, {"jitter": -0.1},
    {"initial_ms": 5_000, "max_ms": 1_000}, {"max_ms": 2 ** 41}, {"delay": 1}, [], "fast",
    {"factor": float("nan")}, {"factor": True}])
def test_a_malformed_policy_is_refused_and_changes_nothing(m, policy):
    before = m.sm.snapshot()
    m.fails("bad_request", "patch_queue", queue="q", config={"backoff": policy})
    assert m.sm.snapshot() == before

"""engine/quotas.py: a principal's put rate (a token bucket on each group's leader), the
connections it holds in the cluster (leases on group 0's leader) and, while an older release
runs somewhere, on a node, on a clock the test moves."""

import collections

from raftq.engine.quotas import ConnectionLeases, Holds, PutRates


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_takes_a_seconds_worth_then_the_rate_and_says_how_long_to_wait():
    clock = Clock()
    rates = PutRates(clock)
    assert all(rates.take("p", 10, 100.0) is None for _ in range(10))    # one second's worth at once
    wait = rates.take("p", 10, 100.0)
    assert wait is not None and 0 < wait <= 0.02
    clock.now += wait
    assert rates.take("p", 10, 100.0) is None
    assert rates.take("other", 10, 100.0) is None                        # each principal its own bucket


def test_a_batch_larger_than_a_seconds_worth_passes_once_and_the_next_waits_for_it():
    clock = Clock()
    rates = PutRates(clock)
    assert rates.take("p", 500, 100.0) is None
    wait = rates.take("p", 1, 100.0)
    assert wait is not None and abs(wait - 4.0) < 1e-9                    # 400 below zero at 100 a second
    clock.now += 3.9
    assert rates.take("p", 1, 100.0) is not None
    clock.now += 0.2
    assert rates.take("p", 1, 100.0) is None


def test_holds_count_a_principals_connections_across_fronts_up_to_its_limit():
    holds, front_a, front_b = Holds(), collections.Counter(), collections.Counter()
    assert holds.hold(front_a, "p", 2) and holds.hold(front_b, "p", 2)
    assert not holds.hold(front_a, "p", 2)
    holds.release_all(front_b)                                            # a front's link closed
    assert holds.hold(front_a, "p", 2) and not holds.hold(front_b, "p", 2)
    holds.release(front_a, "p")
    assert holds.held["p"] == 1


def test_leases_count_a_principals_connections_up_to_its_limit_and_expire_unrenewed():
    clock = Clock()
    leases = ConnectionLeases(6.0, clock)
    leases.took(1)                                                         # elected
    assert leases.hold(1, "p", "a", 2) == 6.0                             # a new leader relearns first
    clock.now += 3.0
    leases.renew(1, [["p", "a"], ["p", "b"]])                              # the fronts' renewals are taken
    clock.now += 3.0
    assert leases.hold(1, "p", "c", 2) is False                            # relearned: a and b are open
    assert leases.hold(1, "q", "x", 1) is True                             # each principal its own count
    leases.release(1, "p", "a")
    assert leases.hold(1, "p", "c", 2) is True
    clock.now += 4.0
    leases.renew(1, [["p", "c"]])                                          # b's node died: not renewed
    clock.now += 2.5
    assert leases.hold(1, "p", "d", 2) is True and leases.hold(1, "p", "e", 2) is False
    leases.renew(1, [["p", "c"], ["p", "d"], ["p", "late"]])               # a renewal is taken past the limit
    assert leases.hold(1, "p", "e", 2) is False


def test_a_new_term_starts_an_empty_table_and_refuses_new_holds_for_one_lease():
    clock = Clock()
    leases = ConnectionLeases(6.0, clock)
    leases.took(1)
    clock.now += 6.0
    assert leases.hold(1, "p", "a", 1) is True
    clock.now += 1.0
    leases.took(2)                                     # the lead moved: what term 1 held is unknown here
    assert leases.hold(2, "p", "b", 1) == 6.0
    clock.now += 2.0
    leases.renew(2, [["p", "a"]])
    clock.now += 4.0
    assert leases.hold(2, "p", "b", 1) is False        # relearned from its front's renewal

"""engine/quotas.py: a principal's put rate (a token bucket on each group's leader) and the
connections it holds on a node, on a clock the test moves."""

import collections

from raftq.engine.quotas import Holds, PutRates


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

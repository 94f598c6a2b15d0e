"""Redelivery back-off: how long a message waits before it is offered again.

A queue's ``backoff`` policy (null: none, as before) applies when a delivery
ends without an ack and without a delay of its own: a lease that runs out, or
a nack that names no ``delay_ms``.  After the n-th delivery of a message in a
group the message is ready again

    min(max_ms, initial_ms * factor ** (n - 1))

after the delivery ended (a lease's end is its deadline, not the moment a
command noticed it), less a jitter of up to ``jitter`` of that delay: a
fraction drawn from a hash of the queue, the group, the seq and n.  Every
replica computes the same delay from the log alone: the hash is not a node's
randomness, and the power is taken by multiplying IEEE doubles (square and
multiply), whose every step rounds alike on every machine -- C's ``pow``
may differ in its last bit between C libraries.
"""

import hashlib

POLICY_DEFAULTS = {"initial_ms": 1_000, "factor": 2.0, "max_ms": 60_000, "jitter": 0.0}
MAX_FACTOR = 10
# A factor of 2 reaches 2^40 ms (the longest duration) in 40 deliveries: past this many the
# delay stopped growing long before, whatever the factor (the power would only be infinite).
MAX_EXPONENT = 1 << 16


def full_policy(policy):
    """A policy with every field, its numbers as the machine keeps them (None: no back-off). Without
    a max_ms the delay stops growing at a minute, or at initial_ms when that is longer."""
    if policy is None:
        return None
    full = {**POLICY_DEFAULTS, **policy}
    if "max_ms" not in policy:
        full["max_ms"] = max(POLICY_DEFAULTS["max_ms"], full["initial_ms"])
    full["factor"], full["jitter"] = float(full["factor"]), float(full["jitter"])
    return full


def _power(factor: float, exponent: int) -> float:
    result = 1.0
    while exponent:
        if exponent & 1:
            result *= factor
        factor *= factor
        exponent >>= 1
    return result


def _draw(queue: str, group: str, seq: int, deliveries: int) -> int:
    """64 bits that only the log decides."""
    digest = hashlib.blake2b(f"{queue}\0{group}\0{seq}\0{deliveries}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def redelivery_delay(policy, queue: str, group: str, seq: int, deliveries: int) -> int:
    """The milliseconds message `seq` of `queue` waits in `group` after its `deliveries`-th delivery
    ended without an ack (0 without a policy)."""
    if policy is None or deliveries < 1:
        return 0
    limit = policy["max_ms"]
    grown = policy["initial_ms"] * _power(policy["factor"], min(deliveries - 1, MAX_EXPONENT))
    delay = limit if grown >= limit else int(grown)
    spread = int(delay * policy["jitter"])
    if spread:
        delay -= (spread * _draw(queue, group, seq, deliveries)) >> 64
    return delay

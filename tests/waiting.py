"""Waiting on an observable condition instead of sleeping: a test that orders
events by sleeping passes or fails with the machine's load."""

import time


def wait_until(predicate, timeout: float = 30.0, what: str = "condition"):
    """`predicate()`'s first truthy value; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout} s")
        time.sleep(0.02)

"""Loaded as `sitecustomize` into the raftq nodes that chaos runs under libfaketime.

The clock faults move a node's wall clock and leave CLOCK_MONOTONIC alone
(FAKETIME_DONT_FAKE_MONOTONIC=1): real clocks jump, monotonic ones do not, and
a faked monotonic clock hangs Python's own lock timeouts. With that setting,
libfaketime 0.9.10 (Debian's) hands the kernel a garbage deadline for
clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which `time.sleep` uses since
Python 3.11, and every sleep fails with EINVAL (wolfcw/libfaketime#426).
Sleeping on select()'s relative timeout avoids that call and keeps the meaning.
"""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep

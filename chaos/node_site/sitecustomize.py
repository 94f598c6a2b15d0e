"""Loaded as `sitecustomize` into the raftq nodes that chaos and the tests run
(this directory on PYTHONPATH); it changes nothing unless its environment asks.

RAFTQ_SYNC_LEDGER: record what each fsync made durable (chaos/sync_ledger.py), so
that a kill -9 can be turned into a power cut.

RAFTQ_DISK_FAULTS: the control file through which a test or the nemesis arms
disk faults (short writes, a full disk, EIO from fsync, misdirected writes) in
the node's processes while they run (chaos/disk_faults.py).

LD_PRELOAD with libfaketime (clock faults): those move a node's wall clock and
leave CLOCK_MONOTONIC alone (FAKETIME_DONT_FAKE_MONOTONIC=1): real clocks jump,
monotonic ones do not, and a faked monotonic clock hangs Python's own lock
timeouts. With that setting, libfaketime 0.9.10 (Debian's) hands the kernel a
garbage deadline for clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which
`time.sleep` uses since Python 3.11, and every sleep fails with EINVAL
(wolfcw/libfaketime#426). Sleeping on select()'s relative timeout avoids that
call and keeps the meaning.
"""

import os
import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


if "libfaketime" in os.environ.get("LD_PRELOAD", ""):
    time.sleep = _sleep

if os.environ.get("RAFTQ_SYNC_LEDGER"):
    from chaos.sync_ledger import record_syncs
    record_syncs(os.environ["RAFTQ_SYNC_LEDGER"])

if os.environ.get("RAFTQ_DISK_FAULTS"):
    from chaos.disk_faults import install
    install(os.environ["RAFTQ_DISK_FAULTS"])

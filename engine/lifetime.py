"""Child processes that must not outlive the process that made them."""

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with(parent_pid: int) -> None:
    """Have the kernel kill this process when `parent_pid` (its parent) exits.

    Linux ties the signal to the *thread* that forked: a child forked by a
    thread that ends before it is killed then too, which is what its callers
    want (a front forked before any thread exists; a snapshot writer forked
    by the tick thread, which ends only when the node stops)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:   # the parent died before the request took effect
        os._exit(1)

"""A node's processes: named for what they do (what `top` and `ps -o comm`
show, and how benchmarks tell them apart), and children that must not outlive
the process that made them."""

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def name_process(name: str) -> None:
    """Give this process `name` in /proc/<pid>/comm: raftq-node (a node's
    supervisor), raftq-group-<g> (group g's engine), raftq-front-<w> (a front).
    The kernel keeps the first 15 bytes."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()))


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

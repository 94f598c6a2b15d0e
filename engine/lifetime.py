"""A node's processes: named for what they do (what `top` and `ps -o comm`
show, and how benchmarks tell them apart), children that must not outlive
the process that made them, and large buffers given back to the kernel when
freed."""

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
# glibc's mallopt(3) parameters
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Blocks of this size or more get a mapping of their own, unmapped when freed;
# free memory at the top of a heap past it is given back too.
LARGE_BLOCK_BYTES = 128 * 1024


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


def give_back_large_blocks() -> None:
    """Have glibc serve every block of LARGE_BLOCK_BYTES or more from a mapping of its
    own, given back to the kernel when freed (once, before a node forks: its children
    inherit it).

    Why: glibc's threshold for that starts at 128 KiB but rises to the size of any
    such block freed (up to 32 MiB). A node's buffers of log entries, request bodies
    and messages (up to 2 MiB each) then came from the heaps, and the small blocks that
    live on between them kept that memory from ever going back: filling 20 000
    messages of 10 KiB grew each engine by 3.7-4.8 KB per message and a front by up to
    2.4 KB, all of it free memory that malloc_trim(3) gave back (issue 25,
    docs/benchmarks.md). Setting the thresholds stops them moving. A C library
    without mallopt (not glibc) is left as it is."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES)
        mallopt(M_TRIM_THRESHOLD, LARGE_BLOCK_BYTES)

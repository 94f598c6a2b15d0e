"""A node's processes: named for what they do (what `top` and `ps -o comm`
show, and how benchmarks tell them apart), children that must not outlive
the process that made them, and the free memory of their heaps given back to
the kernel."""

import asyncio
import ctypes
import os
import signal

from .background import Background

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
# How often a process gives the free memory of its heaps back to the kernel.
GIVE_BACK_INTERVAL_S = 1.0
M_ARENA_MAX = -8   # glibc's mallopt(3) parameter


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
    by an engine's one thread, which ends only when the engine stops)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:   # the parent died before the request took effect
        os._exit(1)


def use_one_heap() -> None:
    """Have every thread of this process and of the ones it forks later allocate from glibc's
    main heap (once, before a node forks its engines and fronts); a C library without
    mallopt (not glibc) is left as it is.

    Why: a thread's own arena (glibc gives one to each busy thread: pysyncobj's tick
    thread's got the log entries, before engines ticked on their loop, and a front's
    resolver threads get one) is shrunk by malloc_trim only inside, never from its top:
    a follower's engine kept 29 MB of its arena resident, 8 MB of it in use, after
    100 000 messages of 10 KiB; with one heap its engine grew 16 MB where it had grown
    37 (issue 25, docs/benchmarks.md). The interpreter's lock lets one thread run
    Python at a time, so the threads seldom wait for the heap's."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_ARENA_MAX, 1)


class FreeMemoryGiver(Background):
    """Every GIVE_BACK_INTERVAL_S, has glibc give the free pages of its heaps back to the
    kernel (malloc_trim(3)); a C library without it (not glibc) is left as it is.

    Why: a node's buffers of log entries, request bodies and messages (up to 2 MiB
    each) come from glibc's heaps, which raise their threshold for a mapping of its own
    to the size of any such block freed. The small blocks that live on between them
    kept that memory from ever going back: filling 20 000 messages of 10 KiB grew each
    engine by 3.7-4.8 KB per message and a front by up to 2.4 KB, nearly all of it free
    memory that malloc_trim gave back (issue 25, docs/benchmarks.md). Fixing the
    thresholds instead (a mapping for every block of 128 KiB or more, unmapped when
    freed) did the same, but page faults on every new mapping halved the fill of 10 KiB
    messages; trimming once a second costs about a millisecond."""

    def __init__(self):
        self._trim = getattr(ctypes.CDLL(None), "malloc_trim", None)

    def start(self) -> None:
        if self._trim is not None:
            super().start()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(GIVE_BACK_INTERVAL_S)
            self._trim(0)

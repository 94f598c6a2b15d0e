"""No process a test run started outlives it, however the run is stopped (but by SIGKILL).

Each test stops what it starts, by PID (conftest's start_cluster, LocalCluster.close,
tests/wire.register's clusters, the chaos proxies, the peers of `bench compare`, Spark's
JVM). A run stopped half-way used to skip that: SIGTERM killed pytest on the spot, and
the nodes it had started (in sessions of their own, so that a test can kill a node whole)
ran on with parent PID 1. So, from pytest_configure on:

- SIGTERM and SIGHUP end the run as Ctrl-C (SIGINT) does: the test being run unwinds
  (its `finally` blocks run), every fixture's finalizer runs, the summary is printed;
- then (pytest_unconfigure, and at the interpreter's exit in case the unwinding itself
  was cut short) every process descending from the run that is still alive is stopped
  where it stands (SIGSTOP, so that none starts another: a node's supervisor restarts
  what dies), gathered again until no new one appears, and killed by PID (SIGKILL);
- a second stop signal while the run unwinds kills them at once, and the unwinding goes on
  (it then has nothing left to wait for).

The processes are found by walking /proc from the run's PID: every process a test starts,
however (subprocess, fork, a process group or session of its own, a tool's own children),
descends from it as long as the run lives.
"""

import atexit
import os
import signal
import sys
from pathlib import Path

import pytest

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_interrupted = False     # a stop signal came: the run is unwinding
_ending = False          # the run is over: a stop signal has nothing left to unwind


def _stat(pid: str) -> tuple[int, str] | None:
    """(parent PID, state) of a process, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[1]), fields[0]


def descendants(root: int) -> set[int]:
    """The live (not zombie) processes under `root`, children of children included."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat(entry)
            if found is not None and found[1] != "Z":
                children.setdefault(found[0], []).append(int(entry))
    seen, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def _signal(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_descendants() -> list[str]:
    """Stop every process under this one, then kill each by PID; what was killed, as 'pid command'."""
    frozen: set[int] = set()
    while new := descendants(os.getpid()) - frozen:
        _signal(new, signal.SIGSTOP)
        frozen |= new
    killed = []
    for pid in sorted(frozen):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        killed.append(f"{pid} {command.strip()[:160]}")
    _signal(frozen, signal.SIGKILL)
    return killed


def _on_stop_signal(signum, frame):
    global _interrupted
    if _interrupted or _ending:
        # The run is unwinding, or done: what it would wait for goes now.
        kill_descendants()
        return
    _interrupted = True
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    pytest.exit(f"stopped by {signal.Signals(signum).name}", returncode=pytest.ExitCode.INTERRUPTED)


def stop_on_signals() -> None:
    """Called from pytest_configure, in the main thread. A signal the run was started ignoring
    (nohup, a background job of a shell without job control) stays ignored."""
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _on_stop_signal)
    atexit.register(kill_what_is_left)


def kill_what_is_left() -> None:
    """Called from pytest_unconfigure (every fixture is finalized by then) and at exit."""
    global _ending
    _ending = True
    killed = kill_descendants()
    if killed:
        why = "the run was interrupted" if _interrupted else "no test stopped them"
        print(f"\ntests/stopping.py: killed {len(killed)} process(es) the test run left ({why}):\n  "
              + "\n  ".join(killed), file=sys.stderr)

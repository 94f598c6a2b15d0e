"""A test run stopped half-way, by SIGTERM or by Ctrl-C (pressed twice: the second lands while
the run unwinds), leaves no process it started alive (tests/stopping.py): a real pytest run of
tests/interrupted_run.py, which starts a cluster, clients, a fault proxy and a process no test
stops, is stopped while its test runs."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.stopping import descendants
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent


def identity(pid: int) -> tuple[str, str] | None:
    """(start time, command line) of a live process: a PID used again is another process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return None if stat[0] == "Z" else (stat[19], command.strip())


def processes_naming(text: str) -> list[str]:
    """Every live process on this machine whose command line holds `text`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            seen = identity(int(entry))
            if seen is not None and text in seen[1]:
                found.append(f"{entry} {seen[1][:200]}")
    return found


@pytest.mark.parametrize("stop", ["SIGTERM", "Ctrl-C twice"])
def test_a_run_stopped_while_its_test_runs_leaves_no_process_alive(tmp_path, stop):
    marker, base, log = tmp_path / "running", tmp_path / "basetemp", tmp_path / "run.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAFTQ_INTERRUPT_MARKER": str(marker)}
    # Its output into a file, not a pipe: a process left holding a pipe would hold the read, too.
    # SIGINT as in a terminal's foreground: a run started in a shell's background (mutate.py's, a
    # CI step's) ignores it, and so would its children (tests/stopping.py leaves it ignored).
    with open(log, "wb") as output:
        run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "--basetemp", str(base), "tests/interrupted_run.py"], cwd=REPO, env=env,
                               start_new_session=True, stdout=output, stderr=subprocess.STDOUT,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started = {}
    try:
        wait_until(lambda: marker.exists() or run.poll() is not None, 240, what="the child run's processes")
        assert run.poll() is None, log.read_text()
        started = {pid: identity(pid) for pid in descendants(run.pid)}
        nodes = [int(pid) for pid in marker.read_text().split()]
        assert set(nodes) <= set(started) and len(started) >= 3 * 3 + 2, started
        if stop == "SIGTERM":                  # `kill <pid>`, as a CI runner's timeout sends it
            run.send_signal(signal.SIGTERM)
        else:                                  # a terminal's Ctrl-C: the foreground process group
            os.killpg(run.pid, signal.SIGINT)
            time.sleep(0.3)                    # the second while the run unwinds (signals sent at
            try:                               # once may be delivered as one)
                os.killpg(run.pid, signal.SIGINT)
            except ProcessLookupError:         # the run was quicker
                pass
        try:
            run.wait(120)
        except subprocess.TimeoutExpired:
            run.send_signal(signal.SIGABRT)    # pytest's faulthandler writes where each thread is
            run.wait(30)
        output = log.read_text()
        assert run.returncode == pytest.ExitCode.INTERRUPTED, output
        assert ("stopped by SIGTERM" if stop == "SIGTERM" else "KeyboardInterrupt") in output, output
        alive = [f"{pid} {was[1][:200]}" for pid, was in started.items() if was and identity(pid) == was]
        assert alive == [], output
        assert processes_naming(str(base)) == [], output
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        for pid, was in started.items():
            if was and identity(pid) == was:
                os.kill(pid, signal.SIGKILL)

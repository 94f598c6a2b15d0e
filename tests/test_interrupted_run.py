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
    marker, base = tmp_path / "running", tmp_path / "basetemp"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAFTQ_INTERRUPT_MARKER": str(marker)}
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(base),
                            "tests/interrupted_run.py"], cwd=REPO, env=env, start_new_session=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = {}
    try:
        wait_until(lambda: marker.exists() or run.poll() is not None, 120, what="the child run's processes")
        assert run.poll() is None, run.communicate()[0]
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
        output = run.communicate(timeout=120)[0]
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

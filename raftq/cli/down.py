"""`raftq down`: stop a local cluster from any terminal, and `raftq up --detach`.

A cluster `raftq up` runs is found through its directory (`--data-dir`, as
`up` was given it): `up.pid` names the `raftq up` that runs it, and one pid
file per node names each node it started. `down` stops `raftq up` first
(SIGTERM: it stops its nodes, those it adopted too, as on Ctrl-C; stopped
nodes would otherwise be started again), then any node of the cluster still
running (a pid file's, or a `raftq node` of its cluster.toml holding its Raft
port: one started by hand, or left by an `up` that was killed). Each PID is
checked against its process's command line first: a pid file outlives its
process, and a PID is used again.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..local import LocalCluster, command_line, pid_alive, signal_pid

READY_LINE = "Ctrl-C stops the cluster"     # what `raftq up` prints once its cluster serves


def runs_up_of(pid: int, root: Path) -> bool:
    """Whether `pid` is a `raftq up` whose data directory is `root`."""
    words = command_line(pid).split()
    if "up" not in words:
        return False
    data_dir = ".raftq"
    for i, word in enumerate(words):
        if word == "--data-dir" and i + 1 < len(words):
            data_dir = words[i + 1]
        elif word.startswith("--data-dir="):
            data_dir = word.partition("=")[2]
    try:
        return (Path(os.readlink(f"/proc/{pid}/cwd")) / data_dir).resolve() == root.resolve()
    except OSError:
        return False


def _stop(pid: int, timeout: float) -> bool:
    """SIGTERM, then SIGKILL after `timeout`; whether it stopped within it."""
    signal_pid(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            signal_pid(pid, signal.SIGKILL)
            return False
        time.sleep(0.1)
    return True


def down(data_dir: str, timeout: float) -> int:
    root = Path(data_dir).absolute()
    if not (root / "cluster.toml").exists():
        print(f"raftq down: no local cluster in {root} (no cluster.toml there); give the --data-dir "
              "`raftq up` was given, from the directory it ran in", file=sys.stderr)
        return 1
    cluster = LocalCluster.open(root)
    nodes = {}
    for node_id in cluster.ids:
        try:
            pid = int(cluster.pid_file(node_id).read_text())
        except (OSError, ValueError):
            pid = None
        if pid is None or not cluster.runs_node(pid, node_id):
            pid = cluster.node_started_by_hand(node_id)
        if pid is not None:
            nodes[node_id] = pid
    try:
        up_pid = int(cluster.up_pid_file.read_text())
    except (OSError, ValueError):
        up_pid = None
    stopped = []
    up_runs = up_pid is not None and runs_up_of(up_pid, root)
    if up_runs:
        # `up` stops its nodes within 15 s each way (they hand over, then flush), and the adopted ones after them
        clean = _stop(up_pid, 2 * timeout + 5)
        stopped.append(f"raftq up (pid {up_pid})" + ("" if clean else ", killed: it did not stop in time"))
    for node_id, pid in nodes.items():
        if pid_alive(pid) and cluster.runs_node(pid, node_id):
            clean = _stop(pid, timeout)
            stopped.append(f"node {node_id} (pid {pid})" + ("" if clean else ", killed: it did not stop in time"))
        elif up_runs:
            stopped.append(f"node {node_id} (pid {pid}, by raftq up)")
        cluster.pid_file(node_id).unlink(missing_ok=True)
    cluster.up_pid_file.unlink(missing_ok=True)
    if not stopped:
        print(f"raftq down: nothing of the cluster in {root} runs: no raftq up, no node")
        return 0
    print(f"raftq down: stopped the cluster in {root}: " + "; ".join(stopped))
    return 0


def detach(argv: list[str], data_dir: str) -> int:
    """`raftq up --detach`: `raftq up` in a session of its own (a closed terminal does not stop
    it), its output into the cluster's up.log; returns once the cluster serves, or `up` exited."""
    root = Path(data_dir).absolute()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_path = root / "up.log"
    with open(log_path, "ab") as log:
        start = log.tell()
        os.fchmod(log.fileno(), 0o600)
        child = subprocess.Popen([sys.executable, "-m", "raftq", "up", *argv], stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    while True:
        with open(log_path, "rb") as log:
            log.seek(start)
            said = log.read().decode(errors="replace")
        if READY_LINE in said:
            print(said[:said.index(READY_LINE)], end="")
            here = root == Path(".raftq").absolute()
            print(f"raftq up runs in the background (pid {child.pid}; its output goes to {log_path}); "
                  f"`raftq down{'' if here else f' --data-dir {root}'}` stops the cluster, from any terminal")
            return 0
        if child.poll() is not None:
            print(said, end="", file=sys.stderr)
            return child.returncode
        time.sleep(0.1)

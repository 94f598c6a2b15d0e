"""Local clusters of real node processes: what `raftq up` runs (its terminal
side is raftq/cli/up.py), and the harness that tests, benchmarks and the chaos
suite drive raftq through.

A cluster lives in one directory (mode 0700): cluster.toml (mode 0600, with a
generated cluster secret and generated admin, data and metrics tokens), one
data directory, one log file and one pid file per node (0600 too), and `up.pid` while a
`raftq up` runs it.  Running it again keeps its queues.  Every process is started here and
stopped here, by PID (`raftq down` finds them from the pid files, each checked against its
command line: `runs_node`).

Clients of a local cluster authenticate with ``LocalCluster.token`` (the
admin token, which every route accepts); ``client()`` passes it on.
"""

import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable

from raftq.engine import config as cluster_config
from .client import Client, RaftqError


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_handed_out: set[int] = set()


def free_ports(count: int, *, avoid: Iterable[int] = ()) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now, none in `avoid` and none
    this process handed out before.

    A port is free until its owner binds it. They are picked below the
    kernel's ephemeral range: every outgoing connection on the machine (and
    every bind to port 0) takes a port from that range, so a freed ephemeral
    port could be taken before its owner binds it; below it, only someone who
    names the port can.
    """
    avoid = set(avoid) | _handed_out
    low, high = 10000, _ephemeral_low()
    rng = random.SystemRandom()
    ports: list[int] = []
    for _ in range(100 * count):
        if len(ports) == count:
            break
        port = rng.randrange(low, high)
        if port in avoid or port in ports:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    if len(ports) < count:
        raise RuntimeError(f"found only {len(ports)} free ports of {count} between {low} and {high}")
    _handed_out.update(ports)
    return ports


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a node could bind the port now."""
    with socket.socket() as probe:
        # as the nodes bind: a port in TIME_WAIT is free, a listening one is not
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _open_private(path: Path, flags: int) -> int:
    """A descriptor of `path`, created or made mode 0600 whatever the umask: a
    node's log holds what it was asked (queue names, errors), and a copy of
    the directory keeps the modes."""
    fd = os.open(path, flags | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)
    return fd


# ---- processes, as /proc shows them: a pid file outlives its process, and a PID is used again
def port_holders(port: int) -> list[int]:
    """The PIDs with a socket listening on `port` (TCP, IPv4 or IPv6), as far as /proc lets
    this user see: other users' processes stay hidden."""
    inodes = set()
    for table_path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table_path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    holders = []
    for entry in Path("/proc").iterdir() if inodes else ():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                holders.append(int(entry.name))
        except OSError:         # gone meanwhile, or not ours to look at
            continue
    return sorted(holders)


def command_line(pid: int) -> str:
    """A process's command line, its words joined by spaces ("?" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def pid_alive(pid: int) -> bool:
    """Whether the process runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class LocalCluster:
    def __init__(self, root: str | Path, cfg: cluster_config.ClusterConfig, *,
                 node_args: tuple[str, ...] = (), env: dict | None = None,
                 cafile: str | None = None):
        self.root = Path(root).resolve()
        self.cafile = cafile      # set when the nodes serve HTTPS
        self.cfg = cfg
        self.node_args = tuple(node_args)
        self.env = env
        self.procs: dict[str, subprocess.Popen] = {}
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)    # made by an older release, or by hand
        self.config_path = self.root / "cluster.toml"

    @classmethod
    def create(cls, root: str | Path, nodes: int = 3, *, http_port: int | None = None,
               raft_port: int | None = None, groups: int = 1, replicas: int | None = None,
               **kwargs) -> "LocalCluster":
        """A new cluster of `groups` Raft groups, each but group 0 with
        `replicas` members (None: the default, 3 at most); ports are picked
        free unless given (then consecutive)."""
        if http_port is None or raft_port is None:
            ports = free_ports(2 * nodes)
            https, rafts = ports[:nodes], ports[nodes:]
        else:
            https = [http_port + i for i in range(nodes)]
            rafts = [raft_port + i for i in range(nodes)]
        cfg = cluster_config.ClusterConfig(
            nodes=tuple(cluster_config.NodeSpec(id=f"n{i + 1}", raft=f"127.0.0.1:{rafts[i]}",
                                                http=f"127.0.0.1:{https[i]}") for i in range(nodes)),
            secret=cluster_config.new_secret(), tokens=cluster_config.Tokens.generate(),
            groups=groups, replicas=replicas)
        cluster = cls(root, cfg, **kwargs)
        cluster.write_config()
        return cluster

    @classmethod
    def open(cls, root: str | Path, **kwargs) -> "LocalCluster":
        """The cluster its cluster.toml describes, the file left as it is: an operator
        edits it by hand (SQS keys, comments), and every CLI command opens it."""
        return cls(root, cluster_config.load(Path(root) / "cluster.toml"), **kwargs)

    def write_config(self) -> None:
        cluster_config.write_private(self.config_path, self.cfg.to_toml())

    def secure(self) -> None:
        """Give a cluster made before secrets and tokens were the default both."""
        if self.cfg.secret is None or not self.cfg.tokens.any():
            self.cfg = dataclasses.replace(
                self.cfg, secret=self.cfg.secret or cluster_config.new_secret(),
                tokens=self.cfg.tokens if self.cfg.tokens.any() else cluster_config.Tokens.generate())
            self.write_config()

    @property
    def token(self) -> str | None:
        """The admin token: every route takes it."""
        return self.cfg.tokens.admin

    # ---- processes -------------------------------------------------------------
    @property
    def ids(self) -> list[str]:
        return [n.id for n in self.cfg.nodes]

    def url(self, node_id: str) -> str:
        scheme = "https" if self.cafile else "http"
        return f"{scheme}://{self.cfg.node(node_id).http}"

    @property
    def urls(self) -> list[str]:
        return [self.url(i) for i in self.ids]

    def log_path(self, node_id: str) -> Path:
        return self.root / f"{node_id}.log"

    def start(self, node_id: str | None = None, extra_args: tuple[str, ...] = ()) -> None:
        for nid in [node_id] if node_id else self.ids:
            if nid in self.procs and self.procs[nid].poll() is None:
                continue
            with os.fdopen(_open_private(self.log_path(nid), os.O_WRONLY | os.O_APPEND), "ab") as log:
                self.procs[nid] = subprocess.Popen(
                    [sys.executable, "-m", "raftq", "node", "--config", str(self.config_path),
                     "--id", nid, "--data-dir", str(self.root / nid), *self.node_args, *extra_args],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
            # So that whoever runs `raftq up` (a test, an operator, `raftq down`) can always
            # find and stop every node by PID, even if `up` itself is killed.
            cluster_config.write_private(self.pid_file(nid), str(self.procs[nid].pid))

    def pid_file(self, node_id: str) -> Path:
        return self.root / f"{node_id}.pid"

    @property
    def up_pid_file(self) -> Path:
        """Where a `raftq up` running this cluster writes its PID, for `raftq down`."""
        return self.root / "up.pid"

    def pid(self, node_id: str) -> int | None:
        proc = self.procs.get(node_id)
        return proc.pid if proc is not None and proc.poll() is None else None

    def running(self, node_id: str) -> bool:
        return self.pid(node_id) is not None

    def signal(self, node_id: str, sig: int) -> None:
        """Signal the whole node: its engine and its fronts (a node is one process group)."""
        proc = self.procs.get(node_id)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, sig)

    def kill(self, node_id: str) -> None:
        """kill -9 of every process of the node: no chance to flush or hand over."""
        proc = self.procs.pop(node_id, None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if proc is not None:
            proc.wait()
        self._forget_pid(node_id)

    def stop(self, node_id: str | None = None, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; SIGCONT first in case it is paused."""
        targets = {nid: self.procs.pop(nid) for nid in ([node_id] if node_id else list(self.procs))
                   if nid in self.procs}
        for proc in targets.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)   # the engine stops its fronts
        deadline = time.monotonic() + timeout
        for proc in targets.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for nid in targets:
            self._forget_pid(nid)

    def _forget_pid(self, node_id: str) -> None:
        self.pid_file(node_id).unlink(missing_ok=True)

    def runs_node(self, pid: int, node_id: str) -> bool:
        """Whether `pid` is a `raftq node` of this cluster.toml and id, by its command line."""
        words = command_line(pid).split()
        return ("node" in words and str(self.config_path) in words
                and "--id" in words and words[words.index("--id") + 1:][:1] == [node_id])

    def node_started_by_hand(self, node_id: str) -> int | None:
        """The PID of a `raftq node` of this cluster and id that holds the node's Raft port (its
        supervisor: the fronts hold the HTTP port), however it was started."""
        spec = self.cfg.node(node_id)
        return next((pid for pid in port_holders(int(spec.raft.rpartition(":")[2])) if self.runs_node(pid, node_id)),
                    None)

    def close(self) -> None:
        for nid in list(self.procs):
            self.kill(nid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- observation -------------------------------------------------------------
    def ready_view(self, node_id: str, timeout: float = 1.0, groups: bool = False) -> dict | None:
        """The node's /health/ready answer (with `groups`, each of its Raft
        groups' role, leader and term under "raft_groups"); None when it does
        not answer, or when a process other than the one started here answers
        on its port (an orphan)."""
        try:
            with Client(self.url(node_id), retry_for=0, timeout=timeout, token=self.token,
                        cafile=self.cafile) as client:
                view = client.ready(groups=groups)
        except (OSError, RaftqError, ValueError):
            return None
        ours = self.procs.get(node_id)
        if ours is not None and view.get("pid") not in (None, ours.pid):
            return None
        return view

    def ports_in_use(self) -> list[str]:
        """The nodes' addresses that some process already listens on."""
        return [address for nid in self.ids for address in self.ports_in_use_by(nid)]

    def ports_in_use_by(self, node_id: str) -> list[str]:
        """The node's HTTP and Raft addresses that some process already listens on."""
        spec = self.cfg.node(node_id)
        return [address for address in (spec.http, spec.raft)
                if not port_free(int(address.rpartition(":")[2]), address.rpartition(":")[0])]

    def wait_for_leader(self, timeout: float = 30.0, among: list[str] | None = None) -> str | None:
        """The leader's id once a running node reports one with a quorum."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for nid in among or self.ids:
                if not self.running(nid):
                    continue
                view = self.ready_view(nid)
                if view and view.get("ready") and view.get("role") == "leader":
                    return nid
            time.sleep(0.05)
        return None

    def wait_all_ready(self, timeout: float = 30.0) -> bool:
        """Every running node serves HTTP and follows a leader with a quorum."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            views = [self.ready_view(nid) for nid in self.ids if self.running(nid)]
            if views and all(v and v.get("ready") for v in views):
                return True
            time.sleep(0.05)
        return False

    def client(self, **kwargs) -> Client:
        return Client(self.urls, token=self.token, cafile=self.cafile, **kwargs)

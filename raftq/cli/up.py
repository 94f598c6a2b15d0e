"""`raftq up`: a local cluster in the foreground, and what it tells the terminal.

It creates or reopens the cluster (`raftq.local.LocalCluster`), starts every
node, prints where each one is and how to reach it (never a token or the
secret), keeps the nodes running while it runs (`Supervisor`) and stops them
all on Ctrl-C, SIGTERM or SIGHUP.
"""

import os
import signal
import sys
import time
from pathlib import Path

from raftq.engine.config import MAX_GROUPS, ConfigError, default_groups, write_private

from ..local import LocalCluster, command_line, pid_alive, port_holders, signal_pid
from ..server import REMOVED_EXIT
from .sqs import add_key, export_lines


def demo(cluster: LocalCluster) -> None:
    with cluster.client() as client:
        put = client.put("demo", {"hello": "raftq"})
        _say(f"  put      demo  -> seq {put['messages'][0]['seq']}")
        got = client.receive("demo", max=1, wait_ms=1000)["messages"]
        if got:
            msg = got[0]
            _say(f"  receive  demo  -> seq {msg['seq']} body {msg['body']} receipt {msg['receipt']}")
            _say(f"  ack      demo  -> {client.ack('demo', [msg['receipt']])}")
        stats = client.queue("demo")["stats"]
        _say(f"  queue    demo  -> depth {stats['depth']}, put_total {stats['put_total']}, "
             f"acked_total {stats['acked_total']}")


def sqs_keys(cluster: LocalCluster) -> dict:
    """An admin and a data key of the SQS API, kept by the cluster, each in a 0600 file of shell
    lines beside cluster.toml (sqs-admin.env, sqs-data.env): those of an earlier `raftq up --sqs`
    while the cluster still has them, else new ones. role -> its file."""
    files = {role: cluster.root / f"sqs-{role}.env" for role in ("admin", "data")}
    with cluster.client() as client:
        kept = {k["access_key"] for k in client.sqs_keys()["keys"]}
        for role, path in files.items():
            written = path.read_text() if path.exists() else ""
            if any(line == f"export AWS_ACCESS_KEY_ID={key}" for key in kept for line in written.splitlines()):
                continue
            key = add_key(client, role, cluster.urls, cluster.token, cluster.cafile)
            write_private(path, export_lines(key, cluster.urls[0]) + "\n")
    return files


def sqs_banner(cluster: LocalCluster, files: dict | None) -> list[str]:
    """Whether the SQS API is on, where, and where its keys are: never a secret, unless to a terminal."""
    if files is None:
        with cluster.client() as client:
            count = len(client.sqs_keys()["keys"])
        if not count:
            return ["  sqs:     off: no keys (raftq up --sqs makes an admin and a data key; raftq sqs key add one)"]
        return [f"  sqs:     on at {cluster.urls[0]} (any node), {count} keys (raftq sqs key list)"]
    lines = [f"  sqs:     on at {cluster.urls[0]} (any node); an admin and a data key in {files['admin']} and "
             f"{files['data']} (mode 0600):",
             f"           . {files['admin']} && aws sqs create-queue --queue-name jobs"]
    if sys.stdout.isatty():
        lines += ["  the data key, to paste:"] + ["    " + line for line in files["data"].read_text().splitlines()]
    return lines


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(Exception):
    """A stop signal reached `raftq up`."""


def _stop_on_signal(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def _say(text: str, err: bool = False) -> None:
    # After SIGHUP the terminal is gone: writing to it fails, stopping must not.
    try:
        print(text, file=sys.stderr if err else sys.stdout, flush=True)
    except OSError:
        pass


def _who_holds(address: str) -> str:
    """An address in use, and the processes listening on it (a node's engine and its fronts share one)."""
    holders = port_holders(int(address.rpartition(":")[2]))
    if not holders:
        return f"{address} (by a process this user cannot see)"
    return f"{address} (" + "; ".join(f"pid {pid}: {command_line(pid)[:200]}" for pid in holders) + ")"


def _ports_taken_message(taken: list[str]) -> str:
    return (f"raftq up: ports already in use: {', '.join(_who_holds(a) for a in taken)}\n"
            "  nodes an earlier `raftq up` or a hand-started `raftq node` left: stop each with kill <pid> "
            "of the process on its Raft port, its engine, which stops its fronts")


class Supervisor:
    """What `raftq up` does about its nodes while it runs.

    A node it started that exits is started again, after 1 s and then after
    twice as long each time it exits again within a minute of starting (at most
    30 s): a node that crashes at once is not restarted in a tight loop, and
    once it has exited six times in a row, each within a minute of starting,
    it is left down. A node someone started by
    hand in its place (a `raftq node` of this cluster.toml and this id, seen on
    the node's HTTP port) is adopted instead: Ctrl-C stops it with the others.
    """

    QUICK_EXIT_S = 60.0
    FIRST_DELAY_S = 1.0
    MAX_DELAY_S = 30.0
    GIVE_UP_AFTER = 5

    def __init__(self, cluster: LocalCluster, restart: bool):
        self.cluster = cluster
        self.restart = restart
        self.started_at = {nid: time.monotonic() for nid in cluster.ids}
        self.quick_exits = dict.fromkeys(cluster.ids, 0)
        self.due: dict[str, float] = {}        # node id -> when to start it again
        self.adopted: dict[str, int] = {}      # node id -> pid of a node started by hand

    def check(self) -> None:
        now = time.monotonic()
        for nid in self.cluster.ids:
            if nid in self.adopted:
                if not pid_alive(self.adopted[nid]):
                    _say(f"node {nid} (pid {self.adopted[nid]}, started by hand) exited", err=True)
                    del self.adopted[nid]
                continue
            proc = self.cluster.procs.get(nid)
            if proc is not None and proc.poll() is not None:
                self.cluster.procs.pop(nid)
                self._exited(nid, proc.returncode, now)
            if nid not in self.cluster.procs:
                self._adopt_or_restart(nid, now)

    def _exited(self, nid: str, code: int, now: float) -> None:
        log = self.cluster.log_path(nid)
        self.quick_exits[nid] = self.quick_exits[nid] + 1 if now - self.started_at[nid] < self.QUICK_EXIT_S else 1
        if code == REMOVED_EXIT:
            _say(f"node {nid} stopped: the cluster removed it (`raftq cluster remove`); leaving it down. "
                 f"To bring it back, empty {self.cluster.root / nid}, `raftq cluster add` it and start it: "
                 f"{self.hand_start(nid)}", err=True)
        elif not self.restart:
            _say(f"node {nid} exited with {code}; see {log}. Restart it by hand: {self.hand_start(nid)}", err=True)
        elif self.quick_exits[nid] > self.GIVE_UP_AFTER:
            _say(f"node {nid} exited with {code}, the {self.quick_exits[nid]}th time in a row within "
                 f"{self.QUICK_EXIT_S:.0f} s of starting; leaving it down: see {log}", err=True)
        else:
            delay = min(self.MAX_DELAY_S, self.FIRST_DELAY_S * 2 ** (self.quick_exits[nid] - 1))
            self.due[nid] = now + delay
            _say(f"node {nid} exited with {code}; see {log}. Restarting it in {delay:g} s", err=True)

    def _adopt_or_restart(self, nid: str, now: float) -> None:
        by_hand = self.cluster.node_started_by_hand(nid)
        if by_hand is not None:
            self.adopted[nid] = by_hand
            self.due.pop(nid, None)
            _say(f"node {nid} runs again, started by hand (pid {by_hand}); Ctrl-C stops it with the others")
        elif self.due.get(nid, float("inf")) <= now:
            del self.due[nid]
            taken = self.cluster.ports_in_use_by(nid)
            if taken:
                _say(_ports_taken_message(taken) + f"\n  node {nid} stays down", err=True)
                return
            self.cluster.start(nid)
            self.started_at[nid] = now
            _say(f"node {nid} restarted (pid {self.cluster.pid(nid)})")

    def hand_start(self, nid: str) -> str:
        cluster = self.cluster
        return (f"raftq node --config {cluster.config_path} --id {nid} --data-dir {cluster.root / nid} "
                f">> {cluster.log_path(nid)} 2>&1 &")

    def stop_adopted(self, timeout: float = 15.0) -> None:
        """SIGTERM to each adopted node's engine (it stops its fronts), SIGKILL after `timeout`."""
        for pid in self.adopted.values():
            signal_pid(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(pid_alive(pid) for pid in self.adopted.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in self.adopted.values():
            if pid_alive(pid):
                signal_pid(pid, signal.SIGKILL)
        self.adopted.clear()


def _start(cluster: LocalCluster, timeout: float) -> str | None:
    """Start every node and wait until one of *these* processes leads; its id, or None."""
    cluster.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for nid in cluster.ids:
            proc = cluster.procs[nid]
            if proc.poll() is not None:
                _say(f"node {nid} exited with {proc.returncode} while starting; see {cluster.log_path(nid)}",
                     err=True)
                return None
        leader = cluster.wait_for_leader(0.2)
        if leader is not None:
            return leader
    _say(f"no leader was elected within {timeout:.0f} s; see the node logs in {cluster.root}", err=True)
    return None


def up(nodes: int, data_dir: str, http_port: int, raft_port: int, run_demo: bool, restart: bool,
       groups: int | None = None, replicas: int | None = None, sqs: bool = False) -> int:
    """`raftq up`: SIGINT, SIGTERM and SIGHUP (the terminal closed) all stop every node,
    those it started and those it adopted (Supervisor). It never prints a secret but to a
    terminal: its output is often redirected to a file that anyone may read. `groups` and
    `replicas` shape a new cluster (None: the defaults, engine/config.py); an
    existing one keeps its own. `sqs`: the cluster has an admin and a data SQS key."""
    root = Path(data_dir)
    if (root / "cluster.toml").exists():
        try:
            cluster = LocalCluster.open(root)
        except ConfigError as exc:
            print(f"raftq up: {exc}", file=sys.stderr)
            return 2
        if len(cluster.ids) != nodes:
            _say(f"{root / 'cluster.toml'} describes {len(cluster.ids)} nodes, not {nodes}; "
                 f"use --nodes {len(cluster.ids)} or another --data-dir", err=True)
            return 2
        for flag, asked, has in (("--groups", groups, cluster.cfg.groups),
                                 ("--replicas", replicas, cluster.cfg.replicas_per_group)):
            if asked is not None and asked != has:
                _say(f"{root / 'cluster.toml'} describes a cluster of {flag[2:]} {has}, fixed when it was "
                     f"made; leave out {flag} or use another --data-dir", err=True)
                return 2
        cluster.secure()
    else:
        if replicas is not None and not 1 <= replicas <= nodes:
            _say(f"--replicas must be from 1 to the nodes ({nodes})", err=True)
            return 2
        if groups is not None and not 1 <= groups <= MAX_GROUPS:
            _say(f"--groups must be from 1 to {MAX_GROUPS}", err=True)
            return 2
        cluster = LocalCluster.create(root, nodes, http_port=http_port, raft_port=raft_port,
                                      groups=groups if groups is not None else default_groups(len(os.sched_getaffinity(0))),
                                      replicas=replicas)
    taken = cluster.ports_in_use()
    if taken:
        _say(_ports_taken_message(taken), err=True)
        return 1
    previous = {sig: signal.signal(sig, _stop_on_signal) for sig in STOP_SIGNALS}
    supervisor = Supervisor(cluster, restart)
    write_private(cluster.up_pid_file, str(os.getpid()))       # for `raftq down`, from anywhere
    try:
        leader = _start(cluster, 30)
        if leader is None:
            return 1
        _say(f"raftq: {nodes}-node cluster up in {cluster.root} (leader {leader}"
             + (f"; {cluster.cfg.groups} Raft groups of {cluster.cfg.replicas_per_group} replicas)"
                if cluster.cfg.groups > 1 else ")"))
        for nid in cluster.ids:
            _say(f"  {nid}  {cluster.url(nid)}   pid {cluster.pid(nid)}   log {cluster.log_path(nid)}")
        _say(f"  console: {cluster.urls[0]}/ui   (it asks for the admin token: [auth] admin in cluster.toml)")
        _say(f"  auth:    the secret and the admin, data and metrics tokens are in {cluster.config_path} "
             "(mode 0600);\n           the raftq CLI finds them there, or give RAFTQ_TOKEN")
        _say("  try:     raftq cluster status      (finds this cluster through ./.raftq/cluster.toml)"
             if root.resolve() == Path(".raftq").resolve() else
             f"  try:     raftq --cluster-dir {cluster.root} cluster status")
        _say(f"           T=$(sed -n 's/^data = \"\\(.*\\)\"/\\1/p' {cluster.config_path})   # the data token")
        _say(f"           curl --location-trusted -H \"Authorization: Bearer $T\" "
             f"-XPOST {cluster.urls[0]}/v1/queues/jobs/messages -d '{{\"body\": \"hi\"}}'")
        for line in sqs_banner(cluster, sqs_keys(cluster) if sqs else None):
            _say(line)
        if run_demo:
            demo(cluster)
        _say("Ctrl-C stops the cluster (or, from another terminal, `raftq down`"
             + ("" if root.resolve() == Path(".raftq").resolve() else f" --data-dir {cluster.root}")
             + "); its data stays for the next run. A node that exits is "
             + ("restarted." if restart else "left down (--no-restart)."))
        while True:
            supervisor.check()
            time.sleep(0.2)
    except Stopped as stop:
        _say(f"{stop}: stopping the cluster ...")
    finally:
        # A second signal must not cut the stop short and orphan a node.
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        cluster.stop()
        supervisor.stop_adopted()
        cluster.up_pid_file.unlink(missing_ok=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _say("stopped.")
    return 0

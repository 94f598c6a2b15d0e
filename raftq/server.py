"""`raftq node`: one node — a supervisor, one engine process per Raft group
the node is a member of, and the front processes.

The process started as `raftq node` is the node's supervisor; its PID is the
node's. It binds the node's HTTP port (once per front) and its one Raft port,
makes a link (Unix socket pair) between every front and every local engine
and one hand-off socket per engine, and forks the engines
(``raftq.engine_process``) and the fronts (``raftq.front``) while it has no
other thread yet. Then it serves the Raft port (``raftq.raft_port``): each
connection goes to the engine of the group it names. With several groups,
group 0's engine tells it which groups group 0's record has this node hold
(docs/architecture.md, "Growing the cluster"), and it starts an engine for
a group newly named (in a fresh interpreter, linked to every front over its
control socket) and stops the engine of a group no longer named, whose
data it then removes.

SIGTERM and SIGINT shut the node down cleanly: every engine hands its
leadership over, then the fronts stop taking connections and answer or fail
what is in flight, then the engines flush their journals; exit 0. An engine
that stopped on a storage failure (a failed fsync: exit status
``RESTART_EXIT``) is started again, later each time it stops so again
within a minute of its start (``RESTART_FIRST_S`` doubling up to
``RESTART_MAX_S``), recovering from what is on disk and from its peers; the
fronts send its group's requests to other members meanwhile. Any other
child that dies on its own takes the node down with it (exit 1), so that
whatever restarts nodes restarts a whole node rather than leaving part of
it unserved; and every child dies with the supervisor (PR_SET_PDEATHSIG).
"""

import asyncio
import dataclasses
import functools
import gc
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson

from raftq.api.app import Settings
from raftq.engine.config import ClusterConfig, NodeSpec, write_private
from raftq.engine.lifetime import name_process, use_one_heap
from raftq.engine.node import group_data_dir
from raftq.engine.placement import Placement, for_cluster

from .engine_process import HANDED_OVER, RESTART_EXIT, run_engine, started_members
from .front import ADD_GROUP, DROP_GROUP, REMOVED_SIGNAL, front_message, run_front
from .raft_port import RaftPort, bind_raft

log = logging.getLogger(__name__)

FRONT_STOP_S = 20.0
# How long the engines have to hand their leadership over before the fronts are stopped anyway.
HAND_OVER_S = 5.0
# How long the engines have to close their journals once the fronts are gone.
ENGINE_STOP_S = 40.0
# The largest report of held groups group 0's engine sends (G - 1 groups of a few node ids).
HOLDINGS_MAX_BYTES = 1 << 20
# In a node's data directory: the group count it was made with.
GROUPS_FILE = "groups"
# An engine that stopped on a storage failure is started again after RESTART_FIRST_S, twice as
# long each time it stops so within RESTART_CALM_S of its start, at most RESTART_MAX_S.
RESTART_FIRST_S = 0.5
RESTART_MAX_S = 30.0
RESTART_CALM_S = 60.0
# A node stopped because the cluster removed it (api/removal.py) exits with this: systemd
# (RestartPreventExitStatus) and `raftq up` leave it down rather than start it again.
REMOVED_EXIT = 3


def bind_http(address: str, count: int) -> list[socket.socket]:
    """`count` listening sockets on one address (SO_REUSEPORT); OSError if it is taken."""
    host, _, port = address.rpartition(":")
    listeners = []
    try:
        for _ in range(count):
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host.strip("[]"), int(port)))
            sock.listen(1024)
            sock.setblocking(False)
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    return listeners


def held_at_start(cluster: ClusterConfig, node_id: str, data_dir: Path, placement: Placement, *,
                  joining: bool = False) -> dict[int, tuple]:
    """The groups whose engines the node starts with, each with its members.

    A node that ran before runs what it held (the groups whose engines
    started here: ``started_members``); group 0's record then says what it
    should hold (``engine.members.HeldGroupsReporter``). A new node starts
    with what the placement gives it: the cluster's first start, whose
    record is that placement; unless it is `joining` a running cluster,
    whose record gives it nothing yet (the replica mover, api/mover.py,
    moves replicas onto it)."""
    new = not (group_data_dir(data_dir, 0) / "raft").exists()
    if cluster.groups == 1 or new and not joining:
        return {group: placement.members(group) for group in placement.groups_of(node_id)}
    held = {0: placement.members(0)}
    for group in range(1, cluster.groups):
        members = started_members(data_dir, group)
        if members is not None:
            held[group] = members
    return held


def group_count_kept(data_dir: Path, groups: int) -> bool:
    """Whether `groups` is the group count this node's data was made with (recorded at its
    first start): a cluster's count is fixed when it is made, and a replica of group 0 run
    with another would apply the catalog's commands otherwise than the others do."""
    path = data_dir / GROUPS_FILE
    if not path.exists():
        write_private(path, f"{groups}\n")
        return True
    return int(path.read_text()) == groups


def run_node(cluster: ClusterConfig, node_id: str, data_dir: str, *, settings: Settings,
             tls: tuple[str, str] | None = None, auto_create: bool = True, workers: int = 1,
             joining: bool = False) -> int:
    """Run the node until it is told to stop; its exit status."""
    data_dir = Path(data_dir)
    spec = cluster.node(node_id)
    if not group_count_kept(data_dir, cluster.groups):
        log.error("node %s was made with %s Raft groups; cluster.toml now says %d. A cluster's group count is "
                  "fixed when it is made: restore the cluster.toml it was made with", node_id,
                  (data_dir / GROUPS_FILE).read_text().strip(), cluster.groups)
        return 1
    placement = for_cluster(cluster)
    held = held_at_start(cluster, node_id, data_dir, placement, joining=joining)
    groups = sorted(held)
    listeners = bind_http(spec.http, workers)
    try:
        raft_listener = bind_raft(spec.raft)
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    node_pid = os.getpid()
    name_process("raftq-node")
    use_one_heap()
    # links[group][worker]: (the engine's end, the front's end)
    links = {group: [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in listeners] for group in groups}
    # handoffs[group]: (the supervisor's end, the engine's end)
    handoffs = {group: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for group in groups}
    # controls[worker]: (the supervisor's end, the front's end): engines started and stopped while the node runs
    controls = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in listeners]
    # group 0's engine tells the supervisor which groups group 0's record has this node hold
    holdings = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if cluster.groups > 1 else None
    every = [*listeners, raft_listener, *(end for pairs in links.values() for pair in pairs for end in pair),
             *(end for pair in handoffs.values() for end in pair), *(end for pair in controls for end in pair),
             *(holdings or ())]
    engines: dict[int, int] = {}          # pid -> group
    for group in groups:
        engine_links = [pair[0] for pair in links[group]]
        reporting = {"holdings": holdings[1]} if holdings is not None and group == 0 else {}
        engines[_fork(every, keep=[handoffs[group][1], *engine_links, *reporting.values()], body=functools.partial(
            run_engine, node_pid=node_pid, cluster=cluster, node_id=node_id, group=group,
            members=held[group], data_dir=data_dir, handoff=handoffs[group][1], links=engine_links,
            settings=settings, auto_create=auto_create, **reporting))] = group
    fronts: dict[int, int] = {}           # pid -> worker
    for worker, listener in enumerate(listeners):
        front_links = {group: links[group][worker][1] for group in groups}
        fronts[_fork(every, keep=[listener, controls[worker][1], *front_links.values()], body=functools.partial(
            run_front, worker=worker, listener=listener, links=front_links, control=controls[worker][1],
            placement=placement, node_id=node_id, data_dir=data_dir, settings=settings, tls=tls,
            auto_create=auto_create, node_pid=node_pid))] = worker
    kept = [raft_listener, *(pair[0] for pair in handoffs.values()), *(pair[0] for pair in controls),
            *(holdings[:1] if holdings else ())]
    for sock in every:
        if not any(sock is end for end in kept):
            sock.close()
    log.info("node %s: %d front(s) serving HTTP on %s; Raft on %s for groups %s",
             node_id, workers, spec.http, spec.raft, ", ".join(map(str, groups)))
    supervisor = Supervisor(raft_listener, {group: pair[0] for group, pair in handoffs.items()}, engines, fronts,
                            controls=[pair[0] for pair in controls], holdings=holdings[0] if holdings else None,
                            members=held,
                            engine_args=dict(node_pid=node_pid, cluster=cluster, node_id=node_id, data_dir=data_dir,
                                             settings=settings, auto_create=auto_create))
    return asyncio.run(supervisor.run())


def _fork(every: list[socket.socket], *, keep: list[socket.socket], body) -> int:
    """Fork a child that keeps only `keep` of the sockets in `every` and runs `body`.

    The supervisor's objects are frozen first (``gc.freeze``): the child's
    garbage collections then never write to the objects it inherited, which
    would copy every page they lie in (some 10 MB a child, the whole imported
    code), and its memory stays shared with the supervisor's."""
    sys.stderr.flush()
    gc.freeze()
    pid = os.fork()
    if pid == 0:
        for sock in every:
            if not any(sock is kept for kept in keep):
                sock.close()
        os._exit(body())
    return pid


class Supervisor:
    """The node's processes once they run: the Raft port, the children, and
    the engines of groups started and stopped as group 0's record says."""

    def __init__(self, raft_listener: socket.socket, handoffs: dict[int, socket.socket], engines: dict[int, int],
                 fronts: dict[int, int], *, controls: list[socket.socket], holdings: socket.socket | None,
                 members: dict[int, tuple[str, ...]], engine_args: dict):
        self._raft_listener = raft_listener
        self._handoffs = handoffs         # the Raft port's table: it hands each group's connections there
        self._engines = engines           # pid -> group
        self._fronts = fronts             # pid -> worker
        self._controls = controls
        self._holdings = holdings
        self._engine_args = engine_args
        self._children = {**{pid: f"group {group}'s engine" for pid, group in engines.items()},
                          **{pid: f"front {worker}" for pid, worker in fronts.items()}}
        self._started: dict[int, subprocess.Popen] = {}   # engines started while the node runs, by pid
        self._retiring: set[int] = set()                  # pids of engines being stopped on the record's word
        self._members = dict(members)     # group -> the members its engine runs with here
        self._restarts: dict[int, tuple[int, float]] = {}  # group -> (restarts in a row, when it last started)
        self._restarting: set[int] = set()                 # groups whose engine waits to be started again
        self._stopping = False
        self._exited: dict[int, int] = {}
        self._child_exited = asyncio.Event()
        self._wanted: dict[int, tuple[str, ...]] | None = None
        self._addresses: dict[str, list] = {}   # the wanted groups' members' [Raft, HTTP] addresses
        self._wanted_changed = asyncio.Event()

    def _reap(self) -> None:
        for pid in self._children:
            if pid not in self._exited:
                status = _exit_status(pid)
                if status is not None:
                    self._exited[pid] = status
                    if pid in self._retiring:
                        continue
                    if pid in self._engines and not self._stopping and status > 0 \
                            and os.WIFEXITED(status) and os.WEXITSTATUS(status) == RESTART_EXIT:
                        asyncio.get_running_loop().create_task(self._restart_engine(pid))
                    else:
                        self._child_exited.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        removed = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        loop.add_signal_handler(REMOVED_SIGNAL, lambda: (removed.set(), stopping.set()))
        loop.add_signal_handler(signal.SIGCHLD, self._reap)
        self._reap()                      # one may have died before the handler was in place
        port = RaftPort(self._raft_listener, self._handoffs)
        port.start()
        tasks = []
        if self._holdings is not None:
            self._holdings.setblocking(False)
            loop.add_reader(self._holdings.fileno(), self._read_holdings)
            tasks.append(asyncio.create_task(self._follow_record()))
        status = 0
        await asyncio.wait([asyncio.create_task(stopping.wait()), asyncio.create_task(self._child_exited.wait()),
                            *tasks], return_when=asyncio.FIRST_COMPLETED)
        self._stopping = True
        started = time.monotonic()
        for task in tasks:
            if task.done():
                log.error("following group 0's record failed; stopping the node", exc_info=task.exception())
                status = 1
            task.cancel()
        if not stopping.is_set():
            for pid, code in self._exited.items():
                if pid not in self._retiring and pid in self._children:
                    log.error("%s (pid %d) ended (%s); stopping the node", self._children[pid], pid,
                              _describe(code))
            status = 1
        log.info("shutting down")
        engines = {pid: group for pid, group in self._engines.items() if pid not in self._exited}
        for pid in engines:
            _signal(pid, signal.SIGTERM)
        await _handed_over(self._handoffs, engines, self._exited)
        port.close()
        for pid in self._fronts:
            _signal(pid, signal.SIGTERM)  # they stop accepting; in-flight requests finish or fail
        await _wait_exited(list(self._fronts), self._exited, FRONT_STOP_S)
        await _wait_exited(list(engines), self._exited, ENGINE_STOP_S)   # links closed: they close their journals
        for pid in self._children:
            _reap(pid, signal.SIGKILL)
        log.info("stopped in %.2fs", time.monotonic() - started)
        return REMOVED_EXIT if removed.is_set() else status

    def _read_holdings(self) -> None:
        try:
            message = self._holdings.recv(HOLDINGS_MAX_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        if not message:                   # group 0's engine is gone, and the node with it
            asyncio.get_running_loop().remove_reader(self._holdings.fileno())
            return
        report = orjson.loads(message)
        self._wanted = {int(group): tuple(members) for group, members in report["groups"].items()}
        self._addresses = report["addresses"]
        self._wanted_changed.set()

    async def _follow_record(self) -> None:
        """Start and stop engines until the node runs the groups group 0's record has it hold."""
        while True:
            await self._wanted_changed.wait()
            self._wanted_changed.clear()
            wanted = self._wanted
            running = {group for pid, group in self._engines.items() if group > 0 and pid not in self._exited}
            for group in sorted(running - set(wanted)):
                await self._stop_group(group)
            for group in sorted(set(wanted) - running - self._restarting):
                self._start_group(group, wanted[group])

    async def _restart_engine(self, pid: int) -> None:
        """Start again the engine `pid` was, which stopped on a storage failure: its fronts drop
        its link, and after a pause that grows while it keeps stopping so, it starts afresh
        from what its data directory holds."""
        group = self._engines.pop(pid)
        self._restarting.add(group)
        del self._children[pid]
        self._exited.pop(pid, None)
        self._started.pop(pid, None)
        self._handoffs.pop(group).close()
        for control in self._controls:
            control.send(front_message(DROP_GROUP, group))
        now = time.monotonic()
        in_a_row, last_start = self._restarts.get(group, (0, now))
        in_a_row = 0 if now - last_start > RESTART_CALM_S else in_a_row
        pause = min(RESTART_MAX_S, RESTART_FIRST_S * 2 ** in_a_row)
        log.error("group %d's engine (pid %d) stopped on a storage failure; starting it again in %.1f s",
                  group, pid, pause)
        await asyncio.sleep(pause)
        self._restarting.discard(group)
        if self._stopping:
            return
        if group > 0 and self._wanted is not None and group not in self._wanted:
            # group 0's record moved the replica away meanwhile; its data goes with the next start
            log.info("group %d's engine is not started again: group 0's record no longer has this node hold it", group)
            return
        self._restarts[group] = (in_a_row + 1, time.monotonic())
        self._start_group(group, self._members[group])

    def _start_group(self, group: int, members: tuple[str, ...]) -> None:
        """Start `group`'s engine in a fresh interpreter (this process may have
        threads by now: no bare fork), linked to every front, and hand it the
        group's Raft connections from now on."""
        self._members[group] = members
        links = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in self._controls]
        handoff = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        passed = [handoff[1], *(pair[0] for pair in links)]
        arguments = {**self._engine_args, "cluster": self._with_joined(members), "group": group,
                     "members": members, "handoff": handoff[1].fileno(),
                     "links": [pair[0].fileno() for pair in links], "log_level": logging.getLogger().level}
        if group == 0 and self._holdings is not None:
            # group 0's engine reports the groups the node should hold over a socket of its own
            holdings = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            loop = asyncio.get_running_loop()
            loop.remove_reader(self._holdings.fileno())
            self._holdings.close()
            self._holdings = holdings[0]
            self._holdings.setblocking(False)
            loop.add_reader(self._holdings.fileno(), self._read_holdings)
            passed.append(holdings[1])
            arguments["holdings"] = holdings[1].fileno()
        process = subprocess.Popen([sys.executable, "-m", "raftq.engine_process"], stdin=subprocess.PIPE,
                                   pass_fds=[sock.fileno() for sock in passed])
        process.stdin.write(pickle.dumps(arguments))
        process.stdin.close()
        for sock in passed:
            sock.close()
        self._started[process.pid] = process
        self._engines[process.pid] = group
        self._children[process.pid] = f"group {group}'s engine"
        self._reap()                      # it may have died already, before it was counted
        handoff[0].setblocking(False)
        self._handoffs[group] = handoff[0]
        for control, (_, front_end) in zip(self._controls, links):
            socket.send_fds(control, [front_message(ADD_GROUP, group)], [front_end.fileno()])
            front_end.close()
        log.info("group %d: engine started (pid %d) with %s, as group 0's record says", group, process.pid,
                 ", ".join(members))

    def _with_joined(self, members: tuple[str, ...]) -> ClusterConfig:
        """The cluster config with the members that joined after it was written (``raftq
        cluster add``), at the addresses group 0 knows them by."""
        cluster = self._engine_args["cluster"]
        known = {spec.id for spec in cluster.nodes}
        joined = tuple(NodeSpec(id=node_id, raft=self._addresses[node_id][0], http=self._addresses[node_id][1])
                       for node_id in members if node_id not in known and node_id in self._addresses)
        return dataclasses.replace(cluster, nodes=cluster.nodes + joined) if joined else cluster

    async def _stop_group(self, group: int) -> None:
        """Stop `group`'s engine, which group 0's record no longer has this node
        hold: it hands its leadership over, the fronts drop their links, it
        closes its journal; then its data goes."""
        pid = next(pid for pid, g in self._engines.items() if g == group and pid not in self._exited)
        self._retiring.add(pid)
        _signal(pid, signal.SIGTERM)
        await _handed_over(self._handoffs, {pid: group}, self._exited)
        self._handoffs.pop(group).close()
        for control in self._controls:
            control.send(front_message(DROP_GROUP, group))
        await _wait_exited([pid], self._exited, ENGINE_STOP_S)
        _reap(pid, signal.SIGKILL)
        self._started.pop(pid, None)
        del self._engines[pid], self._children[pid]
        self._exited.pop(pid, None)
        self._retiring.discard(pid)
        shutil.rmtree(group_data_dir(self._engine_args["data_dir"], group), ignore_errors=True)
        log.info("group %d: engine stopped and its data removed, as group 0's record says", group)


async def _handed_over(handoffs: dict[int, socket.socket], engines: dict[int, int], exited: dict[int, int]) -> None:
    """Wait until every engine still running said it handed its leadership over."""
    waiting = {group: handoffs[group] for pid, group in engines.items() if pid not in exited and group in handoffs}
    deadline = time.monotonic() + HAND_OVER_S
    while waiting and time.monotonic() < deadline:
        for group, sock in list(waiting.items()):
            try:
                said = sock.recv(1)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                said = b""
            if said in (HANDED_OVER, b""):
                del waiting[group]
        if any(pid not in exited for pid, group in engines.items() if group in waiting):
            await asyncio.sleep(0.01)
        else:
            return


async def _wait_exited(pids: list[int], exited: dict[int, int], within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(pid not in exited for pid in pids):
        await asyncio.sleep(0.02)


def _exit_status(pid: int) -> int | None:
    """The child's wait status once it has exited (reaping it), else None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return -1
    return status if done else None


def _describe(status: int) -> str:
    if status < 0:
        return "already reaped"
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int, sig: int) -> None:
    if _exit_status(pid) is None:
        _signal(pid, sig)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

"""`raftq node`: one node — a supervisor, one engine process per Raft group
the node is a member of, and the front processes.

The process started as `raftq node` is the node's supervisor; its PID is the
node's. It binds the node's HTTP port (once per front) and its one Raft port,
makes a link (Unix socket pair) between every front and every local engine
and one hand-off socket per engine, and forks the engines
(``raftq.engine_process``) and the fronts (``raftq.front``) while it has no
other thread yet. Then it serves the Raft port (``raftq.raft_port``): each
connection goes to the engine of the group it names.

SIGTERM and SIGINT shut the node down cleanly: every engine hands its
leadership over, then the fronts stop taking connections and answer or fail
what is in flight, then the engines flush their journals; exit 0. Any child
that dies on its own takes the node down with it (exit 1), so that whatever
restarts nodes restarts a whole node rather than leaving part of it
unserved; and every child dies with the supervisor (PR_SET_PDEATHSIG).
"""

import asyncio
import functools
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

from api.app import Settings
from engine.config import ClusterConfig
from engine.lifetime import name_process
from engine.placement import for_cluster

from .engine_process import HANDED_OVER, run_engine
from .front import run_front
from .raft_port import RaftPort, bind_raft

log = logging.getLogger(__name__)

FRONT_STOP_S = 20.0
# How long the engines have to hand their leadership over before the fronts are stopped anyway.
HAND_OVER_S = 5.0
# How long the engines have to close their journals once the fronts are gone.
ENGINE_STOP_S = 40.0


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


def run_node(cluster: ClusterConfig, node_id: str, data_dir: str, *, settings: Settings,
             tls: tuple[str, str] | None = None, auto_create: bool = True, workers: int = 1) -> int:
    """Run the node until it is told to stop; its exit status."""
    data_dir = Path(data_dir)
    spec = cluster.node(node_id)
    placement = for_cluster(cluster)
    groups = placement.groups_of(node_id)
    listeners = bind_http(spec.http, workers)
    try:
        raft_listener = bind_raft(spec.raft)
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    node_pid = os.getpid()
    name_process("raftq-node")
    # links[group][worker]: (the engine's end, the front's end)
    links = {group: [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in listeners] for group in groups}
    # handoffs[group]: (the supervisor's end, the engine's end)
    handoffs = {group: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for group in groups}
    every = [*listeners, raft_listener, *(end for pairs in links.values() for pair in pairs for end in pair),
             *(end for pair in handoffs.values() for end in pair)]
    engines: dict[int, int] = {}          # pid -> group
    for group in groups:
        engine_links = [pair[0] for pair in links[group]]
        engines[_fork(every, keep=[handoffs[group][1], *engine_links], body=functools.partial(
            run_engine, node_pid=node_pid, cluster=cluster, node_id=node_id, group=group,
            members=placement.members(group), data_dir=data_dir, handoff=handoffs[group][1], links=engine_links,
            settings=settings, auto_create=auto_create))] = group
    fronts: dict[int, int] = {}           # pid -> worker
    for worker, listener in enumerate(listeners):
        front_links = {group: links[group][worker][1] for group in groups}
        fronts[_fork(every, keep=[listener, *front_links.values()], body=functools.partial(
            run_front, worker=worker, listener=listener, links=front_links, placement=placement, node_id=node_id,
            data_dir=data_dir, settings=settings, tls=tls, auto_create=auto_create, node_pid=node_pid))] = worker
    supervisor_ends = {group: pair[0] for group, pair in handoffs.items()}
    for sock in every:
        if sock is not raft_listener and not any(sock is end for end in supervisor_ends.values()):
            sock.close()
    log.info("node %s: %d front(s) serving HTTP on %s; Raft on %s for groups %s",
             node_id, workers, spec.http, spec.raft, ", ".join(map(str, groups)))
    return asyncio.run(_supervise(raft_listener, supervisor_ends, engines, fronts))


def _fork(every: list[socket.socket], *, keep: list[socket.socket], body) -> int:
    """Fork a child that keeps only `keep` of the sockets in `every` and runs `body`."""
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for sock in every:
            if not any(sock is kept for kept in keep):
                sock.close()
        os._exit(body())
    return pid


async def _supervise(raft_listener: socket.socket, handoffs: dict[int, socket.socket],
                     engines: dict[int, int], fronts: dict[int, int]) -> int:
    children = {**{pid: f"group {group}'s engine" for pid, group in engines.items()},
                **{pid: f"front {worker}" for pid, worker in fronts.items()}}
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    exited: dict[int, int] = {}
    child_exited = asyncio.Event()

    def reap() -> None:
        for pid in children:
            if pid not in exited:
                status = _exit_status(pid)
                if status is not None:
                    exited[pid] = status
                    child_exited.set()
    loop.add_signal_handler(signal.SIGCHLD, reap)
    reap()                                # one may have died before the handler was in place
    port = RaftPort(raft_listener, handoffs)
    port.start()
    status = 0
    await asyncio.wait([asyncio.create_task(stopping.wait()), asyncio.create_task(child_exited.wait())],
                       return_when=asyncio.FIRST_COMPLETED)
    started = time.monotonic()
    if not stopping.is_set():
        for pid, code in exited.items():
            log.error("%s (pid %d) ended (%s); stopping the node", children[pid], pid, _describe(code))
        status = 1
    log.info("shutting down")
    for pid in engines:
        _signal(pid, signal.SIGTERM)
    await _handed_over(handoffs, engines, exited)
    port.close()
    for pid in fronts:
        _signal(pid, signal.SIGTERM)      # they stop accepting; in-flight requests finish or fail
    await _wait_exited(list(fronts), exited, FRONT_STOP_S)
    await _wait_exited(list(engines), exited, ENGINE_STOP_S)   # their links closed: they close their journals
    for pid in children:
        _reap(pid, signal.SIGKILL)
    log.info("stopped in %.2fs", time.monotonic() - started)
    return status


async def _handed_over(handoffs: dict[int, socket.socket], engines: dict[int, int], exited: dict[int, int]) -> None:
    """Wait until every engine still running said it handed its leadership over."""
    waiting = {group: handoffs[group] for pid, group in engines.items() if pid not in exited}
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

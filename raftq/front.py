"""A front process of a node: the HTTP API, the streaming wire, long polls,
metrics and the put buffer, over the engine's face (``engine.link.remote``).

A node runs one or more fronts (``raftq node --workers``), forked by the
node's supervisor (``raftq.server``) before any thread exists; each front
serves its own listening socket on the node's HTTP port (SO_REUSEPORT: the
kernel spreads connections over them) and holds one link to each of the
node's engines, one per Raft group (``ENGINES`` in ``api.keys``), which
the supervisor adds and drops over the front's control socket as group 0's
record starts and stops engines while the node runs.  Their
CPU — parsing, JSON, rendering metrics, thousands of waiting connections —
is spent outside the interpreters that send Raft's heartbeats, and yields
to them: a front runs ``FRONT_NICENESS`` below its node's engines, so that
on a machine whose cores clients keep busy a heartbeat waits less for one
(tests/test_saturation.py).  A front
lives only as long as the node: an engine whose link closes is dropped
(its group's requests go to another member until the supervisor starts it
again, or stops the node), and the kernel kills it if the supervisor dies
(PR_SET_PDEATHSIG), so a killed node never leaves a port half served.
"""

import asyncio
import logging
import os
import signal
import socket
import ssl
import struct
from pathlib import Path

from aiohttp import web

from raftq.api.app import Settings, make_app
from raftq.api.features import feature_gates
from raftq.api.mover import LeaderPreferences, ReplicaMover
from raftq.api.releaser import NameReleaser
from raftq.api.removal import RemovalWatch
from raftq.engine.lifetime import FreeMemoryGiver, die_with, name_process
from raftq.engine.link.remote import RemoteNode
from raftq.engine.placement import Placement
from raftq.engine.storage import records

log = logging.getLogger(__name__)

# The supervisor's messages on a front's control socket: link to a group's
# engine started while the node runs (the link's end comes with it), or drop it.
ADD_GROUP = b"a"
DROP_GROUP = b"d"
# What the first front sends the supervisor once the cluster has removed this node (api/removal.py).
REMOVED_SIGNAL = signal.SIGUSR1
# How much lower than the engines a front runs (os.nice): with every core busy, the kernel gives an
# engine about three times a front's share, so a client's flood of requests, which costs the fronts,
# delays the heartbeats less. Idle, it changes nothing; a front waiting on its engine loses nothing.
FRONT_NICENESS = 5


def front_message(verb: bytes, group: int) -> bytes:
    return verb + struct.pack("!I", group)


def cap_connections(server: web.Server, limit: int) -> None:
    """Close any connection beyond `limit` as soon as it is made (aiohttp has no such cap)."""
    track = server.connection_made
    refused = [0]

    def connection_made(handler, transport) -> None:
        track(handler, transport)
        if len(server.connections) > limit:
            if not refused[0]:
                log.warning("more than %d HTTP connections (--max-connections); closing the excess", limit)
            refused[0] += 1
            transport.close()
    server.connection_made = connection_made


def buffer_dir(data_dir: Path, worker: int) -> Path:
    """Each front keeps its own put buffer: appends never contend across processes."""
    return data_dir / ("buffer" if worker == 0 else f"buffer-{worker}")


class Engines:
    """The front's links to the node's engines (``ENGINES``: group -> ``RemoteNode``), as the
    supervisor adds and drops them over `control` while the node runs. An engine whose link
    ends without the supervisor dropping it first is dropped here at once: the front sends
    that group's requests to another member meanwhile, and the supervisor either starts the
    engine again (one that stopped on a storage failure) or stops the node."""

    def __init__(self, control: socket.socket, **remote):
        self.by_group: dict[int, RemoteNode] = {}
        # Engines whose link ended, by group: the same object talks to the group's engine again
        # when the supervisor adds it anew (the application holds group 0's for good).
        self._unlinked: dict[int, RemoteNode] = {}
        self._control = control
        self._remote = remote
        self._tasks: set[asyncio.Task] = set()
        # the supervisor's messages, taken in the order sent: a group's drop never overtakes its add
        self._orders: asyncio.Queue = asyncio.Queue()

    async def add(self, group: int, link: socket.socket) -> None:
        engine = self._unlinked.pop(group, None) or RemoteNode(**self._remote)
        await engine.connect(link)
        self.by_group[group] = engine
        self._spawn(self._watch(group, engine))

    async def drop(self, group: int) -> None:
        engine = self.by_group.pop(group, None)
        if engine is not None:
            self._unlinked[group] = engine
            await engine.close()

    def follow_supervisor(self) -> None:
        self._control.setblocking(False)
        asyncio.get_running_loop().add_reader(self._control.fileno(), self._read_control)
        self._spawn(self._carry_out())

    async def _carry_out(self) -> None:
        while True:
            await (await self._orders.get())

    def _read_control(self) -> None:
        try:
            message, fds, _, _ = socket.recv_fds(self._control, 16, 1)
        except (BlockingIOError, InterruptedError):
            return
        if not message:                   # the supervisor is gone, and this process with it
            asyncio.get_running_loop().remove_reader(self._control.fileno())
            return
        verb, (group,) = message[:1], struct.unpack("!I", message[1:5])
        if verb == ADD_GROUP:
            self._orders.put_nowait(self.add(group, socket.socket(fileno=fds[0])))
        elif verb == DROP_GROUP:
            self._orders.put_nowait(self.drop(group))

    def _spawn(self, work) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, group: int, engine: RemoteNode) -> None:
        await engine.closed.wait()
        if self.by_group.get(group) is engine:
            log.error("group %d's engine is gone; its requests go to another member", group)
            self._unlinked[group] = self.by_group.pop(group)

    async def close(self) -> None:
        for engine in list(self.by_group.values()):
            await engine.close()


async def serve_front(*, worker: int, listener: socket.socket, links: dict[int, socket.socket],
                      control: socket.socket, placement: Placement, node_id: str, data_dir: Path,
                      settings: Settings, tls: tuple[str, str] | None, auto_create: bool, node_pid: int) -> None:
    linked = Engines(control, node_id=node_id, auto_create=auto_create, data_dir=data_dir, node_pid=node_pid)
    for group, link in links.items():
        await linked.add(group, link)
    engines = linked.by_group
    limits = settings.limits
    # aiohttp's keep-alive timer also runs from the moment a connection is
    # made, and closes it unless a request's headers are complete: the
    # header timeout, which is therefore the idle timeout as well.
    app = make_app(engines, placement, settings, buffer_dir(data_dir, worker), first_front=worker == 0)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=limits.header_timeout_s)
    # one of each per node, in its first front: the mover acts while the node's engine of group 0
    # leads, the name releaser for each group whose engine here leads; the feature gates let the
    # node's engines copy live bodies forward, and tick with the wall clock, once every node can
    # apply that
    movers = [ReplicaMover(app), LeaderPreferences(app), NameReleaser(app)] \
        if worker == 0 and len(placement.groups) > 1 else []
    if worker == 0:
        movers.append(RemovalWatch(app, on_removed=lambda disowned_by: _removed(node_id, disowned_by, node_pid)))
        movers.extend(feature_gates(app))
    giver = FreeMemoryGiver()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    try:
        await runner.setup()
        cap_connections(runner.server, limits.max_connections)
        ssl_context = None
        if tls:
            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(*tls)
        await web.SockSite(runner, listener, ssl_context=ssl_context).start()
        linked.follow_supervisor()
        for mover in movers:
            mover.start()
        giver.start()
        await stopping.wait()
        await runner.shutdown()           # stop accepting; in-flight requests finish or fail cleanly
    finally:
        giver.stop()
        for mover in movers:
            mover.stop()
        await runner.cleanup()
        await linked.close()


def _removed(node_id: str, disowned_by: list[str], node_pid: int) -> None:
    log.error("node %s is no longer a voter of the cluster: %s, a majority of the voters it knew, count it out "
              "(`raftq cluster remove`). Stopping the node. To bring it back: empty its data directory, "
              "`raftq cluster add` it and start it again", node_id, ", ".join(disowned_by))
    os.kill(node_pid, REMOVED_SIGNAL)


def run_front(**kwargs) -> int:
    """The body of a forked front process; its exit status."""
    # Ctrl-C reaches the whole process group; the supervisor decides how the node stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with(kwargs["node_pid"])
    name_process(f"raftq-front-{kwargs['worker']}")
    os.nice(FRONT_NICENESS)
    # its put buffer's sync failed: the front ends, and the node with it (raftq.server)
    records.on_fatal(lambda reason: os._exit(1))
    try:
        asyncio.run(serve_front(**kwargs))
    except Exception:
        log.exception("front %d failed", kwargs["worker"])
        return 1
    return 0

"""A full disk as a clear, bounded state (issue 47): the disk alarm, as RabbitMQ's.

Every front watches the free space of its node's data directory (``statvfs``,
every ``SAMPLE_S``) and, by ``GET /health/disk``, that of every other node. It
asks each other node to hold its answer until that node's alarm differs from
the one last heard, or ``HOLD_S`` has passed (``?alarm=...&wait_ms=...``): an
alarm reaches the other fronts as the node samples it, and an idle cluster
sends one request per pair of nodes every ``HOLD_S``, not one a second. A
node that does not hold (an older release) is asked every ``PEER_POLL_S``.
A node whose free bytes fall below its *watermark* is in disk alarm until
they rise a margin above it again:

    watermark = --disk-free-limit (default RESERVE_PER_GROUP for each Raft group the node holds)
                + the size of each of those groups' current snapshot

The reserve is what a node must still write while it refuses new data, so
that space can come back: its leaders' entries in flight when the alarm
began (4 of up to 17 MiB each, the largest entry one write makes), the
rewrite of a mostly dead kept segment (half of a 64 MiB segment), the
journal's next preallocation (4 MiB), and the receives, acks and deletes
that drain the queues. A snapshot is written beside the one it replaces
before that one goes, so each group's snapshot counts on top: the reserve
grows with the state.

While any member of a Raft group is in alarm, its leader's front refuses the
writes that bring new data to that group (``fills_disk``: puts, transactions
that put, stages, queue creation) with 507 ``insufficient_storage``, naming
the node and its free bytes, before anything reaches the log. A group's
entries land on every replica, so a follower in alarm counts too: it would
take them anyway and spend the reserve its own snapshots and compaction need
(a replica that cannot compact never frees space again), and replicas with
equal disks fill in step. Groups with no member in alarm go on (with one
Raft group, every node holds it: any node in alarm stops every write, as in
RabbitMQ). Anything that only frees space or moves it — receives, acks,
nacks, deletes, purges, redrive, queue and group changes, membership — is
never refused. A node that does not answer for ``PEER_FORGOTTEN_S`` is
counted out: it takes no writes while it is down anyway.

The first front logs one line each time its node enters or leaves the alarm.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import asdict, dataclass

from aiohttp import ClientError, ClientTimeout, web

from raftq.engine.background import Background

from .codec import respond
from .errors import ApiError
from .keys import DISK

log = logging.getLogger(__name__)

RESERVE_PER_GROUP = 128 << 20
SAMPLE_S = 0.25
PEER_POLL_S = 1.0
HOLD_S = 4.0
MAX_HOLD_MS = 10_000           # the longest hold a request may ask for
PEER_TIMEOUT = ClientTimeout(total=HOLD_S + 0.7)
# Longer than a held answer takes, with room for a busy machine: a peer that answers every HOLD_S
# is never forgotten between two answers.
PEER_FORGOTTEN_S = HOLD_S + 2.0
# The alarm ends once the free bytes are this share of the reserve above the watermark, so that a
# disk hovering at it does not switch writes on and off with every compaction.
CLEAR_MARGIN_DIVISOR = 16
RETRY_AFTER_S = "5"


@dataclass(frozen=True)
class DiskState:
    free_bytes: int
    capacity_bytes: int
    watermark_bytes: int
    alarm: bool

    def as_dict(self) -> dict:
        return asdict(self)


def fills_disk(command: dict) -> bool:
    """Whether a command brings new data to its group's disks (refused in disk alarm)."""
    op = command["op"]
    return op in ("put", "stage", "create_queue") or (op == "tx" and bool(command.get("put")))


class DiskWatch(Background):
    """This node's disk state, sampled, and the other nodes' as they last answered."""

    def __init__(self, groups, scheme: str, free_limit: int | None, *, logs: bool):
        """Over the front's `groups` (``api.groups.Groups``: the node's engines, each group's
        members); `scheme`: how nodes are asked; `free_limit`: --disk-free-limit (None:
        RESERVE_PER_GROUP per group held; 0: no alarm); `logs`: whether this front logs the
        node's changes of state (its first front does)."""
        self._groups = groups
        self._node = groups.catalog           # group 0's engine: every node's id and HTTP address
        self._scheme = scheme
        self._http = None                     # the front's client session, once it runs
        self._data_dir = str(self._node.data_dir)
        self._free_limit = free_limit
        self._logs = logs
        self._snapshot_bytes: dict[int, int] = {}     # group -> its snapshot's size here
        self._peers: dict[str, tuple[DiskState, float]] = {}   # node id -> (state, when it answered)
        self._askers: dict[str, tuple[str, asyncio.Task]] = {}   # node id -> (its address, the task asking it)
        # Set when this node's alarm changes (then replaced), or when the front stops: what held
        # answers wait for.
        self._alarm_changed = asyncio.Event()
        self._releasing = False
        self.own = DiskState(0, 0, 0, False)
        self.sample()

    # ---- this node --------------------------------------------------------------------
    def reserve(self) -> int:
        if self._free_limit is not None:
            return self._free_limit
        return RESERVE_PER_GROUP * len(self._groups.engines)

    def sample(self) -> DiskState:
        """This node's state now (and a log line if it changed)."""
        disk = os.statvfs(self._data_dir)
        free, capacity = disk.f_bavail * disk.f_frsize, disk.f_blocks * disk.f_frsize
        reserve = self.reserve()
        watermark = reserve + sum(self._snapshot_bytes.values()) if reserve else 0
        was = self.own.alarm
        alarm = free < watermark + (reserve // CLEAR_MARGIN_DIVISOR if was else 0)
        self.own = DiskState(free, capacity, watermark, alarm)
        if alarm != was:
            self._alarm_changed.set()
            self._alarm_changed = asyncio.Event()
        if alarm != was and self._logs:
            if alarm:
                log.warning("disk alarm: %d bytes free on %s, below the watermark of %d (a reserve of %d and the "
                            "snapshots' %d); writes to the Raft groups this node holds are refused until space "
                            "returns", free, self._data_dir, watermark, reserve, watermark - reserve)
            else:
                log.warning("disk alarm cleared: %d bytes free on %s (watermark %d); writes resume",
                            free, self._data_dir, watermark)
        return self.own

    @property
    def node_id(self) -> str:
        return self._node.id

    async def answer_after(self, alarm_seen: bool, seconds: float) -> None:
        """Return once this node's alarm is not `alarm_seen`, after `seconds` at most (a held
        ``GET /health/disk``), or at once while the front stops."""
        if self.own.alarm != alarm_seen or self._releasing:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._alarm_changed.wait(), seconds)

    def release_held(self) -> None:
        """Answer every held request now, and hold none from now on: the front is stopping."""
        self._releasing = True
        self._alarm_changed.set()

    # ---- every node ---------------------------------------------------------------------
    def state_of(self, node_id: str) -> DiskState | None:
        """A node's disk state: this node's as sampled, another's as it last answered (None:
        unknown, or not heard for PEER_FORGOTTEN_S)."""
        if node_id == self._node.id:
            return self.own
        seen = self._peers.get(node_id)
        if seen is None or time.monotonic() - seen[1] > PEER_FORGOTTEN_S:
            return None
        return seen[0]

    def check(self, group: int, command: dict) -> None:
        """Refuse (507) a command that brings new data to `group` while a member of it is in alarm."""
        if not fills_disk(command):
            return
        groups = self._groups
        for node_id in groups.members(group):
            state = self.state_of(node_id)
            if state is not None and state.alarm:
                raise _in_alarm(node_id, state, "the queues" if groups.count == 1
                                else f"the queues of Raft group {group}, which it holds,")

    def check_own(self) -> None:
        """Refuse (507) to write to this node's disk while it is in alarm (the put buffer)."""
        if self.own.alarm:
            raise _in_alarm(self._node.id, self.own, "its put buffer")

    def disk_refused(self) -> ApiError:
        """What a write this node's disk itself refused (the engine's ``insufficient_storage``:
        no space for its journal) is answered: as one the watermark refused."""
        state = self.sample()
        return ApiError("insufficient_storage",
                        f"node {self._node.id}'s disk refused the write: {state.free_bytes} bytes free on its "
                        "data directory's file system. Writes that would land on it are refused until space "
                        "returns (receives, acks, nacks, deletes and purges still work, and free it)",
                        headers={"Retry-After": RETRY_AFTER_S}, node=self._node.id,
                        free_bytes=state.free_bytes, watermark_bytes=state.watermark_bytes)

    # ---- the loops ------------------------------------------------------------------------
    def start_with(self, http) -> None:
        """Watch from now on, asking the other nodes through the front's client session `http`."""
        self._http = http
        self.start()

    async def _run(self) -> None:
        await asyncio.gather(self._sample_often(), self._ask_around())

    async def _sample_often(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_S)
            self.sample()

    async def _ask_around(self) -> None:
        # One task per other node, each asking on as its answers come; this loop follows the
        # membership and the snapshot sizes.
        try:
            while True:
                self._read_snapshot_sizes()
                self._follow_members()
                await asyncio.sleep(PEER_POLL_S)
        finally:
            for _, task in self._askers.values():
                task.cancel()

    def _follow_members(self) -> None:
        wanted = {node_id: address for node_id, address in self._node.view()["http"].items()
                  if node_id != self._node.id}
        for node_id, (address, task) in list(self._askers.items()):
            if wanted.get(node_id) != address:
                task.cancel()
                del self._askers[node_id]
                self._peers.pop(node_id, None)
        for node_id, address in wanted.items():
            if node_id not in self._askers:
                self._askers[node_id] = (address, asyncio.create_task(self._keep_asking(node_id, address)))

    def _read_snapshot_sizes(self) -> None:
        # As each engine last pushed its view (a change within VIEW_RECHECK_S); a group no longer
        # held drops out, and one whose engine is away (restarting) keeps its last size.
        self._snapshot_bytes = {group: engine.view().get("snapshot_bytes", self._snapshot_bytes.get(group, 0))
                                for group, engine in dict(self._groups.engines).items()}

    async def _keep_asking(self, node_id: str, address: str) -> None:
        url = f"{self._scheme}://{address}/health/disk"
        while True:
            asked_at = time.monotonic()
            seen = self._peers.get(node_id)
            known = seen[0].alarm if seen is not None and asked_at - seen[1] <= PEER_FORGOTTEN_S else None
            state = await self._ask(url, known)
            if state is not None:
                self._peers[node_id] = (state, time.monotonic())
            if state is None or state.alarm == known:
                # down, or an answer that was not held (an older release, or a first answer that
                # agreed): at most one request a PEER_POLL_S
                await asyncio.sleep(max(0.0, asked_at + PEER_POLL_S - time.monotonic()))

    async def _ask(self, url: str, known: bool | None) -> DiskState | None:
        """The node's state, held by it until its alarm is not `known` (None: at once)."""
        query = {} if known is None else {"alarm": "true" if known else "false", "wait_ms": str(int(HOLD_S * 1000))}
        try:
            async with self._http.get(url, params=query, timeout=PEER_TIMEOUT) as reply:
                answer = await reply.json() if reply.status == 200 else None
            return DiskState(*(int(answer[field]) for field in ("free_bytes", "capacity_bytes", "watermark_bytes")),
                             alarm=answer["alarm"] is True)
        except (ClientError, asyncio.TimeoutError, ValueError, TypeError, KeyError):
            return None                     # down, or an older release: it ages out


def _in_alarm(node_id: str, state: DiskState, refused: str) -> ApiError:
    return ApiError("insufficient_storage",
                    f"node {node_id} is in disk alarm: {state.free_bytes} bytes free on its data directory's file "
                    f"system, below its watermark of {state.watermark_bytes}. Nothing was stored: writes to "
                    f"{refused} are refused until space returns (receives, acks, nacks, deletes and purges still "
                    "work, and free it)", headers={"Retry-After": RETRY_AFTER_S}, node=node_id,
                    free_bytes=state.free_bytes, watermark_bytes=state.watermark_bytes)


async def health(request: web.Request) -> web.Response:
    """GET /health/disk: this node's free space, its watermark, and whether it is in disk alarm;
    with ``?alarm=true|false&wait_ms=N``, once the alarm is not the one given, or after N ms (at
    most MAX_HOLD_MS)."""
    disk = request.app[DISK]
    held = _held_for(request.query)
    if held is not None:
        await disk.answer_after(*held)
    return respond(request, {"id": disk.node_id, **disk.own.as_dict()})


def _held_for(query) -> tuple[bool, float] | None:
    if "alarm" not in query and "wait_ms" not in query:
        return None
    alarm, wait_ms = query.get("alarm"), query.get("wait_ms", "")
    if alarm not in ("true", "false"):
        raise ApiError("bad_request", "alarm must be true or false: the alarm the asker last heard, which a "
                       "held answer waits to change")
    if not (wait_ms.isascii() and wait_ms.isdigit() and 0 < int(wait_ms) <= MAX_HOLD_MS):
        raise ApiError("bad_request", f"wait_ms must be a whole number of milliseconds from 1 to {MAX_HOLD_MS}: "
                       "how long the answer may be held while the alarm stays as given")
    return alarm == "true", int(wait_ms) / 1000

"""A node's engine as a front process sees it: the face of ``engine.link.service``, over a link.

Routing needs no round trip: ``view()`` is the routing view the engine last
pushed.  Everything that touches the state machine or the log is a call.
When the link breaks (the engine died) ``closed`` is set: a front has
nothing left to serve and exits.

Nothing here assumes one engine per node: a front holds one ``RemoteNode``
per local Raft group's engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from pathlib import Path
from typing import NamedTuple

import cbor2

from ..long_poll import ride_queue
from ..outcome import Committed, CommitError
from ..quotas import CONNECTION_LEASE_S  # noqa: F401  (the fronts renew their connections' leases by it)
from .frames import FrameWriter, LinkClosed, read_frame

logger = logging.getLogger(__name__)


class Read(NamedTuple):
    result: object
    applied_index: int


# What a front knows of its group through an engine it has no link to.
NO_ENGINE_VIEW = {"role": "follower", "leader_id": None, "term": 0, "quorum_ok": False, "cut_off": False, "http": {}}


class RemoteNode:
    def __init__(self, node_id: str, *, auto_create: bool, data_dir: Path, node_pid: int):
        self.id = node_id
        self.auto_create = auto_create
        self.data_dir = data_dir
        self.node_pid = node_pid      # the node's supervisor: what started the node knows it by
        self.closed = asyncio.Event()
        self._view: dict = dict(NO_ENGINE_VIEW)
        self._view_changed: asyncio.Future | None = None   # resolved, and replaced, at every push
        self._calls: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._out: FrameWriter | None = None
        self._reader_task: asyncio.Task | None = None

    async def connect(self, sock: socket.socket) -> None:
        """Talk to the engine over `sock`: the first link, or a new one to an engine started
        again (whoever holds this object keeps it)."""
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        self.closed.clear()
        self._view_changed = asyncio.get_running_loop().create_future()
        self._out = FrameWriter(writer)
        self._reader_task = asyncio.create_task(self._read(reader))

    async def close(self) -> None:
        if self._out:
            self._out.close()
        if self._reader_task:
            self._reader_task.cancel()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                for call_id, error, value in await read_frame(reader):
                    if call_id == 0:
                        if error == "view":
                            self._view = value
                            changed, self._view_changed = self._view_changed, asyncio.get_running_loop().create_future()
                            changed.set_result(None)
                        continue
                    self._answer(call_id, error, value)
        except LinkClosed:
            logger.warning("the engine went away")
        finally:
            for future in self._calls.values():
                if not future.done():
                    future.set_exception(CommitError("engine_gone"))
            self._calls.clear()
            self._view = dict(NO_ENGINE_VIEW)      # no engine, no leader known through it
            changed, self._view_changed = self._view_changed, asyncio.get_running_loop().create_future()
            if changed is not None and not changed.done():
                changed.set_result(None)
            self.closed.set()

    def _answer(self, call_id: int, error: str | None, value) -> None:
        # not inline in _read: its long-lived frame would hold the last
        # answered future, and through a refusal's traceback the call's arguments
        future = self._calls.pop(call_id, None)
        if future is None or future.done():
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(CommitError(error))

    async def _call(self, method: str, *args):
        if self.closed.is_set():
            raise CommitError("engine_gone")
        call_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        self._out.send([call_id, method, args])
        try:
            return await future
        except asyncio.CancelledError:
            self._calls.pop(call_id, None)
            if method == "receive":
                self._out.send([0, "cancel", [call_id]])
            raise
        finally:
            # A refusal's traceback holds this frame, and the frame its future,
            # which holds the refusal: a cycle that kept the call's arguments
            # (a batch of bodies) until the cyclic collector ran.
            del future

    # ---- routing, from the pushed view ---------------------------------------------------
    def view(self) -> dict:
        """role, leader_id, term, quorum_ok, cut_off: as the engine last reported them."""
        return self._view

    async def next_view(self) -> dict:
        """The view the engine pushes next."""
        await asyncio.shield(self._view_changed)
        return self._view

    def http_addr(self, node_id: str | None) -> str | None:
        return None if node_id is None else self._view["http"].get(node_id)

    # ---- the log and the state machine ---------------------------------------------------
    async def apply(self, command: dict, charge: list | None = None) -> Committed:
        """The command applied through the engine's log (``Node.submit``, one
        round trip): its result and its entry's index, or CommitError. `charge`: the
        [principal, messages, rate per second] its put costs (``engine.quotas.PutRates``)."""
        # encoded here, so the engine only splices in its log time (and reads no put to find
        # its queue)
        return Committed(*await self._call("submit", cbor2.dumps(command), ride_queue(command), charge))

    async def read(self, query: str, *args, settled: bool = False) -> Read:
        """A query of the state machine; `settled` waits first for this leader's barrier."""
        result, applied = await self._call("read", query, list(args), settled)
        return Read(result, applied)

    async def receive(self, command: dict, wait_s: float, *, sealed: bool, last_try: bool = True,
                      encoded: bool = False, client: str | None = None,
                      principal_cap: list | None = None) -> Committed | None:
        """A receive that waits up to `wait_s` for a message (``LongPolls.receive``);
        `sealed`: its receipts with their MAC (engine/link/receipts.py);
        `encoded`: its messages as {"receipts": [...], "encoded": CBOR array};
        `client`: who waits (its address), held to its share of the node's waits;
        `principal_cap`: [principal, the waits it may hold on this engine]."""
        answer = await self._call("receive", command, wait_s, last_try, encoded, client, sealed, principal_cap)
        return None if answer is None else Committed(*answer)

    async def replicated_everywhere(self, index: int, timeout: float) -> list[str]:
        return await self._call("replicated_everywhere", index, timeout)

    # ---- the cluster ------------------------------------------------------------------------
    async def status(self) -> dict:
        return await self._call("status")

    async def members(self) -> list[dict]:
        return await self._call("members")

    async def stats(self) -> dict:
        return await self._call("stats")

    async def add_node(self, node_id: str, raft_addr: str, http_addr: str) -> None:
        await self._call("add_node", node_id, raft_addr, http_addr)

    async def remove_node(self, node_id: str) -> None:
        await self._call("remove_node", node_id)

    async def transfer_leadership(self, timeout: float, to: str | None = None) -> bool:
        return await self._call("transfer_leadership", timeout, to)

    async def prefer(self, preference: list[str]) -> None:
        """Give the engine's leader balancing the group's order of preference (api/mover.py)."""
        await self._call("prefer", preference)

    async def rebalance(self) -> bool | None:
        """Run the engine's leader balancing now (engine/balance.py): whether this group's
        leadership moved (None: nobody to hand it to)."""
        return await self._call("rebalance")

    async def allow_relocation(self, allowed: bool) -> None:
        """Tell the engine whether every node applies ``relocate``: while it does, the engine may
        copy live bodies forward (engine/relocation.py; api/features.py asks the nodes)."""
        await self._call("allow_relocation", allowed)

    async def allow_wall_ticks(self, allowed: bool) -> None:
        """Tell the engine whether every node applies a tick's wall clock: while it does, the
        leader's ticks carry it (statemachine/wall.py; api/features.py asks the nodes)."""
        await self._call("allow_wall_ticks", allowed)

    async def allow_plain_entries(self, allowed: bool) -> None:
        """Tell the engine whether every node applies an entry logged without pickle: while it
        does, its proposals are (engine/raft/node.py, item 19; api/features.py asks the nodes)."""
        await self._call("allow_plain_entries", allowed)

    async def checkpoint(self) -> tuple[str, str]:
        token, digest = await self._call("checkpoint")
        return token, digest

    async def checkpoint_digest(self, token: str) -> str | None:
        return await self._call("checkpoint_digest", token)

    # ---- connections of principals (engine.quotas.Holds) --------------------------------------
    async def hold(self, principal: str, limit: int) -> bool:
        """Count one more connection of `principal` on this node, unless it holds `limit`."""
        return await self._call("hold", principal, limit)

    def release(self, principal: str) -> None:
        if not self.closed.is_set():
            self._out.send([0, "release", [principal]])

    # ---- connections of principals in the cluster, on group 0's leader (engine.quotas.ConnectionLeases)
    async def lease_hold(self, principal: str, lease: str, limit: int) -> bool | float:
        """Hold `lease` for one more connection of `principal` unless it holds `limit` in the
        cluster: True, False, or the seconds a new leader still relearns the open ones.
        CommitError not_leader unless this engine leads group 0 with a quorum."""
        return await self._call("lease_hold", principal, lease, limit)

    async def lease_renew(self, leases: list) -> None:
        await self._call("lease_renew", leases)

    async def lease_release(self, principal: str, lease: str) -> None:
        await self._call("lease_release", principal, lease)

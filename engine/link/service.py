"""The engine's face, served to the node's front processes over their links.

Each front holds one link (``engine.link.frames``); this side answers its calls
against the ``Node`` and pushes the routing view to every front whenever it
changes, so that a front routes a request (serve, redirect, 503) without a
round trip.  Calls are the whole face of the node — nothing else of the
engine is reachable from a front:

=====================  ==============================================  =======================
call                   args                                            answer
=====================  ==============================================  =======================
submit                 command, CBOR-encoded (bytes); the queue whose  [result, log index]
                       waiting receives it takes along, or None       (CommitError rate_limited:
                       (``engine.long_poll.ride_queue``); a put's      the principal put its
                       charge, [principal, messages, rate] or None    rate's worth, ``PutRates``)
read                   query, args, settled                            [result, applied index]
receive                receive command, wait_s, last_try, encoded,     [result, log index] or None;
                       client (who waits: its address), sealed         ``encoded``: a result's messages
                       (receipts with their MAC, engine/link/          as {"receipts", "encoded": CBOR}
                       receipts.py), principal_cap ([principal,
                       the waits it may hold here] or None)
cancel                 call id of a receive                            (none: call id 0)
replicated_everywhere  log index, timeout_s                            ids still lagging
status / members       —                                               consensus status / voters
stats                  —                                               counters for /metrics
add_node               id, raft_addr, http_addr                        None
remove_node            id                                              None
transfer_leadership    timeout_s, to                                   moved (bool)
rebalance              —                                               moved (bool; None: nobody
                                                                       to hand it to, or one group)
prefer                 the group's order of preference for leadership  None (one group: ignored)
checkpoint             —                                               [token, digest]
checkpoint_digest      token                                           digest or None
allow_relocation       whether every node applies ``relocate``         None (engine/relocation.py)
allow_wall_ticks       whether every node applies a tick's wall clock  None (statemachine/wall.py)
allow_plain_entries    whether every node applies an entry logged      None (engine/raft/node.py,
                       without pickle                                  item 19)
hold                   principal, limit (its connections on the node)  whether it was counted
release                principal                                       None
lease_hold             principal, lease id, limit (its connections in  True, False (it holds
                       the cluster; group 0's leader alone answers)    `limit`), or the seconds
                                                                       a new leader still relearns
lease_renew            [[principal, lease id], ...]                    None
lease_release          principal, lease id                             None
=====================  ==============================================  =======================

``settled`` reads wait, like writes, for this leader's barrier (``Node.settled``),
then for a majority to confirm that it still leads (``Node.confirm_read``).
An error is a ``CommitError`` code: the fronts map it to HTTP as they did in
one process.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from collections.abc import Awaitable

import cbor2

from ..outcome import Committed, CommitError
from ..quotas import CONNECTION_LEASE_S, ConnectionLeases, Holds, PutRates
from .frames import FrameWriter, LinkClosed, read_frame
from .receipts import Receipts
from ..node import Node

logger = logging.getLogger(__name__)

# Role, leader, term and quorum changes are reported by the consensus module
# as they happen; members' HTTP addresses change with applied entries, and are
# re-checked this often.
VIEW_RECHECK_S = 1.0


async def _refused(code: str) -> list:
    raise CommitError(code)


async def _as_answer(committing: Awaitable[Committed]) -> list:
    committed = await committing
    return [committed.result, committed.index]


class EngineService:
    def __init__(self, node: Node, *, max_long_polls: int, max_long_polls_per_client: int, receipts: Receipts,
                 balancer=None):
        """`balancer`: the group's ``engine.balance.LeaderBalancer`` (None: one group, nothing to balance);
        `receipts`: what seals the receipts a receive hands out."""
        self.node = node
        self.receipts = receipts
        self.balancer = balancer
        self.max_long_polls = max_long_polls
        self.max_long_polls_per_client = max_long_polls_per_client
        self._fronts: set[FrameWriter] = set()
        self.put_rates = PutRates()
        self.holds = Holds()
        self.leases = ConnectionLeases(CONNECTION_LEASE_S)
        self._view: dict | None = None
        self._view_task: asyncio.Task | None = None
        self._calls = {
            "read": self._read, "receive": self._receive,
            "replicated_everywhere": node.replicated_everywhere, "add_node": node.add_node,
            "remove_node": node.remove_node, "transfer_leadership": node.transfer_leadership,
            "checkpoint": self._checkpoint, "rebalance": self._rebalance,
            "lease_hold": self._leading(self.leases.hold), "lease_renew": self._leading(self.leases.renew),
            "lease_release": self._leading(self.leases.release),
        }
        self._instant = {
            "status": lambda: node.status(), "members": node.members, "stats": node.stats,
            "checkpoint_digest": node.checkpoint_digest, "prefer": self._prefer,
            "allow_relocation": node.relocator.allow, "allow_wall_ticks": node.allow_wall_ticks,
            "allow_plain_entries": node.consensus.allow_plain_entries,
        }

    def start(self) -> None:
        self.node.watch_view(self._push_view)
        self.node.watch_view(self._lead_changed)
        self._view_task = asyncio.create_task(self._recheck_view())

    def stop(self) -> None:
        if self._view_task:
            self._view_task.cancel()
        for front in list(self._fronts):
            front.close()

    async def serve(self, sock: socket.socket) -> None:
        """Answer one front until it goes away."""
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        out = FrameWriter(writer)
        self._fronts.add(out)
        waits: dict[int, asyncio.Task] = {}
        held = collections.Counter()      # this front's connections counted in self.holds
        out.send([0, "view", self._current_view()])
        try:
            while True:
                for call_id, method, args in await read_frame(reader):
                    if method == "cancel":
                        task = waits.pop(args[0], None)
                        if task:
                            task.cancel()
                    elif method == "hold":
                        out.send([call_id, None, self.holds.hold(held, *args)])
                    elif method == "release":
                        self.holds.release(held, *args)
                    elif method in self._instant:
                        self._answer_now(out, call_id, method, args)
                    elif method == "submit":
                        self._submit_now(out, call_id, args)
                    else:
                        task = asyncio.create_task(self._answer(out, call_id, method, args))
                        if method == "receive":
                            waits[call_id] = task
                            task.add_done_callback(lambda _, c=call_id: waits.pop(c, None))
        except LinkClosed:
            pass
        finally:
            self.holds.release_all(held)
            self._fronts.discard(out)
            for task in waits.values():
                task.cancel()
            out.close()

    def _answer_now(self, out: FrameWriter, call_id: int, method: str, args: list) -> None:
        try:
            value = self._instant[method](*args)
        except Exception:
            logger.exception("engine call %s failed", method)
            value, error = None, "internal"
        else:
            error = None
        if call_id:
            out.send([call_id, error, value])

    def _submit_now(self, out: FrameWriter, call_id: int, args: list) -> None:
        """A submit queued for the next entry as its frame is read, with the frame's others
        (``Node.submit_queued``): a lone put is proposed at the end of this turn, not of the
        next, where a task's first step would queue it. Only its answer waits, in a task."""
        try:
            committing = self._submit(*args)
        except Exception:
            logger.exception("engine call submit failed")
            if call_id:
                out.send([call_id, "internal", None])
            return
        asyncio.create_task(self._answer(out, call_id, "submit", args, begun=committing))

    async def _answer(self, out: FrameWriter, call_id: int, method: str, args: list,
                      begun: Awaitable | None = None) -> None:
        """Answer the call (`begun`: already under way) once it is done."""
        try:
            value, error = await (self._calls[method](*args) if begun is None else begun), None
        except CommitError as exc:
            value, error = None, exc.code
        except asyncio.CancelledError:
            return
        except Exception:
            logger.exception("engine call %s failed", method)
            value, error = None, "internal"
        if call_id:
            out.send([call_id, error, value])

    def _lead_changed(self) -> None:
        role, _, term, _, _ = self.node.consensus.route()
        if role == "leader":
            self.leases.took(term)    # a new leader relearns the connections from its election on

    def _leading(self, call):
        """`call` with the term this engine leads with a quorum: the table of connections is
        group 0's leader's alone, and a leader cut off from the majority may have a successor."""
        async def leading(*args):
            role, _, term, quorum_ok, cut_off = self.node.consensus.route()
            if role != "leader" or not quorum_ok or cut_off:
                raise CommitError("not_leader")
            return call(term, *args)
        return leading

    def _prefer(self, preference: list) -> None:
        if self.balancer is not None:
            self.balancer.prefer(preference)

    async def _rebalance(self) -> bool | None:
        return None if self.balancer is None else await self.balancer.balance_now()

    def _submit(self, encoded: bytes, ride: str | None = None, charge: list | None = None) -> Awaitable[list]:
        if charge is not None and self.put_rates.take(*charge) is not None:
            return _refused("rate_limited")
        return _as_answer(self.node.submit_queued(encoded, ride))

    async def _read(self, query: str, args: list, settled: bool) -> list:
        if settled:
            await self.node.settled()
            await self.node.confirm_read()
        return list(await self.node.applied_read(query, *args))

    async def _receive(self, command: dict, wait_s: float, last_try: bool, encoded: bool,
                       client: str | None, sealed: bool, principal_cap: list | None = None) -> list | None:
        committed = await self.node.long_polls.receive(command, wait_s, self.max_long_polls, last_try=last_try,
                                                       client=client, max_per_client=self.max_long_polls_per_client,
                                                       principal_cap=principal_cap)
        if committed is None:
            return None
        result = committed.result
        if sealed and "error" not in result:
            queue = command["queue"]
            for message in result["messages"]:
                message["receipt"] = self.receipts.seal(queue, message["receipt"])
        if encoded and "error" not in result:
            # The stream pushes the messages on as they are: encoded once
            # here, the front splices them into its frame without building
            # them, and keeps only the receipts (its leases).
            messages = result["messages"]
            result = {"receipts": [m["receipt"] for m in messages], "encoded": cbor2.dumps(messages)}
        return [result, committed.index]

    async def _checkpoint(self) -> list:
        return list(await self.node.checkpoint())

    # ---- the routing view -----------------------------------------------------------------
    def _current_view(self) -> dict:
        self._view = self.node.view()
        return self._view

    def _push_view(self) -> None:
        previous = self._view
        if self._current_view() != previous:
            for front in self._fronts:
                front.send([0, "view", self._view])

    async def _recheck_view(self) -> None:
        while True:
            await asyncio.sleep(VIEW_RECHECK_S)
            self._push_view()

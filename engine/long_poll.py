"""Long polls: receives that wait on a node for a message to become ready.

Waiting costs no log entry: a waiting receive is written to the log once its
group may have a ready message. After an apply the engine's loop looks at the groups that have waiters (``entry_applied``): one
ready message wakes one waiter, oldest first, and a woken receiver *claims*
it until it says it is done (``woken_done``), so that one put does not make
hundreds of waiters write empty receives. The waits are capped per
node, per client address and per principal (CommitError ``too_many_waiters``,
``too_many_client_waiters``, ``too_many_principal_waiters``).

A put takes one waiter of each of its queue's groups along (``ride_queue``
names its queue, ``put_queued`` notes it, ``ride`` acts when group commit
packs the next entry): the waiter's receive
is queued behind the puts packed with it, into the same log entry as a rule,
so the state machine leases it their messages in the puts' own apply, and a
message reaches a waiting consumer in one Raft round rather than two (the
put's, then the receive's). It is the receive the waiter would have written
a round later; if the puts leave it nothing ready (a delay, an ordering key
in flight, a refusal), it comes back empty and waits again.

``LongPolls`` belongs to one ``engine.node.Node``: it reads the node's state
machine, and writes receives with the node's ``submit`` (or, riding a put,
with the queue function ``put_queued`` is given).
"""

import asyncio
import collections
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from raftq.statemachine import StateMachine

from .outcome import Committed, CommitError

# A woken receiver that never says it is done (a bug, a dropped task) stops
# holding back the other waiters after this long.
CLAIM_EXPIRY_S = 5.0


def ride_queue(command: dict) -> str | None:
    """The queue whose waiting receives `command` may take along in its log entry: a put's,
    unless every message it puts is delayed (ready only later, for nobody waiting now)."""
    if command.get("op") != "put" or all(message.get("delay_ms") for message in command["messages"]):
        return None
    return command["queue"]


@dataclass(slots=True, eq=False)
class _Waiter:
    command: dict            # the receive it writes once woken
    woken: asyncio.Future    # its result: None (write the receive now) or the receive already queued


class LongPolls:
    def __init__(self, machine: StateMachine, submit: Callable[[dict], Awaitable[Committed]]):
        self._machine = machine
        self._submit = submit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[tuple[str, str], list[_Waiter]] = {}
        self._groups_waiting: dict[str, set[str]] = {}   # queue -> its groups in _waiters
        self._puts_queued: dict[str, int] = {}   # queue -> the term its last put queued was stamped in
        self.receives_with_a_put = 0
        self._waiting_by_client: collections.Counter[str] = collections.Counter()
        self._waiting_by_principal: collections.Counter[str] = collections.Counter()
        # per group, when each woken receiver not done yet was woken
        self._claims: dict[tuple[str, str], list[float]] = {}
        self._wake_scheduled = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake waiters on `loop` from now on (the node's loop, once it runs)."""
        self._loop = loop

    def entry_applied(self) -> None:
        """After each apply (in a tick): wake the waiters whose group may have
        a ready message now, once the tick is over."""
        # Only for long polls: most applies have nobody to wake. A waiter
        # registers before it checks has_ready, so none is missed.
        if self._loop is not None and self._waiters and not self._wake_scheduled:
            self._wake_scheduled = True
            self._loop.call_soon(self._wake_waiters)

    async def receive(self, command: dict, wait_s: float, max_waiters: int, *, last_try: bool = True,
                      client: str | None = None, max_per_client: int = 0,
                      principal_cap: list | None = None) -> Committed | None:
        """A receive command that waits up to `wait_s` for something to lease.

        Waiting costs no log entry: the receive is written once something may
        be ready (or the group is missing, to get its error), and — when
        `last_try` — once more at the end if nothing was (an HTTP receive
        answers with its result); without it the end of the wait is None.
        CommitError too_many_waiters when `max_waiters` wait on this node
        already, too_many_client_waiters when `max_per_client` of `client` do,
        too_many_principal_waiters when `principal_cap` ([principal, limit]) says its principal
        holds its limit.
        """
        queue, group = command["queue"], command["group"]
        deadline = time.monotonic() + wait_s
        woken = False
        try:
            while True:
                riding = None
                if time.monotonic() < deadline:
                    if woken:
                        self.woken_done(queue, group)
                    outcome = await self.wait_ready(command, deadline - time.monotonic(), max_waiters,
                                                    client, max_per_client, principal_cap)
                    woken = outcome not in ("ready", "timeout")
                    if outcome == "timeout" and not last_try:
                        return None
                    if isinstance(outcome, asyncio.Future):
                        riding = outcome
                committed = await self._written(command, riding)
                if committed.result.get("messages") or "error" in committed.result \
                        or time.monotonic() >= deadline:
                    return committed
        finally:
            if woken:
                self.woken_done(queue, group)

    async def _written(self, command: dict, riding: asyncio.Future | None) -> Committed:
        """The receive's outcome: the one queued behind a put (`riding`), or written now."""
        if riding is not None:
            try:
                return await riding
            except CommitError as exc:
                # refused before the log, as the put was: written again the usual way, which
                # waits for a leader cut off for a moment to hear from a majority again
                if exc.code != "no_quorum":
                    raise
        return await self._submit(dict(command))

    async def wait_ready(self, command: dict, timeout: float, max_waiters: int,
                         client: str | None = None, max_per_client: int = 0,
                         principal_cap: list | None = None) -> str | asyncio.Future:
        """Wait until the receive `command`'s group may have a ready message for this caller.

        "woken" when an apply woke this caller, or the receive's future when a
        put queued it to ride along (``put_queued``): either way it was counted
        as claiming one ready message, and must call ``woken_done`` once it has
        tried to lease (before waiting again, too), so that what it left ready
        wakes the next waiter.  "ready" at once when something is ready (or the
        group does not exist: a receive then gets its error); "timeout" after
        `timeout`.  CommitError too_many_waiters when `max_waiters` wait already;
        too_many_client_waiters when `client` (the front's name for who asks:
        its address) has `max_per_client` waiting already, so that no one
        client takes every slot; too_many_principal_waiters when `principal_cap`'s principal has
        its limit waiting already, so that no one tenant does.
        """
        queue, group = command["queue"], command["group"]
        key = (queue, group)
        waiter = _Waiter(command, self._loop.create_future())
        # Registered before looking: an apply that makes the group ready after
        # the look below then finds a waiter and wakes it (entry_applied).
        self._waiters.setdefault(key, []).append(waiter)
        self._groups_waiting.setdefault(queue, set()).add(group)
        if client is not None:
            self._waiting_by_client[client] += 1
        principal, principal_limit = principal_cap or (None, 0)
        if principal is not None:
            self._waiting_by_principal[principal] += 1
        try:
            if self._machine.read("has_ready", queue, group) or "error" in self._machine.read("group_info", queue, group):
                return "ready"
            if self.waiting() > max_waiters:
                raise CommitError("too_many_waiters")
            if client is not None and self._waiting_by_client[client] > max_per_client:
                raise CommitError("too_many_client_waiters")
            if principal is not None and self._waiting_by_principal[principal] > principal_limit:
                raise CommitError("too_many_principal_waiters")
            riding = await asyncio.wait_for(waiter.woken, timeout)
            return "woken" if riding is None else riding
        except asyncio.TimeoutError:
            return "timeout"
        finally:
            waiting = self._waiters.get(key)
            if waiting is not None and waiter in waiting:
                waiting.remove(waiter)
                if not waiting:
                    self._forget(key)
            if client is not None:
                self._waiting_by_client[client] -= 1
                if not self._waiting_by_client[client]:
                    del self._waiting_by_client[client]
            if principal is not None:
                self._waiting_by_principal[principal] -= 1
                if not self._waiting_by_principal[principal]:
                    del self._waiting_by_principal[principal]

    def woken_done(self, queue: str, group: str) -> None:
        claims = self._claims.get((queue, group))
        if claims:
            claims.pop(0)
            if not claims:
                del self._claims[(queue, group)]
        if self._waiters and not self._wake_scheduled:
            self._wake_scheduled = True
            self._loop.call_soon(self._wake_waiters)

    def waiting(self) -> int:
        """How many receives wait on this node."""
        return sum(len(waiting) for waiting in self._waiters.values())

    def waits_on(self, queue: str) -> bool:
        """Whether a receive waits on `queue`."""
        return queue in self._groups_waiting

    def put_queued(self, queue: str, term: int) -> None:
        """A put to `queue`, stamped in `term`, was just queued for the log."""
        self._puts_queued[queue] = term

    def ride(self, queue_receive: Callable[[dict, int], asyncio.Future], term: int) -> None:
        """Before group commit packs the puts queued (``put_queued``) in `term`, the node's
        term now: queue the receive of the oldest waiter of each group of their queues
        behind them, with `queue_receive(command, term)`, and hand it to its waiter, which
        claims what it leases. Puts of an earlier term were refused with their term."""
        if not self._puts_queued:
            return
        puts, self._puts_queued = self._puts_queued, {}
        for queue, put_term in puts.items():
            if put_term != term:
                continue
            for group in list(self._groups_waiting.get(queue, ())):
                key = (queue, group)
                waiting = self._waiters[key]
                while waiting and waiting[0].woken.done():
                    waiting.pop(0)
                if not waiting:
                    self._forget(key)
                    continue
                waiter = waiting.pop(0)
                if not waiting:
                    self._forget(key)
                waiter.woken.set_result(queue_receive(dict(waiter.command), term))
                self._claims.setdefault(key, []).append(time.monotonic())
                self.receives_with_a_put += 1

    def _forget(self, key: tuple[str, str]) -> None:
        del self._waiters[key]
        groups = self._groups_waiting[key[0]]
        groups.discard(key[1])
        if not groups:
            del self._groups_waiting[key[0]]

    def _wake_waiters(self) -> None:
        # A ready message wakes one waiter, oldest first, unless a receiver
        # woken before is still on its way to it: waking every waiter of a
        # group made each one write a receive to the log (500 waiters: 496
        # empty receives per put).
        self._wake_scheduled = False
        if not self._waiters:
            return
        ready = {key: self._machine.ready_count(*key) for key in self._waiters}
        stale = time.monotonic() - CLAIM_EXPIRY_S
        for key, count in ready.items():
            claims = self._claims.setdefault(key, [])
            while claims and claims[0] < stale:
                claims.pop(0)
            waiting = self._waiters[key]
            while waiting and count > len(claims):
                waiter = waiting.pop(0)
                if not waiter.woken.done():
                    waiter.woken.set_result(None)
                    claims.append(time.monotonic())
            if not claims:
                del self._claims[key]
            if not waiting:
                self._forget(key)

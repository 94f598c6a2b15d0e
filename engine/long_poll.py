"""Long polls: receives that wait on a node for a message to become ready.

Waiting costs no log entry: a waiting receive is written to the log once its
group may have a ready message. After an apply the engine's loop looks at the groups that have waiters (``entry_applied``): one
ready message wakes one waiter, oldest first, and a woken receiver *claims*
it until it says it is done (``woken_done``), so that one put does not make
hundreds of waiters write empty receives. The waits are capped per
node and per client address (CommitError ``too_many_waiters``,
``too_many_client_waiters``).

``LongPolls`` belongs to one ``engine.node.Node``: it reads the node's state
machine, and writes receives with the node's ``submit``.
"""

import asyncio
import collections
import time
from typing import Awaitable, Callable

from statemachine import StateMachine

from .outcome import Committed, CommitError

# A woken receiver that never says it is done (a bug, a dropped task) stops
# holding back the other waiters after this long.
CLAIM_EXPIRY_S = 5.0


class LongPolls:
    def __init__(self, machine: StateMachine, submit: Callable[[dict], Awaitable[Committed]]):
        self._machine = machine
        self._submit = submit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[tuple[str, str], list[asyncio.Future]] = {}
        self._waiting_by_client: collections.Counter[str] = collections.Counter()
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
                      client: str | None = None, max_per_client: int = 0) -> Committed | None:
        """A receive command that waits up to `wait_s` for something to lease.

        Waiting costs no log entry: the receive is written once something may
        be ready (or the group is missing, to get its error), and — when
        `last_try` — once more at the end if nothing was (an HTTP receive
        answers with its result); without it the end of the wait is None.
        CommitError too_many_waiters when `max_waiters` wait on this node
        already, too_many_client_waiters when `max_per_client` of `client` do.
        """
        queue, group = command["queue"], command["group"]
        deadline = time.monotonic() + wait_s
        woken = False
        try:
            while True:
                if time.monotonic() < deadline:
                    if woken:
                        self.woken_done(queue, group)
                    outcome = await self.wait_ready(queue, group, deadline - time.monotonic(), max_waiters,
                                                    client, max_per_client)
                    woken = outcome == "woken"
                    if outcome == "timeout" and not last_try:
                        return None
                committed = await self._submit(dict(command))
                if committed.result.get("messages") or "error" in committed.result \
                        or time.monotonic() >= deadline:
                    return committed
        finally:
            if woken:
                self.woken_done(queue, group)

    async def wait_ready(self, queue: str, group: str, timeout: float, max_waiters: int,
                         client: str | None = None, max_per_client: int = 0) -> str:
        """Wait until the group may have a ready message for this caller.

        "woken" when an apply woke this caller: it was counted as claiming
        one ready message, and must call ``woken_done`` once it has tried to
        lease (before waiting again, too), so that what it left ready wakes
        the next waiter.  "ready" at once when something is ready (or the
        group does not exist: a receive then gets its error); "timeout" after
        `timeout`.  CommitError too_many_waiters when `max_waiters` wait already;
        too_many_client_waiters when `client` (the front's name for who asks:
        its address) has `max_per_client` waiting already, so that no one
        client takes every slot.
        """
        key = (queue, group)
        future = self._loop.create_future()
        # Registered before looking: an apply that makes the group ready after
        # the look below then finds a waiter and wakes it (entry_applied).
        self._waiters.setdefault(key, []).append(future)
        if client is not None:
            self._waiting_by_client[client] += 1
        try:
            if self._machine.read("has_ready", queue, group) or "error" in self._machine.read("group_info", queue, group):
                return "ready"
            if self.waiting() > max_waiters:
                raise CommitError("too_many_waiters")
            if client is not None and self._waiting_by_client[client] > max_per_client:
                raise CommitError("too_many_client_waiters")
            await asyncio.wait_for(future, timeout)
            return "woken"
        except asyncio.TimeoutError:
            return "timeout"
        finally:
            waiting = self._waiters.get(key)
            if waiting is not None and future in waiting:
                waiting.remove(future)
                if not waiting:
                    del self._waiters[key]
            if client is not None:
                self._waiting_by_client[client] -= 1
                if not self._waiting_by_client[client]:
                    del self._waiting_by_client[client]

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
                future = waiting.pop(0)
                if not future.done():
                    future.set_result(None)
                    claims.append(time.monotonic())
            if not claims:
                del self._claims[key]
            if not waiting:
                del self._waiters[key]

"""pysyncobj ticked from the engine's asyncio loop: one thread for Raft and the fronts' calls.

pysyncobj's own way is a *tick thread*: it polls its sockets, ticks, polls
again. The engine's loop then ran beside it, and everything a put did
crossed between the two: the proposal was queued for the tick thread and
woke it through a pipe, and its result came back through
``call_soon_threadsafe``, each crossing a wake-up and a wait for the
interpreter lock (docs/benchmarks.md, "where a lone put waits"). Here the
loop runs the ticks itself (``autoTick=False``):

- ``WatchedPoller`` is pysyncobj's poller with every subscription mirrored
  on the loop (``add_reader``/``add_writer``): a socket that becomes ready
  runs a tick, whose poll (never blocking: timeout 0) hands the events to
  pysyncobj exactly as its own thread's poll would.
- ``LoopTicker`` reads a socket that is ready without a tick
  (``RaftNode.read``: a poll that never waits, whose messages -- appends
  and their answers -- are handled as they are read), and runs a tick
  only if the read brought news, soon after a task or a proposal that
  waits in pysyncobj's queue, and otherwise when the node's next heartbeat
  or election deadline falls (``RaftNode.until_due``), so an idle node
  wakes for heartbeats only and a lone put costs no tick. A tick reads
  what is ready first and acts on it; pysyncobj polls once more at its
  end, and what that poll read -- a vote to cast, a leadership handed
  over, a new term -- is acted on by the next tick, which runs at once:
  as pysyncobj's thread ticks again as soon as its poll returns. Unless
  that poll (or a read) brought only routine messages
  (``WatchedPoller.heard``): an append a follower answered as it read it,
  the answers a leader counted as it read them.

A tick holds the loop for what it does (an apply slice is at most
``engine.raft.node.APPLY_BUDGET_S``), and a turn of the loop answering a
front delays a heartbeat by its length: what the loop runs between ticks
must stay short, as the apply slices do. A tick that runs ``LATE_S`` or more
after it was due is counted (``LateTicks``, /metrics) and logged with what
the loop's thread did meanwhile: on the CPU (the engine's own work held the
loop) or off it (it waited for a core or for the disk). A late heartbeat
costs a leader its lease, and a later one an election; the log line says
which of the two to look at.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Callable

from pysyncobj.poller import POLL_EVENT_TYPE, Poller

logger = logging.getLogger(__name__)

READABLE = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
# A tick this late leaves a gap between heartbeats (every 0.09 s) about as long as the leader lease (0.2 s).
LATE_S = 0.1
# At most one log line about late ticks this often: they come in bursts.
LATE_LOG_INTERVAL_S = 10.0


class WatchedPoller(Poller):
    """pysyncobj's poller, its subscriptions mirrored on a loop once ``watch`` is called."""

    def __init__(self, inner: Poller):
        self._inner = inner
        self.dispatched = 0     # events the last poll handed to pysyncobj
        self.news = False       # whether one of them brought more than routine messages
        self._routine: bool | None = None   # what the event being dispatched brought, so far
        # fd -> (event mask, callback): a new callback on a known fd is a new
        # socket that reuses a closed one's number, and is registered afresh
        self._subscribed: dict[int, tuple[int, Callable]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_ready: Callable[[], None] | None = None

    def subscribe(self, descr, callback, eventMask):
        self._inner.subscribe(descr, functools.partial(self._dispatch, callback), eventMask)
        old_mask, old_callback = self._subscribed.get(descr, (0, None))
        self._subscribed[descr] = (eventMask, callback)
        if self._loop is not None:
            if old_callback is not callback and old_mask:
                self._mirror(descr, old_mask, 0)
                old_mask = 0
            self._mirror(descr, old_mask, eventMask)

    def unsubscribe(self, descr):
        self._inner.unsubscribe(descr)
        old_mask, _ = self._subscribed.pop(descr, (0, None))
        if self._loop is not None:
            self._mirror(descr, old_mask, 0)

    def poll(self, timeout):
        self.dispatched = 0
        self.news = False
        self._inner.poll(timeout)

    def heard(self, routine: bool) -> None:
        """The node's word on a message the event being dispatched delivered:
        whether it was routine, all its consequences taken in the tick that
        reads it. An event that delivers no message (a connection made or
        lost, part of a message) is news."""
        self._routine = routine if self._routine is None else self._routine and routine

    def _dispatch(self, callback, descr, event):
        self.dispatched += 1
        self._routine = None
        try:
            callback(descr, event)
        finally:
            if not self._routine:
                self.news = True

    def watch(self, loop: asyncio.AbstractEventLoop, on_ready: Callable[[], None]) -> None:
        self._loop, self._on_ready = loop, on_ready
        for descr, (mask, _) in self._subscribed.items():
            self._mirror(descr, 0, mask)

    def unwatch(self) -> None:
        if self._loop is None:
            return
        for descr, (mask, _) in self._subscribed.items():
            self._mirror(descr, mask, 0)
        self._loop = self._on_ready = None

    def _mirror(self, descr: int, old: int, new: int) -> None:
        # pysyncobj closes a connection's socket before it unsubscribes it: the
        # loop's selector then fails to change what it watches on that fd
        # (EBADF, or ENOENT once the number is reused) and forgets the fd,
        # which is what unsubscribing asks
        loop = self._loop
        with contextlib.suppress(OSError):
            if new & READABLE and not old & READABLE:
                loop.add_reader(descr, self._on_ready)
            elif old & READABLE and not new & READABLE:
                loop.remove_reader(descr)
        with contextlib.suppress(OSError):
            if new & POLL_EVENT_TYPE.WRITE and not old & POLL_EVENT_TYPE.WRITE:
                loop.add_writer(descr, self._on_ready)
            elif old & POLL_EVENT_TYPE.WRITE and not new & POLL_EVENT_TYPE.WRITE:
                loop.remove_writer(descr)


class LateTicks:
    """Ticks that ran ``LATE_S`` or more after they were due: how many, how late in all, and a
    log line now and then naming the worst since the last one."""

    def __init__(self):
        self.count = 0
        self.seconds = 0.0
        self._unlogged = 0
        self._worst: tuple[float, float, float] | None = None   # (late, since set, on the CPU since set)
        self._logged_at = -LATE_LOG_INTERVAL_S

    def note(self, late_s: float, since_set_s: float, on_cpu_s: float) -> None:
        self.count += 1
        self.seconds += late_s
        self._unlogged += 1
        if self._worst is None or late_s > self._worst[0]:
            self._worst = (late_s, since_set_s, on_cpu_s)
        now = time.monotonic()
        if now - self._logged_at < LATE_LOG_INTERVAL_S:
            return
        late_s, since_set_s, on_cpu_s = self._worst
        logger.warning("%d Raft tick(s) ran late since the last such line, the worst %.0f ms after it was due: "
                       "in the %.0f ms since it was set, the loop's thread was on the CPU %.0f ms (the engine's "
                       "own work) and off it %.0f ms (waiting for a core or for the disk, or idle)",
                       self._unlogged, late_s * 1000, since_set_s * 1000, on_cpu_s * 1000,
                       (since_set_s - on_cpu_s) * 1000)
        self._logged_at, self._unlogged, self._worst = now, 0, None


class LoopTicker:
    """Runs ``tick()`` on the loop: soon after ``soon()`` (a proposal, a task),
    at once again after a tick that says it read something (returns True),
    else ``until_due()`` seconds after the last tick. At ``ready()`` (a socket)
    it runs ``read()``, and a tick only if that says one must follow (returns
    True) or one is due."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: Callable[[], bool], until_due: Callable[[], float],
                 read: Callable[[], bool]):
        self._loop = loop
        self._tick = tick
        self._until_due = until_due
        self._read = read
        self._pending = False
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = False
        self._read_in_turn = False
        self.late = LateTicks()
        # when the next tick is due (loop time), when that was decided and the loop thread's CPU time then
        self._due: tuple[float, float, float] | None = None

    def ready(self) -> None:
        """A watched socket is ready: read now. The read's poll reads every
        socket that is ready, so the others the loop's selector reported in
        the same turn (it reports a socket for as long as it holds data) are
        ignored; anything newer is reported again at the next turn. The
        steady state's messages (an append, its answer) are all done in the
        read: a tick, with its heartbeats, deadlines and queue, would add
        nothing but its cost to a put's path."""
        if self._read_in_turn or self._stopped:
            return
        self._mark_turn()
        tick = True
        try:
            tick = self._read()
        except Exception:
            logger.exception("a Raft read failed")
        if tick or self._until_due() <= 0:
            self._run()

    def soon(self) -> None:
        """Tick at the loop's next turn, once however often this is called before it."""
        if not self._pending and not self._stopped:
            self._pending = True
            self._loop.call_soon(self._run)

    def due_within(self, delay: float) -> None:
        """Tick within `delay` seconds at the latest (a heartbeat now due sooner than the timer
        set after the last tick), however long ``until_due`` said then."""
        if self._stopped or self._pending:
            return
        due = self._loop.time() + delay
        if self._timer is not None and self._timer.when() <= due:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(delay, self._run)
        if self._due is not None:
            self._due = (due, self._loop.time(), time.thread_time())

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()

    def _run(self) -> None:
        self._pending = False
        if self._stopped:
            return
        self._check_lateness()
        read = False
        try:
            read = self._tick()
        except Exception:
            # pysyncobj's tick thread logs a failed tick and ticks again
            logger.exception("a Raft tick failed")
        if self._stopped:
            return
        self._mark_turn()
        delay = 0.0 if read else self._until_due()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self._loop.time()
        self._due = (now + max(delay, 0.0), now, time.thread_time())
        if delay <= 0:
            self.soon()
        else:
            self._timer = self._loop.call_later(delay, self._run)

    def _check_lateness(self) -> None:
        if self._due is None:
            return
        due, set_at, cpu_at_set = self._due
        now = self._loop.time()
        if now - due >= LATE_S:
            self.late.note(now - due, now - set_at, time.thread_time() - cpu_at_set)

    def _mark_turn(self) -> None:
        if not self._read_in_turn:
            self._read_in_turn = True
            self._loop.call_soon(self._next_turn)   # runs after this turn's callbacks

    def _next_turn(self) -> None:
        self._read_in_turn = False

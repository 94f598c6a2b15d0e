"""engine.raft.ticking: pysyncobj's poller mirrored on an asyncio loop, and the ticks it runs.

Real sockets (socket pairs) and a real loop; the tick is what pysyncobj's
would be at its end: a poll that never waits, dispatching to the callbacks
subscribed.
"""

import asyncio
import logging
import os
import re
import socket
import time

import pytest
from pysyncobj.poller import POLL_EVENT_TYPE, PollPoller

from raftq.engine.raft.ticking import LoopTicker, WatchedPoller

READABLE = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
NOT_DUE = 3600.0


class Ticks:
    """A poller, a loop ticking it, and what each tick's poll dispatched."""

    def __init__(self, until_due=NOT_DUE):
        self.poller = WatchedPoller(PollPoller())
        self.loop = asyncio.new_event_loop()
        self.ticks = 0
        self.reads = 0      # reads and ticks whose poll handed something on
        self.read_calls = 0
        self.events: list[tuple[str, int]] = []
        self.ticker = LoopTicker(self.loop, self._tick, lambda: until_due, self._read)

    def _poll(self):
        self.poller.poll(0)
        self.reads += self.poller.dispatched > 0
        return self.poller.news

    def _tick(self):
        self.ticks += 1
        return self._poll()      # as engine.raft.node.RaftNode.tick

    def _read(self):
        self.read_calls += 1
        return self._poll()      # as engine.raft.node.RaftNode.read

    def reader(self, name, sock, routine=()):
        """A callback that reads the socket; each byte it reads is a message,
        routine if it is in `routine` (told to the poller as RaftNode does)."""
        def on_event(descr, event):
            self.events.append((name, event))
            if event & POLL_EVENT_TYPE.READ:
                for byte in sock.recv(4096):
                    self.poller.heard(bytes([byte]) in routine)
        return on_event

    def watch(self):
        self.poller.watch(self.loop, self.ticker.ready)

    def turns(self, seconds=0.05):
        self.loop.run_until_complete(asyncio.sleep(seconds))

    def until(self, predicate, seconds=10.0):
        async def wait():
            while not predicate():
                await asyncio.sleep(0.001)
        self.loop.run_until_complete(asyncio.wait_for(wait(), seconds))

    def close(self):
        self.ticker.stop()
        self.poller.unwatch()
        self.loop.close()


@pytest.fixture
def ticks():
    made = []

    def make(**kwargs):
        made.append(Ticks(**kwargs))
        return made[-1]
    yield make
    for t in made:
        t.close()


@pytest.fixture
def pairs():
    opened = []

    def make():
        pair = socket.socketpair()
        for s in pair:
            s.setblocking(False)
        opened.extend(pair)
        return pair
    yield make
    for s in opened:
        s.close()


def test_a_socket_subscribed_before_the_loop_watches_wakes_a_tick(ticks, pairs):
    t = ticks()
    ours, theirs = pairs()
    t.poller.subscribe(ours.fileno(), t.reader("ours", ours), READABLE)
    t.watch()
    theirs.send(b"x")
    t.until(lambda: t.events)
    assert t.events == [("ours", POLL_EVENT_TYPE.READ)]


def test_sockets_ready_together_cost_one_read(ticks, pairs):
    """The read's poll reads every ready socket: the loop's reports of the
    others in the same turn start no read or tick of their own."""
    t = ticks()
    t.watch()
    for i in range(10):
        ours, theirs = pairs()
        t.poller.subscribe(ours.fileno(), t.reader(i, ours), READABLE)
        theirs.send(b"x")
    t.until(lambda: len(t.events) == 10)
    t.turns()
    assert (t.reads, t.read_calls) == (1, 1)
    # the read that read them all, and the tick its news asks for
    assert t.ticks == 1
    assert sorted(name for name, _ in t.events) == list(range(10))


def test_a_socket_closed_before_it_is_unsubscribed_leaves_the_loop_working(ticks, pairs):
    """pysyncobj closes a connection's socket, then unsubscribes it; a new
    socket that takes the closed one's number is watched afresh."""
    t = ticks()
    t.watch()
    old, old_peer = pairs()
    number = old.fileno()
    t.poller.subscribe(number, t.reader("old", old), READABLE | POLL_EVENT_TYPE.WRITE)
    old.close()
    t.poller.unsubscribe(number)
    new, new_peer = pairs()
    assert number in (new.fileno(), new_peer.fileno()), "the kernel reuses the lowest free descriptor"
    ours, theirs = (new, new_peer) if new.fileno() == number else (new_peer, new)
    t.poller.subscribe(number, t.reader("new", ours), READABLE)
    theirs.send(b"x")
    t.until(lambda: ("new", POLL_EVENT_TYPE.READ) in t.events)


def test_a_new_socket_on_a_number_never_unsubscribed_is_watched(ticks, pairs):
    """A socket closed without unsubscribing, then a new one subscribed on its
    number with another callback: the loop watches the new one."""
    t = ticks()
    t.watch()
    old, _ = pairs()
    number = old.fileno()
    t.poller.subscribe(number, t.reader("old", old), READABLE)
    old.close()
    new, new_peer = pairs()
    ours, theirs = (new, new_peer) if new.fileno() == number else (new_peer, new)
    assert ours.fileno() == number, "the kernel reuses the lowest free descriptor"
    t.poller.subscribe(number, t.reader("new", ours), READABLE)
    theirs.send(b"x")
    t.until(lambda: ("new", POLL_EVENT_TYPE.READ) in t.events)


def test_write_interest_wakes_the_loop_only_while_subscribed(ticks, pairs):
    """pysyncobj asks to hear when a socket is writable only while it has
    bytes to send: once it stops asking, a writable socket wakes nothing."""
    t = ticks()
    t.watch()
    ours, _ = pairs()
    number = ours.fileno()

    def on_event(descr, event):
        t.events.append(("ours", event))
        t.poller.subscribe(number, on_event, READABLE)   # sent everything: reading only, as pysyncobj does

    t.poller.subscribe(number, on_event, READABLE | POLL_EVENT_TYPE.WRITE)
    t.until(lambda: t.events)
    t.turns()
    assert t.events == [("ours", POLL_EVENT_TYPE.WRITE)]
    assert (t.reads, t.ticks) == (1, 1)      # the read that heard it, the tick that acts on it


def test_a_read_that_brought_news_is_followed_by_a_tick_that_acts_on_it(ticks, pairs):
    """What a read brought that is not routine (a vote to cast, the lead
    handed over) is acted on by a tick, at once, not at the next heartbeat or
    election deadline."""
    t = ticks()
    ours, theirs = pairs()
    t.poller.subscribe(ours.fileno(), t.reader("ours", ours), READABLE)
    t.watch()
    theirs.send(b"x")
    t.until(lambda: t.ticks >= 1)
    t.turns()
    assert (t.reads, t.ticks) == (1, 1)


def test_a_read_of_only_routine_messages_runs_no_tick(ticks, pairs):
    """An append answered, an answer counted: all done in the read, so the
    next tick waits until it is due (a lone put's path has no tick)."""
    t = ticks()
    ours, theirs = pairs()
    t.poller.subscribe(ours.fileno(), t.reader("ours", ours, routine=(b"h",)), READABLE)
    t.watch()
    theirs.send(b"hh")
    t.until(lambda: t.events)
    t.turns()
    assert (t.reads, t.ticks) == (1, 0)


def test_one_message_that_is_news_among_routine_ones_is_acted_on_at_once(ticks, pairs):
    t = ticks()
    ours, theirs = pairs()
    t.poller.subscribe(ours.fileno(), t.reader("ours", ours, routine=(b"h",)), READABLE)
    t.watch()
    theirs.send(b"hvh")      # a heartbeat, a vote request, a heartbeat: one read
    t.until(lambda: t.ticks >= 1)
    t.turns()
    assert (t.reads, t.ticks) == (1, 1)


def test_routine_on_one_socket_hides_no_news_on_another(ticks, pairs):
    t = ticks()
    routine, routine_peer = pairs()
    news, news_peer = pairs()
    t.poller.subscribe(routine.fileno(), t.reader("routine", routine, routine=(b"h",)), READABLE)
    t.poller.subscribe(news.fileno(), t.reader("news", news, routine=(b"h",)), READABLE)
    t.watch()
    news_peer.send(b"v")
    routine_peer.send(b"h")
    t.until(lambda: t.ticks >= 1)
    t.turns()
    assert (t.reads, t.ticks) == (1, 1)


def test_with_nothing_ready_a_tick_runs_when_it_is_due(ticks):
    t = ticks(until_due=0.005)
    t.watch()
    t.ticker.soon()
    t.until(lambda: t.ticks >= 3)


def test_a_wake_up_runs_one_tick_however_often_it_is_asked(ticks):
    t = ticks()
    t.watch()
    for _ in range(5):
        t.ticker.soon()
    t.turns()
    assert t.ticks == 1


def test_no_tick_runs_once_stopped_and_the_loop_forgets_the_sockets(ticks, pairs):
    t = ticks(until_due=0.001)
    ours, theirs = pairs()
    t.poller.subscribe(ours.fileno(), t.reader("ours", ours), READABLE)
    t.watch()
    t.ticker.soon()
    t.until(lambda: t.ticks >= 1)
    t.ticker.stop()
    t.poller.unwatch()
    ticked = t.ticks
    theirs.send(b"x")
    t.turns()
    assert t.ticks == ticked and t.events == []
    assert os.read(ours.fileno(), 10) == b"x"    # unread: nothing polled it


def hold_the_loop(t, seconds, *, on_cpu: bool):
    """A callback on `t`'s loop that keeps it from ticking for `seconds`: spinning (the engine's own
    work) or asleep in a system call (as a slow disk would)."""
    def hold():
        if on_cpu:
            until = time.thread_time() + seconds
            while time.thread_time() < until:
                pass
        else:
            time.sleep(seconds)
    t.loop.call_soon(hold)


@pytest.mark.parametrize("on_cpu", [True, False], ids=["on-the-cpu", "off-the-cpu"])
def test_a_tick_held_past_its_time_is_counted_and_logged_with_where_the_time_went(ticks, caplog, on_cpu):
    t = ticks(until_due=0.02)
    t.watch()
    t.ticker.soon()
    t.until(lambda: t.ticks >= 2)
    assert t.ticker.late.count == 0           # ticks on time count nothing
    hold_the_loop(t, 0.4, on_cpu=on_cpu)
    with caplog.at_level(logging.WARNING, logger="raftq.engine.raft.ticking"):
        t.turns(0.1)
    assert t.ticker.late.count == 1 and t.ticker.late.seconds > 0.3
    [line] = [r.getMessage() for r in caplog.records if "ran late" in r.getMessage()]
    on, off = (int(ms) for ms in re.search(r"on the CPU (\d+) ms .* off it (\d+) ms", line).groups())
    # spinning, the thread may also wait for a core on a busy machine; asleep, it spends no CPU
    assert (on >= 300) if on_cpu else (off >= 300 and on < 100), line

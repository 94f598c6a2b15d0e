"""When each queue next has a timer to fire, kept as commands change queues.

A tick fires the timers of every queue that has one due, and the leader asks
``next_timer`` to know when to send the next tick.  Asking every queue made
both cost the number of queues: with 10 000 queues, 50-250 ms on the engine's
loop for each question, asked after every command the leader applied.  This
index answers both from the queues that are due alone.

Every queue a command changes first has its due timers fired (the lazy timer
rule, ``StateMachine._advance``) or is new, and is ``note``-d then.  The
index asks the noted queues their next timer again only when it is asked
itself (a tick, the leader's ``next_timer`` read): once for all the entries
applied in between, which mostly name the same few queues, rather than once
an entry.  Whenever it answers it is exact, so which queues a tick visits
depends on the replicated state alone, never on a replica's history.

It is derived state, never in a snapshot: ``rebuild`` makes it from the
queues after a restore.
"""

from sortedcontainers import SortedList

from .queue import PARKED_RETRY_MS


class DueIndex:
    __slots__ = ("at", "by_time", "parked", "changed")

    def __init__(self):
        self.at = {}                  # queue name -> log time of its next timer (Queue.next_timer)
        self.by_time = SortedList()   # (log time, queue name)
        # Queues whose dead letters wait for room in their dead-letter queue:
        # every tick tries them again.
        self.parked = set()
        self.changed = {}             # queue name -> Queue, changed since the index last answered

    def note(self, queue) -> None:
        """`queue` may have other timers now."""
        self.changed[queue.name] = queue

    def forget(self, name: str) -> None:
        """The queue is deleted: it has no timers."""
        self.changed.pop(name, None)
        self._place(name, None, False)

    def rebuild(self, queues) -> None:
        self.at.clear()
        self.by_time.clear()
        self.parked.clear()
        self.changed.clear()
        for queue in queues:
            self.note(queue)
        self.settle()

    def earliest(self, clock: int):
        """The earliest log time at which some queue has a timer to fire, or None; a parked dead
        letter is tried again PARKED_RETRY_MS after `clock`."""
        self.settle()
        times = [self.by_time[0][0]] if self.by_time else []
        if self.parked:
            times.append(clock + PARKED_RETRY_MS)
        return min(times, default=None)

    def due(self, clock: int) -> set:
        """The names of the queues with a timer due at log time `clock`, or dead letters parked."""
        self.settle()
        names = set(self.parked)
        for time, name in self.by_time:
            if time > clock:
                break
            names.add(name)
        return names

    def settle(self) -> None:
        """Ask each queue changed since the index last answered when its next timer is."""
        for name, queue in self.changed.items():
            self._place(name, queue.next_timer(), bool(queue.outbox))
        self.changed.clear()

    def _place(self, name: str, time, parked: bool) -> None:
        old = self.at.get(name)
        if old != time:   # most changes leave a queue's earliest timer where it was
            if old is not None:
                del self.at[name]
                self.by_time.remove((old, name))
            if time is not None:
                self.at[name] = time
                self.by_time.add((time, name))
        if parked:
            self.parked.add(name)
        else:
            self.parked.discard(name)

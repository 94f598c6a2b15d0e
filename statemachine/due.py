"""When each queue next has a timer to fire, kept as commands change queues.

A tick fires the timers of every queue that has one due, and the leader asks
``next_timer`` to know when to send the next tick.  Asking every queue made
both cost the number of queues: with 10 000 queues, 50-250 ms on the engine's
loop for each question, asked after every command the leader applied.  This
index answers both with the queues that are due alone.

It is derived state, never in a snapshot: ``rebuild`` makes it from the
queues after a restore.  It is exact after every command: every queue a
command changes first has its due timers fired (the lazy timer rule, see
``StateMachine._advance``) or is new, and is ``note``-d then; ``settle``, run
once the command is applied, asks each noted queue its next timer again.  So
which queues a tick visits depends on the replicated state alone, never on a
replica's history.
"""

from sortedcontainers import SortedList


class DueIndex:
    __slots__ = ("at", "by_time", "parked", "changed")

    def __init__(self):
        self.at = {}                  # queue name -> log time of its next timer (Queue.next_timer)
        self.by_time = SortedList()   # (log time, queue name)
        # Queues whose dead letters wait for room in their dead-letter queue:
        # every tick tries them again.
        self.parked = set()
        self.changed = {}             # queue name -> Queue, changed by the command being applied

    def note(self, queue) -> None:
        """`queue` may have new timers once the command being applied is done."""
        self.changed[queue.name] = queue

    def settle(self) -> None:
        """Ask each queue the command changed when its next timer is."""
        for name, queue in self.changed.items():
            self._place(name, queue.next_timer(), bool(queue.outbox))
        self.changed.clear()

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

    def earliest(self):
        """The log time of the earliest timer of any queue, or None."""
        return self.by_time[0][0] if self.by_time else None

    def due(self, clock: int) -> set:
        """The names of the queues with a timer due at log time `clock`, or dead letters parked."""
        names = set(self.parked)
        for time, name in self.by_time:
            if time > clock:
                break
            names.add(name)
        return names

    def _place(self, name: str, time, parked: bool) -> None:
        old = self.at.pop(name, None)
        if old is not None:
            self.by_time.remove((old, name))
        if time is not None:
            self.at[name] = time
            self.by_time.add((time, name))
        if parked:
            self.parked.add(name)
        else:
            self.parked.discard(name)

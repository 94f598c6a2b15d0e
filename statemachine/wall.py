"""The wall time of a moment of log time, for what is shown, never for what is decided.

Log time pauses while no node leads (docs/guarantees.md), so after a whole
cluster was down a message's log time lags the wall clock by the outage. What
SQS shows its clients (a message's SentTimestamp, its first receive) is wall
time, as AWS's is. The leader carries its wall clock in its ticks (``wall_ms``
beside ``now_ms``, read together); each tick whose wall clock stands more than
TOLERANCE_MS off the last one recorded starts an epoch: from its log time on,
wall time is log time plus its offset. Leases, delays, TTLs and windows never
read it.

The epochs are replicated state (the ticks are log entries), so every replica
shows the same wall time for a moment, before and after a restart. At most
MAX_EPOCHS are kept, the oldest dropped: a moment older than the oldest kept is
shown with that epoch's offset.
"""

import bisect

TOLERANCE_MS = 100
MAX_EPOCHS = 1024


class WallTimes:
    def __init__(self):
        self.starts: list[int] = []      # log time at which each epoch begins, ascending
        self.offsets: list[int] = []     # its wall time minus its log time

    def record(self, now_ms: int, wall_ms: int) -> None:
        """A tick's stamps, read together by its leader."""
        offset = wall_ms - now_ms
        if self.offsets and abs(offset - self.offsets[-1]) <= TOLERANCE_MS:
            return
        if self.starts and now_ms <= self.starts[-1]:
            # the same moment of log time, seen again: the later reading wins
            self.offsets[-1] = offset
            return
        self.starts.append(now_ms)
        self.offsets.append(offset)
        if len(self.starts) > MAX_EPOCHS:
            del self.starts[0], self.offsets[0]

    def wall_ms(self, log_ms: int) -> int:
        """The wall time of the moment `log_ms` of log time (itself before any epoch was recorded)."""
        if not self.starts:
            return log_ms
        at = max(0, bisect.bisect_right(self.starts, log_ms) - 1)
        return log_ms + self.offsets[at]

    def to_state(self) -> list:
        return [list(self.starts), list(self.offsets)]

    @classmethod
    def from_state(cls, state) -> "WallTimes":
        walls = cls()
        if state:
            walls.starts, walls.offsets = list(state[0]), list(state[1])
        return walls

"""The scrubber: every live entry an engine keeps is read back from disk and checked in the
background, so that a damaged record is found and repaired from a replica
(``engine.raft.repair``) before a client needs it -- and before a second
replica's copy of it rots too (docs/guarantees.md, "Storage faults: the read side").

A pass walks the live entries in index order (the entries the snapshot
carries, the journal's kept entries, the log: ``Consensus.scrub_after``),
paced so that it takes about ``pass_s`` (``--scrub-pass-hours``, a day by
default) but never reads more than ``MAX_BYTES_PER_S``: a small share of
any disk, and nothing at all on the put path. It reads in bursts of at most
``BURST_BYTES`` on the engine's loop, one entry at least (a read of a
record from the page cache costs about what a heartbeat's apply does), and
sleeps between them; a small log is read an entry at a time, minutes
apart, so an idle engine hardly wakes for it. A pass that ends early waits
for the rest of its time before the next begins.
"""

from __future__ import annotations

import asyncio
import time

from .background import Background
from .raft.consensus import Consensus

MAX_BYTES_PER_S = 4 << 20
BURST_BYTES = 1 << 20
# A burst reads what this many seconds of the pass's pace allow (at least one entry).
BURST_S = 1.0


class Scrubber(Background):
    """Scrubs `consensus`'s live entries, a pass every `pass_hours`; ``passes`` and
    ``checked_bytes`` count what it did (for /metrics)."""

    def __init__(self, consensus: Consensus, pass_hours: float):
        self._consensus = consensus
        self._pass_s = pass_hours * 3600
        self.passes = 0
        self.checked_bytes = 0

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            await self._one_pass()
            self.passes += 1
            await asyncio.sleep(max(0.0, self._pass_s - (time.monotonic() - started)))

    async def _one_pass(self) -> None:
        rate = min(max(self._consensus.scrub_bytes(), 1) / self._pass_s, MAX_BYTES_PER_S)
        burst_bytes = min(rate * BURST_S, BURST_BYTES)
        cursor, burst = 0, 0
        while (checked := self._consensus.scrub_after(cursor)) is not None:
            index, length = checked
            cursor = index + 1
            burst += length
            self.checked_bytes += length
            if burst >= burst_bytes:
                await asyncio.sleep(burst / rate)
                burst = 0
        if burst:
            await asyncio.sleep(burst / rate)

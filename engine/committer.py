"""Group commit: many concurrent commands, one Raft log entry.

A Raft round trip and an fsync cost the same for one command as for a
thousand, so the HTTP layer never calls Raft per request.  Each request's
command is encoded once and queued; at the end of the current event-loop
iteration everything queued is packed into one entry (bounded by count and
bytes) and proposed, as long as fewer than ``max_in_flight`` entries are
waiting for their commit.  A lone request therefore leaves at once, and
under load requests pile up behind the in-flight entries and share the next
one.  When the entry is applied, each request is answered from its own slot
of the entry's result list (``_answer``: a result, the error its answer came
to, or a future of the result), and the entry's slot in flight is free.

Commands are stamped with the leader's log time for one term (see
``engine.node.LogClock``), so an entry only ever packs commands stamped in the
same term, and is proposed for that term.
"""

import asyncio
from collections import deque
from typing import Callable

from .outcome import Committed, CommitError


class Packing:
    """How commands were packed into entries, as cumulative histogram counts (for /metrics)."""
    COMMAND_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
    BYTE_BOUNDS = (256, 1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20)

    def __init__(self):
        self.commands = [0] * len(self.COMMAND_BOUNDS)
        self.bytes = [0] * len(self.BYTE_BOUNDS)
        self.entries = 0
        self.commands_sum = 0
        self.bytes_sum = 0

    def add(self, commands: int, size: int) -> None:
        self.entries += 1
        self.commands_sum += commands
        self.bytes_sum += size
        for counts, bounds, value in ((self.commands, self.COMMAND_BOUNDS, commands),
                                      (self.bytes, self.BYTE_BOUNDS, size)):
            for slot, bound in enumerate(bounds):
                if value <= bound:
                    counts[slot] += 1

    def as_dict(self) -> dict:
        return {"entries": self.entries,
                "commands": {"bounds": self.COMMAND_BOUNDS, "counts": self.commands, "sum": self.commands_sum},
                "bytes": {"bounds": self.BYTE_BOUNDS, "counts": self.bytes, "sum": self.bytes_sum}}


def cbor_array_header(length: int) -> bytes:
    """CBOR major type 4 header: lets an entry be the concatenation of encoded commands."""
    if length < 24:
        return bytes([0x80 | length])
    if length < 1 << 8:
        return bytes([0x98, length])
    if length < 1 << 16:
        return b"\x99" + length.to_bytes(2, "big")
    return b"\x9a" + length.to_bytes(4, "big")


# The largest log entry: one command may be this large (a 16 MiB batch put is
# one all-or-nothing command). The Raft port's frame limit follows from it
# (engine.raft.wire.max_frame_bytes; docs/security.md gives both).
MAX_ENTRY_BYTES = 17 << 20


def _answer(future: asyncio.Future, answer, index: int) -> None:
    """Answer one command of the entry at `index` from its slot of the results: its result; the
    error its answer came to (a CommitError: the entry applied, but what answers the command
    could not be read); or a future of its result (its answer waits for a damaged body's
    repair: ``engine.node``), which answers it once done -- the entry's slot in flight is free
    at once either way."""
    if isinstance(answer, BaseException):
        future.set_exception(answer)
    elif isinstance(answer, asyncio.Future):
        def settle(done: asyncio.Future) -> None:
            if future.done():
                return
            if done.cancelled():
                future.set_exception(CommitError("internal"))
            elif done.exception() is not None:
                future.set_exception(done.exception())
            else:
                future.set_result(Committed(done.result(), index))
        answer.add_done_callback(settle)
    else:
        future.set_result(Committed(answer, index))


class GroupCommitter:
    def __init__(self, propose: Callable[[bytes, int, Callable], None], *,
                 max_commands: int = 2_000, pack_bytes: int = 1 << 20,
                 max_entry_bytes: int = MAX_ENTRY_BYTES, max_in_flight: int = 4,
                 before_packing: Callable[[], None] | None = None):
        """`before_packing`: called before queued commands are packed, and may queue more
        (behind them): the receives that ride in the entry of the puts they wait for."""
        self._propose = propose
        self._before_packing = before_packing
        self.max_commands = max_commands
        # Entries are packed up to pack_bytes, so that one replication round
        # stays short; a single command may be larger (a 16 MiB batch put is
        # one all-or-nothing command) up to max_entry_bytes.
        self.pack_bytes = pack_bytes
        self.max_entry_bytes = max_entry_bytes
        self.max_in_flight = max_in_flight
        self.packing = Packing()
        self._pending: deque[tuple[bytes, int, asyncio.Future]] = deque()
        self._in_flight = 0
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def enqueue(self, encoded: bytes, term: int) -> asyncio.Future:
        """Queue a stamped command for the next entry of ``term``: a future of
        its ``Committed`` once that entry is applied here, or CommitError.

        ``encoded`` is the command as CBOR, ``term`` the term it was stamped in.
        """
        loop = self._loop = self._loop or asyncio.get_running_loop()
        future = loop.create_future()
        if len(encoded) + 8 > self.max_entry_bytes:
            future.set_exception(CommitError("too_large"))
            return future
        self._pending.append((encoded, term, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    @property
    def backlog(self) -> int:
        return len(self._pending)

    def _flush(self) -> None:
        if self._before_packing is not None and self._in_flight < self.max_in_flight:
            self._before_packing()
        self._flush_scheduled = False
        while self._pending and self._in_flight < self.max_in_flight:
            items, futures, size, term = [], [], 0, None
            while self._pending and len(items) < self.max_commands:
                encoded, stamped_in, future = self._pending[0]
                if items and (size + len(encoded) > self.pack_bytes or stamped_in != term):
                    break
                self._pending.popleft()
                if future.cancelled():
                    # The caller gave up before the command reached the log, so
                    # it never will: nothing to answer, nothing applied.
                    continue
                term = stamped_in
                items.append(encoded)
                futures.append(future)
                size += len(encoded)
            if not items:
                continue
            entry = cbor_array_header(len(items)) + b"".join(items)
            self._in_flight += 1
            self.packing.add(len(items), len(entry))
            self._propose(entry, term, lambda result, err, f=futures: self._resolve(f, result, err))

    def _resolve(self, futures: list, applied, err) -> None:
        """`applied` is what the node's apply returned: (log index, one answer per command).
        Called where the entry was applied (a tick, or a read of the followers' answers), or
        where it was refused: the futures are answered there, which only schedules their
        waiters, and what is queued is packed in a turn of its own, as it is when queued."""
        self._in_flight -= 1
        if err is None and (not isinstance(applied, tuple) or len(applied[1]) != len(futures)):
            err = "internal"
        for slot, future in enumerate(futures):
            if future.done():
                continue
            if err is not None:
                future.set_exception(CommitError(err))
            else:
                _answer(future, applied[1][slot], applied[0])
        if self._pending and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def fail_pending(self, code: str) -> None:
        """Refuse what has not reached the log yet (lost leadership, shutdown)."""
        while self._pending:
            _, _, future = self._pending.popleft()
            if not future.done():
                future.set_exception(CommitError(code))

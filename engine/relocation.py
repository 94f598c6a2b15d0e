"""Live bodies copied forward out of mostly-dead log entries, so that disk use follows live bytes (issue 47).

A stored body is a reference into the log entry that carried it, and
compaction keeps every entry a reference names, whole (docs/architecture.md,
"Where a stored body lives"): one 100-byte message left unacknowledged pins
its whole entry, up to a megabyte with group commit. A slow or dead-lettered
queue with one such message per entry pins thousands of times its bytes.

While this engine leads its group, and once every node runs a release that
applies ``relocate`` (``allow``: the first front asks the nodes,
api/features.py), a pass of the relocator:

1. adds up, a part of the state at a time between turns of the loop, the body
   bytes each live entry up to the last snapshot still serves: the entries
   compaction keeps (the newer ones are the log, bounded by compaction itself,
   and mostly still being consumed);
2. picks those where copying would take less than half of the record they
   take on disk (their live bytes and MOVE_BYTES a message, what a move
   costs in a relocate entry beside its body), oldest first, up to
   PASS_READ_BYTES of records;
3. finds the stored and staged messages whose references name them, reads
   each entry once (past the cache of entries receives read again), and
   proposes ``relocate`` commands that carry those bodies' bytes, up to
   COMMAND_BODY_BYTES each (group commit's packing size: a full one travels
   in an entry of its own, whose bodies are then all it holds) and
   COMMAND_MOVES (no longer to apply than the widest put);
4. applied alike on every replica, each moves the references that still name
   exactly what the pass read to the copies in its own entry
   (statemachine/machine.py ``_relocate``): a message acknowledged, moved or
   replaced meanwhile keeps what it holds. An old entry that serves nothing
   any more is dropped by the next compaction.

A relocate entry starts with all of its bodies live, and is copied out of only
once more than half of it died: each copy frees more than it writes, so the
bytes copied stay below the bytes written to the log, however long a message
stays. An entry of empty bodies, whose moves would cost more than it takes,
is never copied. The work is paced (entries read at READ_BYTES_PER_S at
most) and off the put path: one command in flight at a time, each a single
slot of group commit. A pass that finds nothing to move is repeated only
after a new snapshot, or RECHECK_S later if entries were applied meanwhile:
an idle group costs nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict

from .background import Background
from .outcome import CommitError

logger = logging.getLogger(__name__)

PASS_S = 1.0                       # between two passes while there is work
RECHECK_S = 60.0                   # between passes that found none, while entries are applied
SCAN_ROWS = 8_192                  # stored messages scanned per turn of the loop
LIVE_SHARE = 0.5                   # an entry whose copy takes less than this share of its record is copied out of
MOVE_BYTES = 32                    # what one move takes in a relocate entry besides its body (at most ~25)
PASS_READ_BYTES = 64 * 1024 * 1024
READ_BYTES_PER_S = 16 * 1024 * 1024
COMMAND_BODY_BYTES = 1024 * 1024   # engine/committer.py's pack_bytes
COMMAND_MOVES = 10_000             # as many as the widest put's messages: as long to apply


class Relocator(Background):
    def __init__(self, node):
        self._node = node
        self.allowed = False
        # what relocate commands moved, for /metrics
        self.commands = self.bodies = self.bytes = 0
        # (snapshot index, applied index, when) of the last pass that found nothing to move
        self._quiet: tuple[int | None, int, float] | None = None

    def allow(self, allowed: bool) -> None:
        """Whether every node runs a release that applies ``relocate`` (the fronts ask them)."""
        self.allowed = allowed

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(PASS_S)
            if not (self.allowed and self._node.is_leader() and self._due()):
                continue
            try:
                await self.run_pass()
            except CommitError as exc:
                logger.info("relocation pass stopped: %s", exc.code)   # the lead moved; the next leader's goes on
            except Exception:
                logger.exception("relocation pass failed")

    def _due(self) -> bool:
        if self._quiet is None:
            return True
        up_to, applied, at = self._quiet
        consensus = self._node.consensus
        return consensus.snapshot_index() != up_to or (
            consensus.applied_index() != applied and time.monotonic() - at >= RECHECK_S)

    async def run_pass(self) -> int:
        """One pass (see the module's docstring): how many bodies it moved."""
        consensus = self._node.consensus
        up_to, applied = consensus.snapshot_index(), consensus.applied_index()
        chosen = self._choose(await self._copy_bytes(up_to)) if up_to is not None else []
        if not chosen:
            self._quiet = (up_to, applied, time.monotonic())
            return 0
        self._quiet = None
        moved = 0
        pace = _Pace(READ_BYTES_PER_S)
        command = _Command()
        for index, holders in (await self._holders(chosen)).items():
            try:
                entry = consensus.stored_entry(index)
            except LookupError:
                continue        # compacted away since it was chosen: nothing named it any more
            except Exception as exc:   # unreadable: its bodies stay where they are
                logger.warning("relocation: entry %d not read (%s); its bodies stay", index, exc)
                continue
            for holder, ref in holders:
                raw = entry[ref.offset:ref.offset + ref.length]
                if len(raw) != ref.length:
                    logger.warning("relocation: entry %d holds no %d bytes at %d", index, ref.length, ref.offset)
                    continue
                command.add(holder, ref, raw)
                if command.body_bytes >= COMMAND_BODY_BYTES or command.moves >= COMMAND_MOVES:
                    moved += await self._propose(command)
                    command = _Command()
            await pace.read(len(entry))
        if command.moves:
            moved += await self._propose(command)
        return moved

    def _choose(self, copies: dict[int, int]) -> list[int]:
        """The entries to copy out of, oldest first: those whose copy would take under LIVE_SHARE of
        what they take on disk, up to PASS_READ_BYTES of them."""
        chosen, read = [], 0
        for index in sorted(copies):
            size = self._node.consensus.stored_bytes(index)
            if size is None or copies[index] >= LIVE_SHARE * size:
                continue
            if chosen and read + size > PASS_READ_BYTES:
                break
            chosen.append(index)
            read += size
        return chosen

    async def _copy_bytes(self, up_to: int) -> dict[int, int]:
        """What copying the live bodies of each live entry up to `up_to` out of it would take, by its
        log index: their bytes, and MOVE_BYTES each."""
        totals: dict[int, int] = {}
        await self._each_part(
            lambda name, rows, seq: rows.live_bytes_by_entry(seq, SCAN_ROWS, up_to, totals, MOVE_BYTES))
        for *_, ref in self._node.machine.staging.references():
            if ref.index <= up_to:
                totals[ref.index] = totals.get(ref.index, 0) + ref.length + MOVE_BYTES
        return totals

    async def _holders(self, chosen: list[int]) -> dict[int, list]:
        """Each chosen entry's messages, by its index, oldest first: (("queue", name, seq) or
        ("stage", token, chunk, position), the reference)."""
        wanted = set(chosen)
        by_index: dict[int, list] = {index: [] for index in chosen}

        def scan(name, rows, seq):
            found: list = []
            after = rows.references_into(seq, SCAN_ROWS, wanted, found)
            for held, ref in found:
                by_index[ref.index].append((("queue", name, held), ref))
            return after
        await self._each_part(scan)
        for token, chunk, at, ref in self._node.machine.staging.references():
            if ref.index in wanted:
                by_index[ref.index].append((("stage", token, chunk, at), ref))
        return by_index

    async def _each_part(self, step) -> None:
        """``step(name, rows, seq)`` over every queue's stored messages, SCAN_ROWS at a time from
        `seq`, giving the loop a turn between parts; a queue deleted or replaced meanwhile is left."""
        machine = self._node.machine
        for name in list(machine.queues):
            queue = machine.queues.get(name)
            seq = None if queue is None else queue.rows.first_seq()
            while seq is not None and machine.queues.get(name) is queue:
                seq = step(name, queue.rows, seq)
                await asyncio.sleep(0)

    async def _propose(self, command: "_Command") -> int:
        result = (await self._node.submit(command.encoded())).result
        if "error" in result:
            raise RuntimeError(f"relocate refused: {result.get('message', result['error'])}")
        self.commands += 1
        self.bodies += result["moved"]
        self.bytes += result["bytes"]
        return result["moved"]


class _Command:
    """One ``relocate`` command being built: the moves by queue, and the staged ones."""

    def __init__(self):
        self.queues: dict[str, list] = defaultdict(list)
        self.stages: list = []
        self.moves = 0
        self.body_bytes = 0

    def add(self, holder: tuple, ref, raw: bytes) -> None:
        reference = [ref.index, ref.offset, ref.length, ref.kind, bytes(raw)]
        if holder[0] == "queue":
            self.queues[holder[1]].append([holder[2], *reference])
        else:
            self.stages.append([*holder[1:], *reference])
        self.moves += 1
        self.body_bytes += ref.length

    def encoded(self) -> dict:
        command = {"op": "relocate", "queues": [[name, moves] for name, moves in self.queues.items()]}
        if self.stages:
            command["stages"] = self.stages
        return command


class _Pace:
    """Sleeps as needed so that what is read stays under `rate` bytes a second."""

    def __init__(self, rate: float):
        self._rate = rate
        self._started = time.monotonic()
        self._read = 0

    async def read(self, size: int) -> None:
        self._read += size
        ahead = self._read / self._rate - (time.monotonic() - self._started)
        await asyncio.sleep(max(0.0, ahead))

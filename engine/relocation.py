"""Live bodies copied forward out of mostly-dead log entries, so that disk use follows live bytes (issue 47).

A stored body is a reference into the log entry that carried it, and
compaction keeps every entry a reference names, whole (docs/architecture.md,
"Where a stored body lives"): one 100-byte message left unacknowledged pins
its whole entry, up to a megabyte with group commit. A slow or dead-lettered
queue with one such message per entry pins thousands of times its bytes.

So compaction gains a step. While this engine leads its group, and once every
node runs a release that applies ``relocate`` (``allow``: the first front asks
the nodes, api/features.py):

1. the snapshot writer's child, once it has written the snapshot, plans
   (``plan``, on its copy of the state, at the snapshot writer's low
   priority, so that a walk over millions of messages costs the engine's
   loop nothing), if the entries this compaction keeps take more than
   twice what the stored messages count and SLACK_BYTES: it adds up what
   copying the live bodies of each entry up to the snapshot out of it would
   take (their bytes, MOVE_BYTES a message: what a move costs in a relocate
   entry beside its body, and ENTRY_BYTES: what the entry takes around its
   moves), picks the entries where that is under half of the record they
   take on disk -- the entries this compaction keeps; newer ones are the
   log, bounded by compaction itself -- oldest first, up to PLAN_READ_BYTES
   of records, and writes their stored and staged messages with their
   references to ``relocation.rec``. It adds up PLAN_ENTRIES entries at
   most, the oldest from where the last plan stopped, so that its memory
   stays bounded where every message has an entry of its own;
2. the engine, once the snapshot is in place, takes the plan (``_run``): it
   reads each entry once (past the cache of entries receives read again), at
   most READ_BYTES_PER_S, and proposes ``relocate`` commands that carry the
   bodies' bytes, up to COMMAND_BODY_BYTES each (group commit's packing size:
   a full one travels in an entry of its own, whose bodies are then all it
   holds) and COMMAND_MOVES (no longer to apply than the widest put), one at
   a time;
3. applied alike on every replica, each moves the references that still name
   exactly what was read to the copies in its own entry
   (statemachine/machine.py ``_relocate``): a message acknowledged, moved or
   replaced meanwhile keeps what it holds. An old entry that serves nothing
   any more is dropped by the next compaction.

A relocate entry starts with all of its bodies live, and is copied out of only
once its live bodies take less than half of it: each copy frees more than it
writes, so the bytes copied stay below the bytes written to the log, however
long a message stays. An entry of empty bodies, or one so small that a
relocate entry of its own would take as much, is never copied. Nothing runs between compactions: an idle
group costs nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import defaultdict
from pathlib import Path

import cbor2

from .background import Background
from .outcome import CommitError
from .storage import records

logger = logging.getLogger(__name__)

PLAN_MAGIC = b"RAFTQRL1"
PLAN_FILE = "relocation.rec"
TAKE_S = 1.0                       # how often the engine looks for a new snapshot, and so a new plan
LIVE_SHARE = 0.5                   # an entry whose copy takes less than this share of its record is copied out of
MOVE_BYTES = 32                    # what one move takes in a relocate entry besides its body (at most ~25)
ENTRY_BYTES = 256                  # what a relocate entry takes around its moves (its record, ~100)
# No plan while the entries compaction keeps take no more than twice the live bytes and this
SLACK_BYTES = 8 * 1024 * 1024
PLAN_READ_BYTES = 64 * 1024 * 1024
# The entries a plan adds up at most (a dict entry each in the child), the oldest: past them the
# next plan starts where this one stopped, so that no entry waits behind more than that many.
PLAN_ENTRIES = 100_000
SCAN_ROWS = 65_536                 # stored messages added up between two looks at PLAN_ENTRIES
READ_BYTES_PER_S = 16 * 1024 * 1024
COMMAND_BODY_BYTES = 1024 * 1024   # engine/committer.py's pack_bytes
COMMAND_MOVES = 10_000             # as many as the widest put's messages: as long to apply


class Relocator(Background):
    def __init__(self, node, plan_path: Path):
        self._node = node
        self._plan_path = Path(plan_path)
        self.allowed = False
        # what relocate commands moved, for /metrics
        self.commands = self.bodies = self.bytes = 0
        self._snapshot_seen: int | None = None
        self._plan_from = 0           # the log index the next plan starts from
        self.slack_bytes = SLACK_BYTES

    def allow(self, allowed: bool) -> None:
        """Whether every node runs a release that applies ``relocate`` (the fronts ask them)."""
        self.allowed = allowed

    # ---- step 1, in the snapshot writer's child -------------------------------------------------
    def plan(self, up_to: int, live: list[int]) -> None:
        """Write the plan for the entries up to `up_to` (the snapshot's last index) to the plan
        file, if this engine leads and may relocate; `live`: the live entries the snapshot names.
        Never raises (the snapshot is what counts)."""
        try:
            if not (self.allowed and self._node.is_leader()) or not self._worth_planning(up_to, live):
                return
            copies, until = self._copy_bytes(self._plan_from if self._plan_from <= up_to else 0, up_to + 1)
            chosen = self._choose(copies)
            moves = self._holders(chosen) if chosen else {}
            plan = [until if until <= up_to else 0, [[index, held] for index, held in moves.items() if held]]
            records.replace_file(self._plan_path, PLAN_MAGIC, [cbor2.dumps(plan)], sync=False)
        except Exception:
            logger.exception("relocation: planning failed; no bodies move until the next snapshot")

    def _worth_planning(self, up_to: int, live: list[int]) -> bool:
        """Whether the live entries this compaction keeps take more than twice what the stored (held
        or retained) and staged messages count (their bodies, keys and headers) and the slack: else a plan, which
        walks every stored message, could free little."""
        machine, stored_bytes = self._node.machine, self._node.consensus.stored_bytes
        counted = sum(queue.rows.bytes + queue.rows.retained_bytes for queue in machine.queues.values()) \
            + machine.staging.staged_bytes
        kept = sum(stored_bytes(index) or 0 for index in live if index <= up_to)
        return kept > 2 * counted + self.slack_bytes

    def _copy_bytes(self, start: int, stop: int) -> tuple[dict[int, int], int]:
        """What copying the live bodies of each live entry from `start` to before `stop` out of it
        would take, by its log index (their bytes, MOVE_BYTES each, and ENTRY_BYTES), for the oldest
        PLAN_ENTRIES of them; and the index they stop before."""
        machine, totals = self._node.machine, {}
        for queue in machine.queues.values():
            seq = queue.rows.first_seq()
            while seq is not None:
                seq = queue.rows.live_bytes_by_entry(seq, SCAN_ROWS, range(start, stop), totals, MOVE_BYTES)
                if len(totals) > PLAN_ENTRIES:     # the newer half waits for the next plan
                    stop = sorted(totals)[PLAN_ENTRIES // 2]
                    for index in [index for index in totals if index >= stop]:
                        del totals[index]
        for *_, ref in machine.staging.references():
            if start <= ref.index < stop:
                totals[ref.index] = totals.get(ref.index, 0) + ref.length + MOVE_BYTES
        return {index: copy + ENTRY_BYTES for index, copy in totals.items()}, stop

    def _choose(self, copies: dict[int, int]) -> list[int]:
        """The entries to copy out of, oldest first: those whose copy would take under LIVE_SHARE of
        what they take on disk, up to PLAN_READ_BYTES of them."""
        chosen, read = [], 0
        for index in sorted(copies):
            size = self._node.consensus.stored_bytes(index)
            if size is None or copies[index] >= LIVE_SHARE * size:
                continue
            if chosen and read + size > PLAN_READ_BYTES:
                break
            chosen.append(index)
            read += size
        return chosen

    def _holders(self, chosen: list[int]) -> dict[int, list]:
        """Each chosen entry's messages, by its index, oldest first: [queue name, seq, reference...]
        or [token, chunk, position, reference...]."""
        machine, wanted = self._node.machine, set(chosen)
        by_index: dict[int, list] = {index: [] for index in chosen}
        for name, queue in machine.queues.items():
            found: list = []
            queue.rows.references_into(wanted, found)
            for seq, ref in found:
                by_index[ref.index].append([name, seq, *ref])
        for token, chunk, at, ref in machine.staging.references():
            if ref.index in wanted:
                by_index[ref.index].append([token, chunk, at, *ref])
        return by_index

    # ---- step 2, in the engine ------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TAKE_S)
            seen, self._snapshot_seen = self._snapshot_seen, self._node.consensus.snapshot_index()
            if seen == self._snapshot_seen or not (self.allowed and self._node.is_leader()):
                continue
            plan = self._take_plan()
            try:
                await self.carry_out(plan)
            except CommitError as exc:
                logger.info("relocation stopped: %s", exc.code)   # the lead moved; the next leader plans its own
            except Exception:
                logger.exception("relocation failed")

    def _take_plan(self) -> list:
        """The plan the last snapshot's writer left (taken once: no later look takes it again), its
        entries' messages by entry; [] if none."""
        try:
            (payload,) = records.read_file(self._plan_path, PLAN_MAGIC)
            os.unlink(self._plan_path)
            self._plan_from, plan = cbor2.loads(payload)
        except FileNotFoundError:
            return []
        except ValueError as exc:
            logger.warning("relocation: the plan is unreadable (%s); no bodies move until the next snapshot", exc)
            return []
        return plan

    async def carry_out(self, plan: list) -> int:
        """Step 2 of the module's docstring: how many bodies moved."""
        consensus, moved = self._node.consensus, 0
        pace = _Pace(READ_BYTES_PER_S)
        command = _Command()
        for index, holders in plan:
            try:
                entry = consensus.stored_entry(index)
            except LookupError:
                continue        # compacted away since: nothing named it any more
            except Exception as exc:   # unreadable: its bodies stay where they are
                logger.warning("relocation: entry %d not read (%s); its bodies stay", index, exc)
                continue
            for holder in holders:
                *where, ref_index, offset, length, kind = holder
                raw = entry[offset:offset + length]
                if len(raw) != length:
                    logger.warning("relocation: entry %d holds no %d bytes at %d", index, length, offset)
                    continue
                command.add(where, [ref_index, offset, length, kind, raw])
                if command.body_bytes >= COMMAND_BODY_BYTES or command.moves >= COMMAND_MOVES:
                    moved += await self._propose(command)
                    command = _Command()
            await pace.read(len(entry))
        if command.moves:
            moved += await self._propose(command)
        return moved

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

    def add(self, where: list, move: list) -> None:
        """`where`: [queue name, seq] or [token, chunk, position]; `move`: the reference and its bytes."""
        if len(where) == 2:
            self.queues[where[0]].append([where[1], *move])
        else:
            self.stages.append([*where, *move])
        self.moves += 1
        self.body_bytes += len(move[-1])

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

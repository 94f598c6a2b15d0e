"""The record of a chaos run: what every client asked, what it was told, when.

A history is a list of events, written as JSON lines while the run goes on
(so a crashed run still leaves its evidence). Times are seconds on one
monotonic clock from the start of the run.

Client operations come as pairs, in the style of Jepsen:
    {"i", "t", "type": "invoke", "op", "process", "f", "node", "value"}
    {"i", "t", "type": "ok" | "fail" | "info", "op", "process", "f", "node", "value", "error"}
`ok` means the operation took effect, `fail` that it certainly did not, and
`info` that nobody knows (a timeout, a dropped connection, a 503 whose write
may still commit). An invoke with no completion is an `info` that never ended.

Everything else is a single event with its own `type`: `setup` (queues,
groups, lease time, nodes), `nemesis` (a fault's `start`, `stop`, or a
`mark` such as the moment a leader was killed), `log` (a line from a node's
log that the checker judges), `note`.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

COMPLETIONS = ("ok", "fail", "info")


@dataclass
class Op:
    """One client operation: its invocation joined with its completion."""

    op: int
    process: str
    f: str
    node: str | None
    value: Any
    invoke_t: float
    type: str = "info"
    complete_t: float = math.inf  # never completed: it may take effect at any later time
    result: Any = None
    error: Any = None

    @property
    def ok(self) -> bool:
        return self.type == "ok"

    @property
    def latency(self) -> float:
        return self.complete_t - self.invoke_t


@dataclass
class History:
    """A thread-safe, append-only event log, mirrored to a JSON-lines file."""

    path: Path | None = None
    clock: Any = time.monotonic
    events: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self._t0 = self.clock()
        self._lock = threading.Lock()
        self._next_op = 0
        self._open: dict[int, dict] = {}
        self._file = open(self.path, "w", buffering=1) if self.path else None

    def now(self) -> float:
        return self.clock() - self._t0

    def _append(self, event: dict) -> dict:
        with self._lock:
            event = {"i": len(self.events), "t": round(self.now(), 6), **event}
            self.events.append(event)
            if self._file:
                self._file.write(json.dumps(event, separators=(",", ":"), default=str) + "\n")
        return event

    def invoke(self, process: str, f: str, value: Any = None, node: str | None = None) -> int:
        with self._lock:
            op = self._next_op
            self._next_op += 1
        self._open[op] = self._append({"type": "invoke", "op": op, "process": process, "f": f,
                                       "node": node, "value": value})
        return op

    def complete(self, op: int, type: str, value: Any = None, error: Any = None,
                 node: str | None = None) -> None:
        if type not in COMPLETIONS:
            raise ValueError(f"an operation completes as one of {COMPLETIONS}, not {type!r}")
        start = self._open.pop(op)
        self._append({"type": type, "op": op, "process": start["process"], "f": start["f"],
                      "node": node or start["node"], "value": value, "error": error})

    def event(self, type: str, **fields: Any) -> dict:
        return self._append({"type": type, **fields})

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None


def load(path: str | Path) -> list[dict]:
    """A history file's events; a torn last line (the writer was killed) is skipped."""
    events = []
    with open(path) as f:
        for line in f:
            try:
                events.append(json.loads(line))
            except ValueError:
                break
    return events


def ops(events: Iterable[dict]) -> list[Op]:
    """Client operations, in invocation order, with their completions joined."""
    by_id: dict[int, Op] = {}
    for e in events:
        if e["type"] == "invoke":
            by_id[e["op"]] = Op(op=e["op"], process=e["process"], f=e["f"], node=e.get("node"),
                                value=e.get("value"), invoke_t=e["t"])
        elif e["type"] in COMPLETIONS and e.get("op") in by_id:
            o = by_id[e["op"]]
            o.type, o.complete_t, o.result, o.error = e["type"], e["t"], e.get("value"), e.get("error")
            o.node = e.get("node") or o.node
    return sorted(by_id.values(), key=lambda o: (o.invoke_t, o.op))

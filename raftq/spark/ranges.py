"""Seq ranges: what the driver plans and what an executor reads.

An offset is ``{"seq": N}``: the next seq to read.  A range is half-open,
``[start, end)``, and ``end`` is never past what the leader has applied —
only committed Raft entries are applied, so a range never holds a message
that a failover could take back.

A partition carries everything its task needs (pickled; the executor's
reader instance is not the planner's): the range, and ``min_index``, a log
index at or past the state the range was planned from.  Any replica whose
applied index has reached ``min_index`` holds every message of the range, so
partitions spread their pages over the replicas, starting at a different
node each, and fall back to the leader only when no replica is fresh enough.
"""

import http.client
import queue
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import orjson
import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema

from raftq.client import RaftqError

from .options import Connection, OptionError, ReadOptions
from .schema import READ_SCHEMA

ARROW_SCHEMA = to_arrow_schema(READ_SCHEMA, timezone="UTC")
# A stale replica is asked again this many rounds before the leader serves the page.
REPLICA_ROUNDS = 3
# A token the cluster does not take (401), or a principal's rules that do not allow the read (403).
REFUSED = frozenset({"unauthorized", "forbidden"})


@dataclass
class RangePartition(InputPartition):
    connection: Connection
    queue: str
    group: str
    start: int
    end: int
    min_index: int
    fetch_size: int
    replica_reads: bool
    first_node: int


def committed_view(opts: ReadOptions):
    """(the queue's stats as the leader has applied them, a log index at or past that state)."""
    deadline = time.monotonic() + opts.connection.retry_for_s
    with opts.connection.client() as client:
        while True:
            try:
                stats = client.queue(opts.queue)["stats"]
            except RaftqError as exc:
                if exc.code == "not_found":
                    raise OptionError(f"option queue: queue {opts.queue!r} does not exist") from None
                raise
            # Asked after the stats, of the node that answered them (the client
            # follows the redirect there): its commit index covers that state.
            # Another node's would not (a new leader's commit index may still
            # lag the old one's applied state), so if that node is gone by
            # now -- a leader killed between the two calls -- both are asked
            # again, of whichever node leads next.
            # The index is of the queue's own Raft group: another group's log
            # counts other entries. (A node of a release before groups is group 0.)
            group = client.raft_group(opts.queue)
            try:
                ready = client.ready(groups=True)
                view = ready.get("raft_groups", {"0": ready}).get(str(group), {})
            except (OSError, http.client.HTTPException):
                view = {}
            if view.get("role") == "leader":
                return stats, view["commit_index"]
            if time.monotonic() > deadline:
                raise RaftqError(503, "no_quorum", "no stable leader to plan the read against")
            time.sleep(0.05)


def split(opts: ReadOptions, start: int, end: int, min_index: int) -> list:
    """Partitions of partition_size seqs; an empty range is one empty partition (for
    no partitions at all, Spark would run one of its own that carries no range)."""
    nodes = len(opts.connection.urls)
    bounds = range(start, end, opts.partition_size) if start < end else [start]
    return [RangePartition(opts.connection, opts.queue, opts.group, lo,
                           max(lo, min(lo + opts.partition_size, end)), min_index, opts.fetch_size,
                           opts.replica_reads, i % nodes)
            for i, lo in enumerate(bounds)]


def read_range(p: RangePartition) -> Iterator[pa.RecordBatch]:
    """The messages of [start, end) the group still holds, as Arrow batches, one per page;
    the next page is fetched while this one is converted and handed to Spark."""
    for messages in _ahead(_pages(p)):
        yield to_batch(messages, p.queue)


def _pages(p: RangePartition) -> Iterator[list]:
    reader = _PageReader(p)
    try:
        cursor = p.start
        while cursor < p.end:
            limit = min(p.fetch_size, p.end - cursor)
            page = reader.page(cursor, limit)
            messages = [m for m in page if m["seq"] < p.end]
            if messages:
                yield messages
            if len(page) < limit or len(messages) < len(page):
                return      # nothing more is stored in the range
            cursor = messages[-1]["seq"] + 1
    finally:
        reader.close()


def _ahead(items: Iterator, depth: int = 2) -> Iterator:
    """`items`, produced by a thread up to `depth` ahead; its exception is raised here.

    Python workers are reused across tasks, so the thread must end even when
    the consumer stops early: it gives up once `stop` is set.
    """
    handoff: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    end = object()

    def offer(entry) -> bool:
        while not stop.is_set():
            try:
                handoff.put(entry, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce():
        try:
            for item in items:
                if not offer((item, None)):
                    return
            offer((end, None))
        except BaseException as exc:    # handed to the consumer, which raises it
            offer((None, exc))

    worker = threading.Thread(target=produce, name="raftq-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item, failure = handoff.get()
            if failure is not None:
                raise failure
            if item is end:
                return
            yield item
    finally:
        stop.set()


class _PageReader:
    def __init__(self, p: RangePartition):
        self.p = p
        urls = p.connection.urls
        order = urls[p.first_node:] + urls[:p.first_node]
        # One client per replica, without failover of its own: a dead or stale
        # replica sends the page to the next one at once, not into a retry loop.
        self.replicas = [p.connection.client(urls=[u], retry_for_s=0) for u in order] if p.replica_reads else []
        self.current = 0
        self.leader = p.connection.client(urls=order)

    def page(self, cursor: int, limit: int) -> list:
        p = self.p
        for _ in range(REPLICA_ROUNDS * len(self.replicas)):
            replica = self.replicas[self.current]
            try:
                page = replica.browse(p.queue, group=p.group, from_seq=cursor, limit=limit, consistency="any")
                if page["applied_index"] >= p.min_index:
                    return page["messages"]
            except RaftqError as exc:
                # A refused credential is refused by every node alike: asking the
                # others would only repeat the denial (and count it again each time).
                if exc.code in REFUSED:
                    raise
            except OSError:
                pass     # down, restarting, or too far behind to know the queue yet
            self.current = (self.current + 1) % len(self.replicas)
        return self.leader.browse(p.queue, group=p.group, from_seq=cursor, limit=limit)["messages"]

    def close(self) -> None:
        for client in (*self.replicas, self.leader):
            client.close()


def to_batch(messages: list, queue: str) -> pa.RecordBatch:
    bodies, texts = [], []
    for m in messages:
        body = m["body"]
        if isinstance(body, bytes):
            bodies.append(body)
            texts.append(None)
        else:
            text = orjson.dumps(body)
            bodies.append(body.encode() if isinstance(body, str) else text)
            texts.append(text.decode())
    headers = [list(m["headers"].items()) if m["headers"] else None for m in messages]
    columns = [
        pa.array([m["seq"] for m in messages], pa.int64()),
        pa.array([m["key"] for m in messages], pa.string()),
        pa.array(bodies, pa.binary()),
        pa.array(texts, pa.string()),
        pa.array(headers, ARROW_SCHEMA.field("headers").type),
        pa.array([m["put_at_ms"] * 1000 for m in messages], ARROW_SCHEMA.field("put_at").type),
        pa.array([queue] * len(messages), pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)

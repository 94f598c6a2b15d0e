"""Batch and streaming readers: the driver's planning; executors run `ranges.read_range`.

Streaming offsets are queue seqs (``ranges.py``).  The start of a query is
the consumer group's cursor — the group is created at ``startingOffsets``
(earliest/latest) if it does not exist, like Kafka's auto.offset.reset —
so a replay of the first batch after a crash resolves the same start: the
cursor moves only through ``commit``, which Spark calls only for batches it
has durably processed.  An explicit ``{"seq": N}`` start is used as given;
``{"time_ms": T}`` is a position too (a group created there holds every stored
message put at or after log time T, retained ones included: docs/api.md), and
a batch read starts at the first message of the group put then or after.
"""

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from .options import OptionError, ReadOptions
from .ranges import committed_view, read_range, split


def _next_seq(stats: dict) -> int:
    return (stats["last_seq"] or 0) + 1


class BatchReader(DataSourceReader):
    """A non-destructive snapshot of [startingOffsets, endingOffsets): it browses, never leases."""

    def __init__(self, opts: ReadOptions):
        self.opts = opts     # no I/O here: Spark builds readers in several processes

    def partitions(self):
        opts = self.opts
        stats, index = committed_view(opts)
        if opts.group not in stats["groups"]:
            raise OptionError(f"option group: queue {opts.queue!r} has no group {opts.group!r}")
        # Never past what is committed: a later end would read whatever is there at read time.
        end = _next_seq(stats) if opts.ending == "latest" else min(opts.ending["seq"], _next_seq(stats))
        if isinstance(opts.starting, str):
            start = {"earliest": stats["groups"][opts.group]["cursor"], "latest": _next_seq(stats)}[opts.starting]
        elif "time_ms" in opts.starting:
            start = min(end, _first_seq_put_at(opts, opts.starting["time_ms"], end))
        else:
            start = opts.starting["seq"]
        return split(opts, start, end, index)

    def read(self, partition):
        return read_range(partition)


def _first_seq_put_at(opts: ReadOptions, time_ms: int, end: int) -> int:
    """The seq of the group's first message put at or after log time `time_ms` (`end` if none)."""
    with opts.connection.client() as client:
        page = client.browse(opts.queue, group=opts.group, from_time_ms=time_ms, limit=1)["messages"]
    return page[0]["seq"] if page else end


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self.start = None              # resolved once per run (Spark asks twice)
        self.available_now_end = None  # frozen by Trigger.AvailableNow
        self.latest = None             # (end offered, log index it was planned at)
        self.newest = None             # for progress reports

    def initialOffset(self) -> dict:
        if self.start is None:
            if isinstance(self.opts.starting, dict) and "seq" in self.opts.starting:
                self.start = dict(self.opts.starting)
            else:
                with self.opts.connection.client() as client:
                    group = client.add_group(self.opts.queue, self.opts.group, start=self.opts.starting)
                self.start = {"seq": group["cursor"]}
        return self.start

    def getDefaultReadLimit(self):
        if self.opts.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        stats, _ = committed_view(self.opts)
        self.available_now_end = _next_seq(stats)

    def latestOffset(self, start: dict, limit) -> dict:
        stats, index = committed_view(self.opts)
        self.newest = {"seq": _next_seq(stats)}
        end = _next_seq(stats)
        if self.available_now_end is not None:
            end = min(end, self.available_now_end)
        if isinstance(limit, ReadMaxRows):
            end = min(end, start["seq"] + limit.max_rows)
        end = max(end, start["seq"])
        self.latest = (end, index)
        return {"seq": end}

    def reportLatestOffset(self):
        return self.newest

    def partitions(self, start: dict, end: dict):
        if self.latest is not None and self.latest[0] == end["seq"]:
            index = self.latest[1]
        else:
            # A batch planned by an earlier run (replayed after a restart):
            # today's commit index is past the state it was planned from.
            index = committed_view(self.opts)[1]
        return split(self.opts, start["seq"], end["seq"], index)

    def read(self, partition):
        return read_range(partition)

    def commit(self, end: dict) -> None:
        """Spark has durably processed everything before `end`: the group may let it go."""
        if end["seq"] > 1:
            with self.opts.connection.client() as client:
                client.commit(self.opts.queue, self.opts.group, end["seq"] - 1)

"""The sink: every row stored exactly once, each Spark batch visible all at once.

Executors (``write``) stage their partition's rows under a token of their
own — one per task attempt — in chunks that a retried request replaces.  The
driver (``commit``) names the token of every partition that succeeded in one
``stage_commit`` of ``(producer, batch)``: one Raft log entry makes the
whole batch visible and records ``batch`` as the producer's high-water mark,
so a replay of that batch, or a retry of the commit after a failover, is a
no-op however late it comes.  Attempts that lost (failed tasks, speculative
twins) are never named; ``abort`` drops what it knows of, and the stage TTL
drops the rest.  See docs/spark.md for why this holds.

A ``duplicate`` answer is taken for this writer's own batch only when the
producer's mark is that very batch (Spark replays only its last batch, and
a retried commit finds its own mark); a mark past it was moved by another
writer under the same producer id, so the rows of this batch were dropped:
the commit raises and the query fails instead of reporting them written.
"""

import base64
import datetime
import decimal
import uuid
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)

from .options import BATCH_PRODUCER_RETAIN_MS, STAGE_CHUNK_BYTES, WriteOptions


@dataclass
class Staged(WriterCommitMessage):
    """What one task attempt staged: its token and how many chunks (0: no rows)."""
    token: str
    chunks: int
    rows: int


def _plain(value):
    """A nested Spark value as JSON data (Arrow gives maps as lists of pairs)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return {str(k): _plain(v) for k, v in value}
        return [_plain(v) for v in value]
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    return value


def messages_of(batch: pa.RecordBatch):
    """The rows of an Arrow batch as raftq messages."""
    columns = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
    body_type = batch.schema.field("body").type
    raw_body = pa.types.is_binary(body_type) or pa.types.is_large_binary(body_type) or \
        pa.types.is_string(body_type) or pa.types.is_large_string(body_type)
    optional = [(field, columns[field]) for field in ("key", "id", "delay_ms", "ttl_ms") if field in columns]
    headers = columns.get("headers")
    for i, body in enumerate(columns["body"]):
        message = {"body": body if raw_body or body is None else _plain(body)}
        for field, values in optional:
            if values[i] is not None:
                message[field] = values[i]
        if headers is not None and headers[i]:
            message["headers"] = {k: v for k, v in headers[i] if v is not None}
        yield message


def _size(message: dict) -> int:
    body = message["body"]
    return len(body) if isinstance(body, (bytes, str)) else 64


def stage_partition(opts: WriteOptions, producer: str, batches) -> Staged:
    """Stage every row of one task attempt; runs on an executor."""
    token = uuid.uuid4().hex
    chunks = rows = 0
    pending, pending_bytes = [], 0
    with opts.connection.client() as client:
        def flush():
            nonlocal chunks, pending, pending_bytes
            client.stage(producer, token, chunks, opts.queue, pending, ttl_ms=opts.stage_ttl_ms)
            chunks, pending, pending_bytes = chunks + 1, [], 0

        for batch in batches:
            for message in messages_of(batch):
                pending.append(message)
                pending_bytes += _size(message)
                rows += 1
                if len(pending) >= opts.chunk_rows or pending_bytes >= STAGE_CHUNK_BYTES:
                    flush()
        if pending:
            flush()
    return Staged(token, chunks, rows)


def _parts(messages) -> list:
    return [{"token": m.token, "chunks": m.chunks} for m in messages
            if isinstance(m, Staged) and m.chunks]


class ForeignCommit(RuntimeError):
    """Another writer committed past this batch under the same producer id."""


def _check_own(result: dict, producer: str, batch: int) -> None:
    if result.get("duplicate") and result.get("committed_batch") != batch:
        raise ForeignCommit(
            f"raftq producer {producer!r}: batch {batch} was NOT written: the producer's committed batch "
            f"is already {result.get('committed_batch')}, which this query never committed. Another writer "
            "uses this producerId (give each query its own), or the mark was moved by someone else; "
            f"an operator can DELETE /v1/producers/{producer} to start it over")


def _abort(opts: WriteOptions, producer: str, messages) -> None:
    tokens = [m.token for m in messages if isinstance(m, Staged) and m.chunks]
    if tokens:
        with opts.connection.client() as client:
            client.abort_stages(producer, tokens, queue=opts.queue)


class BatchWriter(DataSourceArrowWriter):
    """One job, one commit, under a one-off producer id made here on the driver
    (this instance is pickled to the executors and to the commit)."""

    def __init__(self, opts: WriteOptions):
        self.opts = opts
        self.producer = f"spark-batch-{uuid.uuid4().hex}"

    def write(self, iterator):
        return stage_partition(self.opts, self.producer, iterator)

    def commit(self, messages) -> None:
        with self.opts.connection.client() as client:
            result = client.commit_stages(self.producer, 0, _parts(messages), retain_ms=BATCH_PRODUCER_RETAIN_MS,
                                          queue=self.opts.queue)
        _check_own(result, self.producer, 0)

    def abort(self, messages) -> None:
        _abort(self.opts, self.producer, messages)


class StreamWriter(DataSourceStreamArrowWriter):
    """Micro-batch `batchId` is committed once per producerId, whatever replays it."""

    def __init__(self, opts: WriteOptions):
        self.opts = opts

    def write(self, iterator):
        return stage_partition(self.opts, self.opts.producer, iterator)

    def commit(self, messages, batchId: int) -> None:
        with self.opts.connection.client() as client:
            result = client.commit_stages(self.opts.producer, batchId, _parts(messages), queue=self.opts.queue)
        _check_own(result, self.opts.producer, batchId)

    def abort(self, messages, batchId: int) -> None:
        _abort(self.opts, self.opts.producer, messages)

"""The `raftq` data source: options checked on the driver, then readers and writers."""

from pyspark.sql.datasource import DataSource

from raftq.client import RaftqError

from .options import OptionError, read_options, write_options
from .readers import BatchReader, StreamReader
from .schema import READ_SCHEMA, check_write_schema
from .writer import BatchWriter, StreamWriter


def _refused_token(exc: RaftqError) -> OptionError:
    return OptionError(f"option token: the cluster refused it ({exc.message})")


def _check_readable(opts) -> None:
    """Reach the cluster now, so that a wrong url, token or queue fails at .load()."""
    with opts.connection.client() as client:
        try:
            client.queue(opts.queue)
        except RaftqError as exc:
            if exc.code == "unauthorized":
                raise _refused_token(exc) from None
            if exc.code == "not_found":
                raise OptionError(f"option queue: queue {opts.queue!r} does not exist") from None
            raise


def _check_writable(opts, producer: str) -> None:
    """Reach the cluster now, so that a wrong url, token or queue fails at .save()/.start(),
    before any row is staged.

    Asked through the producer's page, which needs the `producers` action on the
    queue, as every stage does: a principal that may write there need not also
    browse it (a stage also needs `put`; that denial comes from the first stage).
    The page says whether a put creates a missing queue; only a cluster that
    does not is asked whether the queue exists."""
    with opts.connection.client() as client:
        try:
            if client.producer(producer, queue=opts.queue)["auto_create"]:
                return
            client.queue(opts.queue)
        except RaftqError as exc:
            if exc.code == "unauthorized":
                raise _refused_token(exc) from None
            if exc.code == "not_found":
                raise OptionError(f"option queue: queue {opts.queue!r} does not exist and the cluster "
                                  "does not create queues on a put") from None
            # Without browse the queue's existence is not ours to see: a missing one
            # fails the first stage with its 404 instead.
            if not (exc.code == "forbidden" and exc.body.get("action") == "browse"):
                raise


class RaftqDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "raftq"

    def schema(self):
        # Runs on the driver at .load(): the place where bad options fail early.
        _check_readable(read_options(self.options, streaming=None))
        return READ_SCHEMA

    def reader(self, schema):
        return BatchReader(read_options(self.options, streaming=False))

    def streamReader(self, schema):
        return StreamReader(read_options(self.options, streaming=True))

    def writer(self, schema, overwrite: bool):
        check_write_schema(schema)
        opts = write_options(self.options, streaming=False)
        if opts.producer is not None:
            raise OptionError("option producerId: only for streaming writes; a batch write "
                              "commits under a one-off producer id of its own")
        writer = BatchWriter(opts)
        _check_writable(opts, writer.producer)
        return writer

    def streamWriter(self, schema, overwrite: bool):
        check_write_schema(schema)
        opts = write_options(self.options, streaming=True)
        _check_writable(opts, opts.producer)
        return StreamWriter(opts)

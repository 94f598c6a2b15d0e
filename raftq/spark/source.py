"""The `raftq` data source: options checked on the driver, then readers and writers."""

from pyspark.sql.datasource import DataSource

from raftq.client import RaftqError

from .options import OptionError, read_options, write_options
from .readers import BatchReader, StreamReader
from .schema import READ_SCHEMA, check_write_schema
from .writer import BatchWriter, StreamWriter


def _check_queue(opts, *, must_exist: bool, producer: str | None = None) -> None:
    """Reach the cluster now, so that a wrong url, token or queue fails at .load()/.start().

    A writer's queue may be missing if the cluster creates queues on a put;
    the producer's record says whether it does."""
    with opts.connection.client() as client:
        try:
            client.queue(opts.queue)
            return
        except RaftqError as exc:
            if exc.code == "unauthorized":
                raise OptionError(f"option token: the cluster refused it ({exc.message})") from None
            if exc.code != "not_found":
                raise
        if must_exist or not client.producer(producer, queue=opts.queue)["auto_create"]:
            raise OptionError(f"option queue: queue {opts.queue!r} does not exist"
                              + ("" if must_exist else " and the cluster does not create queues on a put"))


class RaftqDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "raftq"

    def schema(self):
        # Runs on the driver at .load(): the place where bad options fail early.
        _check_queue(read_options(self.options, streaming=None), must_exist=True)
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
        _check_queue(opts, must_exist=False, producer=writer.producer)
        return writer

    def streamWriter(self, schema, overwrite: bool):
        check_write_schema(schema)
        opts = write_options(self.options, streaming=True)
        _check_queue(opts, must_exist=False, producer=opts.producer)
        return StreamWriter(opts)

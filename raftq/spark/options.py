"""The connector's options: parsed and checked on the driver, at .load() / .start().

Spark hands options over as strings with lower-cased keys.  Every problem is
an `OptionError` whose one-line message names the option, so a typo fails the
query before it runs instead of in a task.  The parsed options are plain,
picklable dataclasses: they travel to the executors inside partitions and
writers.
"""

import json
import os
from dataclasses import dataclass

from raftq.wire_format import NAME_PATTERN, is_name

DEFAULT_URL = "http://127.0.0.1:8001"
MAX_PAGE = 10_000                     # the browse endpoint's own limit
MAX_STAGE_ROWS = 10_000               # the stage endpoint's batch limit
STAGE_CHUNK_BYTES = 4 << 20           # well under the 16 MiB request limit
BATCH_PRODUCER_RETAIN_MS = 24 * 3_600_000

COMMON = {"url", "token", "queue", "requesttimeoutms", "retryforms", "path"}
READ = COMMON | {"group", "startingoffsets", "endingoffsets", "partitionsize", "fetchsize",
                 "maxmessagespertrigger", "replicareads"}
WRITE = COMMON | {"producerid", "stagechunksize", "stagettlms", "checkpointlocation"}


class OptionError(ValueError):
    """A bad option: the message is one line and names the option."""


@dataclass(frozen=True)
class Connection:
    urls: tuple
    token: str | None
    request_timeout_s: float
    retry_for_s: float

    def client(self, *, urls=None, retry_for_s: float | None = None):
        from raftq.client import Client
        return Client(list(urls or self.urls), token=self.token, timeout=self.request_timeout_s,
                      retry_for=self.retry_for_s if retry_for_s is None else retry_for_s, cbor=True)


@dataclass(frozen=True)
class ReadOptions:
    connection: Connection
    queue: str
    group: str
    starting: dict | str            # "earliest" | "latest" | {"seq": N} | {"time_ms": T}
    ending: dict | str              # "latest" | {"seq": N}
    partition_size: int
    fetch_size: int
    max_per_trigger: int | None
    replica_reads: bool


@dataclass(frozen=True)
class WriteOptions:
    connection: Connection
    queue: str
    producer: str | None
    chunk_rows: int
    stage_ttl_ms: int


def _check_known(options: dict, known: set, what: str) -> None:
    unknown = sorted(set(options) - known)
    if unknown:
        raise OptionError(f"option {unknown[0]}: not an option of raftq {what}s "
                          f"(known: {', '.join(sorted(known - {'path', 'checkpointlocation'}))})")


def _int(options: dict, name: str, default, low: int, high: int):
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name}: {raw!r} is not an integer") from None
    if not low <= value <= high:
        raise OptionError(f"option {name}: {value} is not between {low} and {high}")
    return value


def _bool(options: dict, name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    if str(raw).lower() not in ("true", "false"):
        raise OptionError(f"option {name}: {raw!r} is not true or false")
    return str(raw).lower() == "true"


def _name(options: dict, option: str, default=None) -> str:
    value = options.get(option.lower(), default)
    if value is None:
        raise OptionError(f"option {option}: required")
    if not is_name(value):
        raise OptionError(f"option {option}: {value!r} must match {NAME_PATTERN}")
    return value


def offset_spec(options: dict, option: str, allowed: tuple, default: str, *, timed: bool = False):
    """'earliest' / 'latest' or {"seq": N} (N >= 1: the first seq to read, or the end's exclusive bound);
    `timed`: also {"time_ms": T}, the first message put at or after log time T."""
    raw = options.get(option.lower(), default).strip()
    if raw in allowed:
        return raw
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    fields = ("seq", "time_ms") if timed else ("seq",)
    if isinstance(parsed, dict) and len(parsed) == 1:
        (field, value), = parsed.items()
        if field in fields and isinstance(value, int) and not isinstance(value, bool) \
                and value >= (1 if field == "seq" else 0):
            return {field: value}
    forms = 'or {"seq": N} with N >= 1' + (' or {"time_ms": T} (a log time, ms)' if timed else "")
    raise OptionError(f"option {option}: {raw!r} is not {', '.join(repr(a) for a in allowed)} {forms}")


def connection(options: dict) -> Connection:
    raw = options.get("url") or os.environ.get("RAFTQ_URL") or DEFAULT_URL
    urls = tuple(u.strip().rstrip("/") for u in raw.split(",") if u.strip())
    for url in urls:
        if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
            raise OptionError(f"option url: {url!r} is not an http:// or https:// address")
    if not urls:
        raise OptionError("option url: no node address given")
    token = options.get("token") or os.environ.get("RAFTQ_TOKEN") or None
    return Connection(urls=urls, token=token,
                      request_timeout_s=_int(options, "requestTimeoutMs", 30_000, 100, 3_600_000) / 1000,
                      retry_for_s=_int(options, "retryForMs", 60_000, 0, 3_600_000) / 1000)


def read_options(options: dict, *, streaming: bool | None) -> ReadOptions:
    """streaming=None: not known yet (.load() serves both), so only what holds for both is checked."""
    options = {k.lower(): v for k, v in options.items()}
    _check_known(options, READ, "reader")
    if streaming is True and "endingoffsets" in options:
        raise OptionError("option endingOffsets: only batch reads end; a stream runs on")
    if streaming is False and "maxmessagespertrigger" in options:
        raise OptionError("option maxMessagesPerTrigger: only streaming reads have triggers")
    return ReadOptions(
        connection=connection(options),
        queue=_name(options, "queue", options.get("path")),
        group=_name(options, "group", "default"),
        starting=offset_spec(options, "startingOffsets", ("earliest", "latest"), "earliest", timed=True),
        ending=offset_spec(options, "endingOffsets", ("latest",), "latest"),
        partition_size=_int(options, "partitionSize", 50_000, 1, 1 << 31),
        fetch_size=_int(options, "fetchSize", MAX_PAGE, 1, MAX_PAGE),
        max_per_trigger=_int(options, "maxMessagesPerTrigger", None, 1, 1 << 31),
        replica_reads=_bool(options, "replicaReads", True))


def write_options(options: dict, *, streaming: bool) -> WriteOptions:
    options = {k.lower(): v for k, v in options.items()}
    _check_known(options, WRITE, "writer")
    producer = options.get("producerid")
    if streaming and producer is None:
        raise OptionError("option producerId: required for a streaming write; it must stay the same "
                          "across restarts of the query (it keys the exactly-once commits)")
    return WriteOptions(
        connection=connection(options),
        queue=_name(options, "queue", options.get("path")),
        producer=None if producer is None else _name(options, "producerId"),
        chunk_rows=_int(options, "stageChunkSize", 5_000, 1, MAX_STAGE_ROWS),
        # a node refuses a stage TTL above its --max-stage-ttl-ms (a day by default)
        stage_ttl_ms=_int(options, "stageTtlMs", 3_600_000, 1_000, 24 * 3_600_000))

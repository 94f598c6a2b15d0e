"""The snapshot file: what log compaction leaves on disk, and what a follower
that lacks the compacted log is sent.

A record file (``engine.storage.records``) with magic ``RAFTQSN2`` holding exactly two
records:
1. CBOR ``{"last": entry, "prev": entry, "cluster": [[raft_addr, node_id], ...]}``:
   the two last applied log entries (``[command, index, term]``; pysyncobj
   keeps them as the first entries of the compacted log) and the membership;
2. the state machine's own snapshot bytes.

pysyncobj writes it through its serializer hooks to a temp name, which this
module creates 0600 and fsyncs, and renames it over ``snapshot.bin``; the
journal fsyncs the file and its directory before it drops an entry the
snapshot replaces. A follower receives the file byte for byte and reads it
with the same checks: anything but exactly the two intact records is a
damaged snapshot, refused before the state machine sees it.
"""

from __future__ import annotations

from pathlib import Path

import cbor2

from . import records

MAGIC = b"RAFTQSN2"


def check_format(path: str | Path) -> None:
    """Refuse (DamagedFile) a snapshot file of another format, before pysyncobj
    would try to load it: it logs and swallows a failed load, and the node
    would then wait forever for log entries its journal no longer holds."""
    try:
        with open(path, "rb") as f:
            head = f.read(records.FILE_HEADER.size)
    except FileNotFoundError:
        return
    if not records.has_header(head, MAGIC):
        raise records.DamagedFile(
            f"{path} is not a {MAGIC.decode()} snapshot (written by an older raftq, or damaged): this node cannot "
            f"restart from its data directory; move the directory aside and the node rejoins from the leader")


def write(path: str | Path, *, last, prev, cluster: list[list[str]], state: bytes) -> int:
    """Write and fsync the file; returns its size."""
    header = cbor2.dumps({"last": list(last), "prev": list(prev), "cluster": sorted(cluster)})
    return records.write_file(path, MAGIC, [header, state])


def last_entry(path: str | Path) -> tuple[int, int]:
    """(index, term) of the last log entry the snapshot covers, from its first
    record alone; ValueError naming the file if that record is damaged."""
    try:
        _, index, term = cbor2.loads(records.read_file(path, MAGIC, first=1)[0])["last"]
        return index, term
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"damaged snapshot {path}: {exc}") from None


def check(path: str | Path) -> None:
    """ValueError naming the file unless every record of it is intact."""
    try:
        records.check_file(path, MAGIC, 2)
    except ValueError as exc:
        raise ValueError(f"damaged snapshot {path}: {exc}") from None


def read(path: str | Path) -> tuple[dict, bytes]:
    """(header, state bytes); ValueError naming the file if it is damaged."""
    try:
        header, state = records.read_file(path, MAGIC)
        return cbor2.loads(header), state
    except ValueError as exc:   # DamagedFile, a record too many or too few, bad CBOR
        raise ValueError(f"damaged snapshot {path}: {exc}") from None

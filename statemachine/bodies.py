"""Where a stored body lies: a reference into the log entry that carried it.

A put's bodies are already on disk, in the fsynced Raft log entry that
carried them; a stored message keeps a `BodyRef` to them instead of a copy
(docs/architecture.md, "Where a stored body lives").  The machine stays
pure: it computes references from the entry's bytes and its log index alone,
so every replica holds the same ones, and the engine reads the bytes back
when a body is handed out (`read_body`).
"""

from typing import NamedTuple

import cbor2

BYTES, TEXT, JSON = 0, 1, 2          # how a reference's bytes read back: as they are, UTF-8, CBOR
# How far past the previous body a body is looked for: the message's other
# fields (key, id, headers) lie between two bodies. A body not found within
# it stays in the heap, so a search never costs more than this per body.
SEARCH_WINDOW = 64 * 1024


class BodyRef(NamedTuple):
    index: int       # the log index of the entry that carried the body (> 0)
    offset: int      # where the body's bytes start in that entry
    length: int      # how many bytes; also what the body counts toward max_bytes (`queue.body_size`)
    kind: int        # BYTES, TEXT or JSON


def read_body(ref: BodyRef, entry) -> object:
    """The body `ref` names, read from the bytes of its entry."""
    raw = bytes(entry[ref.offset:ref.offset + ref.length])
    if ref.kind == BYTES:
        return raw
    if ref.kind == TEXT:
        return raw.decode()
    return cbor2.loads(raw)


def _encoded(body):
    """(the bytes a valid body lies as in its entry's CBOR, its kind)."""
    if isinstance(body, bytes):
        return body, BYTES
    if isinstance(body, str):
        return body.encode(), TEXT
    return cbor2.dumps(body), JSON


# The commands whose messages' bodies are kept as references: puts, a transaction's puts, and
# staged writes (whose entries stay live from the stage to its commit, abort or expiry); and
# relocations, whose bodies are live bodies copied out of older entries (``relocated``)
CARRIES_BODIES = frozenset({"put", "tx", "stage", "relocate"})


def _messages(cmd: dict) -> list:
    """The messages of a valid put, tx or stage, in the order their bodies lie in the entry."""
    if cmd["op"] == "tx":
        return [m for part in cmd.get("put", ()) for m in part["messages"]]
    return cmd["messages"]


class BodyFinder:
    """Replaces the bodies of one entry's valid puts by their BodyRefs in it, command after command.

    Bodies lie in the entry in the order they are decoded, so each is looked
    for from where the previous one ended.  A hit before the body's own
    position (the same bytes inside an earlier field) holds the same bytes,
    so it reads back the same body, and the next search still starts no
    later than the next body's own position.  A refused command's bodies are
    skipped: they too lie after the position.
    """
    __slots__ = ("entry", "index", "position")

    def __init__(self, entry: bytes, index: int):
        self.entry = entry
        self.index = index
        self.position = 0

    def refer(self, cmd: dict) -> None:
        """Put references in place of the bodies of `cmd`, a validated put, tx, stage or relocate,
        where they are found."""
        entry, index, position = self.entry, self.index, self.position
        if cmd["op"] == "relocate":
            # a relocated body's bytes lie as they are, whatever its kind; one not found becomes
            # None, which moves nothing
            for move in relocated(cmd):
                *_, length, kind, needle = move         # (a valid move's bytes are `length` long)
                offset = entry.find(needle, position, position + length + SEARCH_WINDOW)
                move[-1] = None if offset < 0 else BodyRef(index, offset, length, kind)
                if offset >= 0:
                    position = offset + length
        else:
            for message in _messages(cmd):
                needle, kind = _encoded(message["body"])
                offset = entry.find(needle, position, position + len(needle) + SEARCH_WINDOW)
                if offset >= 0:
                    message["body"] = BodyRef(index, offset, len(needle), kind)
                    position = offset + len(needle)
        self.position = position


def relocated(cmd: dict):
    """The moves of a valid relocate, in the order their bodies lie in the entry: each a list
    whose last five items are the reference it moves from (index, offset, length, kind) and the
    body's bytes."""
    for _, moves in cmd.get("queues", ()):
        yield from moves
    yield from cmd.get("stages", ())

"""Appends and their answers as fixed binary frames: the put's path without pickle.

Every other Raft message travels as a pickle (``engine.raft.wire``); these two
kinds are most of the traffic and each pickle costs a dict built, walked and
rebuilt on both sides. A node sends them in this form only to a peer that
announced ``BINARY_WIRE`` on that connection (``engine.raft.wire``, "Protocol
versions"), and takes them only from one: a cluster mid rolling upgrade keeps
replicating in pickles between old and new nodes.

The payload (sealed like any message) starts with a kind byte no pickle starts
with (pysyncobj pickles with protocol 2 or later: ``0x80`` first), then the
connection's random key (pysyncobj's guard against replaying a message on
another connection), then a fixed header:

- append: ``<flags u8><term u64><prev index u64><prev term u64><commit index
  u64><sent_at f64><entry count u32><entries' length u32>``, then, if the
  flags say ``QUIET``, a quiet leader's promise ``<quiet_s f64>`` (sent only
  to a peer that announced ``engine.raft.wire.QUIET_WIRE``), then each entry
  as ``<index u64><term u64><length u32><command>``, the command's bytes as
  the journal holds them;
- answer: ``<flags u8><term u64><next index u64><sent_at f64>``.

``decode`` checks the whole frame before it returns anything: lengths add up
exactly, entries are consecutive after the previous index and their terms
never fall nor pass the append's. A frame that fails raises ``ValueError``,
and the connection is closed like any bad frame: never a partial append.
A node sends these two kinds from their fields (``encode_append``,
``encode_answer``: no dict is built and walked on the put's path); a snapshot's
chunks, which also travel as appends, go as pickles.
"""

from __future__ import annotations

import struct

BINARY_WIRE = 2                # the protocol version that carries these frames
APPEND = 0xB1
ANSWER = 0xB2
KINDS = frozenset({APPEND, ANSWER})
KEY_BYTES = 32                 # pysyncobj's per-connection random key (os.urandom(32))

PREFIX = struct.Struct("<BB")                    # kind, key length (0 or KEY_BYTES)
APPEND_HEADER = struct.Struct("<BQQQQdII")
ENTRY_HEADER = struct.Struct("<QQI")
ANSWER_HEADER = struct.Struct("<BQQd")
QUIET_FIELD = struct.Struct("<d")

HAS_SENT_AT = 1
SUCCESS = 2
RESET = 4
QUIET = 8                      # an append: the quiet promise follows the header

NO_TIME = struct.pack("<d", 0.0)

def encode_append(key: bytes | None, term: int, prev_index: int, prev_term: int, commit_index: int,
                  entries: list, sent_at: float | None = None, quiet_s: float | None = None) -> bytes:
    """The payload of an append carrying the connection's ``key``: ``entries`` are ``(command,
    index, term)``, consecutive after ``prev_index``, as the journal holds them."""
    key = key or b""
    flags = (0 if sent_at is None else HAS_SENT_AT) | (0 if quiet_s is None else QUIET)
    length = 0
    for command, _, _ in entries:
        length += ENTRY_HEADER.size + len(command)
    parts = [PREFIX.pack(APPEND, len(key)), key,
             APPEND_HEADER.pack(flags, term, prev_index, prev_term, commit_index,
                                0.0 if sent_at is None else sent_at, len(entries), length)]
    if quiet_s is not None:
        parts.append(QUIET_FIELD.pack(quiet_s))
    for command, index, entry_term in entries:
        parts.append(ENTRY_HEADER.pack(index, entry_term, len(command)))
        parts.append(command)     # joined once: a batch's entries are copied once, as a pickle copies them
    return b"".join(parts)


def encode_answer(key: bytes | None, term: int, next_index: int, success: bool, reset: bool,
                  sent_at: float | None = None) -> bytes:
    """The payload of an answer to an append, carrying the connection's ``key``."""
    key = key or b""
    flags = ((0 if sent_at is None else HAS_SENT_AT) | (SUCCESS if success else 0) | (RESET if reset else 0))
    return b"".join((PREFIX.pack(ANSWER, len(key)), key,
                     ANSWER_HEADER.pack(flags, term, next_index, 0.0 if sent_at is None else sent_at)))


def encode(message: dict, key: bytes | None) -> bytes:
    """The payload of an append or an answer in the form ``decode`` gives (a pysyncobj message)."""
    if message["type"] == "append_entries":
        return encode_append(key, message["term"], message["prevLogIdx"], message["prevLogTerm"],
                             message["commit_index"], message["entries"], message.get("sent_at"),
                             message.get("quiet_s"))
    return encode_answer(key, message["term"], message["next_node_idx"], message["success"], message["reset"],
                         message.get("sent_at"))


def decode(data) -> tuple[bytes | None, dict]:
    """The key and the message of a frame's payload; ``ValueError`` unless all of it is well formed."""
    view = memoryview(data)
    if len(view) < PREFIX.size:
        raise ValueError("a binary frame shorter than its prefix")
    kind, key_length = PREFIX.unpack_from(view)
    if key_length not in (0, KEY_BYTES):
        raise ValueError(f"a binary frame with a {key_length}-byte key")
    offset = PREFIX.size + key_length
    if len(view) < offset:
        raise ValueError("a binary frame cut in its key")
    key = bytes(view[PREFIX.size:offset]) if key_length else None
    if kind == APPEND:
        return key, _decode_append(view, offset)
    if kind == ANSWER:
        return key, _decode_answer(view, offset)
    raise ValueError(f"a binary frame of unknown kind {kind:#x}")


def _decode_append(view: memoryview, offset: int) -> dict:
    if len(view) < offset + APPEND_HEADER.size:
        raise ValueError("an append cut in its header")
    flags, term, prev_idx, prev_term, commit, sent_at, count, length = APPEND_HEADER.unpack_from(view, offset)
    if flags & ~(HAS_SENT_AT | QUIET):
        raise ValueError(f"an append with unknown flags {flags:#x}")
    offset += APPEND_HEADER.size
    quiet_s = None
    if flags & QUIET:
        if len(view) - offset < QUIET_FIELD.size:
            raise ValueError("an append cut in its quiet promise")
        quiet_s, = QUIET_FIELD.unpack_from(view, offset)
        offset += QUIET_FIELD.size
    if len(view) - offset != length:
        raise ValueError(f"an append declaring {length} bytes of entries carries {len(view) - offset}")
    if prev_term > term:
        raise ValueError("an append whose previous entry's term is past its own")
    entries = []
    expected, last_term = prev_idx + 1, prev_term
    for _ in range(count):
        if len(view) - offset < ENTRY_HEADER.size:
            raise ValueError("an append cut in an entry's header")
        index, entry_term, size = ENTRY_HEADER.unpack_from(view, offset)
        offset += ENTRY_HEADER.size
        if index != expected:
            raise ValueError(f"an append's entry {index} where {expected} follows")
        if not last_term <= entry_term <= term:
            raise ValueError(f"an append's entry of term {entry_term} after term {last_term} (append's {term})")
        if len(view) - offset < size:
            raise ValueError("an append cut in an entry's command")
        entries.append((bytes(view[offset:offset + size]), index, entry_term))
        offset += size
        expected, last_term = index + 1, entry_term
    if offset != len(view):
        raise ValueError("an append with bytes after its last entry")
    message = {"type": "append_entries", "term": term, "commit_index": commit,
               "prevLogIdx": prev_idx, "prevLogTerm": prev_term, "entries": entries}
    _put_sent_at(message, flags, sent_at)
    if quiet_s is not None:
        message["quiet_s"] = quiet_s
    return message


def _put_sent_at(message: dict, flags: int, sent_at: float) -> None:
    if flags & HAS_SENT_AT:
        message["sent_at"] = sent_at
    elif struct.pack("<d", sent_at) != NO_TIME:
        raise ValueError("a time where the flags say there is none")


def _decode_answer(view: memoryview, offset: int) -> dict:
    if len(view) - offset != ANSWER_HEADER.size:
        raise ValueError(f"an answer of {len(view) - offset} bytes after its key, not {ANSWER_HEADER.size}")
    flags, term, next_idx, sent_at = ANSWER_HEADER.unpack_from(view, offset)
    if flags & ~(HAS_SENT_AT | SUCCESS | RESET):
        raise ValueError(f"an answer with unknown flags {flags:#x}")
    message = {"type": "next_node_idx", "term": term, "next_node_idx": next_idx,
               "reset": bool(flags & RESET), "success": bool(flags & SUCCESS)}
    _put_sent_at(message, flags, sent_at)
    return message

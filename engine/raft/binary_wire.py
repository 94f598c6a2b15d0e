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
A message this form cannot carry exactly (a snapshot, an unexpected key, a
value out of range) is not ``encodable`` and goes as a pickle.
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

U64 = 1 << 64
U32 = 1 << 32
APPEND_KEYS = frozenset({"type", "term", "commit_index", "prevLogIdx", "prevLogTerm", "entries", "sent_at",
                         "quiet_s"})
APPEND_REQUIRED = APPEND_KEYS - {"sent_at", "quiet_s"}
ANSWER_KEYS = frozenset({"type", "term", "next_node_idx", "reset", "success", "sent_at"})
ANSWER_REQUIRED = ANSWER_KEYS - {"sent_at"}


def _u64(value) -> bool:
    return type(value) is int and 0 <= value < U64


def _float(value) -> bool:
    return type(value) is float


def encodable(message) -> bool:
    """Whether ``encode`` carries ``message`` exactly (``decode`` gives an equal one back)."""
    if not isinstance(message, dict):
        return False
    kind = message.get("type")
    keys = message.keys()
    if kind == "append_entries":
        if not (APPEND_REQUIRED <= keys <= APPEND_KEYS):
            return False
        if not all(_u64(message[k]) for k in ("term", "commit_index", "prevLogIdx", "prevLogTerm")):
            return False
        if "sent_at" in message and not _float(message["sent_at"]):
            return False
        if "quiet_s" in message and not _float(message["quiet_s"]):
            return False
        entries = message["entries"]
        if type(entries) is not list or len(entries) >= U32:
            return False
        expected = message["prevLogIdx"] + 1
        for entry in entries:
            if (type(entry) is not tuple or len(entry) != 3 or type(entry[0]) is not bytes
                    or entry[1] != expected or not _u64(entry[1]) or not _u64(entry[2])):
                return False
            expected += 1
        return True
    if kind == "next_node_idx":
        if not (ANSWER_REQUIRED <= keys <= ANSWER_KEYS):
            return False
        return (_u64(message["term"]) and _u64(message["next_node_idx"])
                and type(message["reset"]) is bool and type(message["success"]) is bool
                and ("sent_at" not in message or _float(message["sent_at"])))
    return False


def encode(message: dict, key: bytes | None) -> bytes:
    """The frame's payload for an ``encodable`` message, carrying the connection's ``key``."""
    key = key or b""
    sent_at = message.get("sent_at")
    flags = 0 if sent_at is None else HAS_SENT_AT
    if message["type"] == "append_entries":
        entries = message["entries"]
        length = sum(ENTRY_HEADER.size + len(command) for command, _, _ in entries)
        quiet_s = message.get("quiet_s")
        flags |= 0 if quiet_s is None else QUIET
        parts = [PREFIX.pack(APPEND, len(key)), key,
                 APPEND_HEADER.pack(flags, message["term"], message["prevLogIdx"], message["prevLogTerm"],
                                    message["commit_index"], 0.0 if sent_at is None else sent_at, len(entries),
                                    length)]
        if quiet_s is not None:
            parts.append(QUIET_FIELD.pack(quiet_s))
        for command, index, term in entries:
            parts.append(ENTRY_HEADER.pack(index, term, len(command)))
            parts.append(command)     # joined once: a batch's entries are copied once, as a pickle copies them
        return b"".join(parts)
    flags |= (SUCCESS if message["success"] else 0) | (RESET if message["reset"] else 0)
    return b"".join((PREFIX.pack(ANSWER, len(key)), key,
                     ANSWER_HEADER.pack(flags, message["term"], message["next_node_idx"], 0.0 if sent_at is None else sent_at)))


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

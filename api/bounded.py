"""Request bodies are measured before they are decoded.

A decoder builds whatever the bytes describe: 4 MiB of ``[{},{},...]`` is a
million dicts (hundreds of MiB and seconds of CPU on the interpreter that
also runs Raft), a CBOR header may declare a string of 2^63 bytes, a bignum
tag a 5000-digit integer. ``check_json`` and ``check_cbor`` walk the raw
bytes first -- a walk that stops at the first limit it crosses, so its own
cost is bounded by the limits, not by the body -- and refuse with a
``bad_request`` that names the limit:

- at most ``MAX_VALUES`` values (every scalar, string, key and container
  counts one) and ``MAX_DEPTH`` levels of nesting per request;
- integers within 64 bits (-2^63 .. 2^64-1) and finite floats only;
- CBOR: definite lengths only, no tags, no simple values besides
  false/true/null, text-string map keys, declared lengths within the body.

Only then does orjson or cbor2 decode it (and find any other malformation).
"""

import math
import re
import struct

from .errors import ApiError

MAX_VALUES = 200_000
MAX_DEPTH = 68          # a message body may nest 64 levels inside {"messages": [{"body": ...}]}
INT_MIN, INT_END = -(1 << 63), 1 << 64

_JSON_TOKEN = re.compile(
    # a string, its contents skipped in C; an unclosed one runs to the end, so
    # no start position is tried twice (orjson then refuses it)
    rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)'
    rb'|[\[{]|[\]}]'                                 # containers
    rb'|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?'   # a number
    rb'|true|false|null', re.S)


def _refuse(message: str):
    raise ApiError("bad_request", message)


# Only an integer literal of 19 digits or more can leave 64 bits (orjson
# would make it a float); orjson itself refuses infinities.  Digits become
# "0" so that a plain substring search (fast, in C) finds such a run.
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19


def check_json(raw: bytes, max_values: int = MAX_VALUES) -> None:
    # Fast path, all in C: values <= 1 + 2 * (commas + containers), and bytes
    # inside strings only raise that bound.  Nesting is then left to orjson
    # (it stops at 1024 levels, cheaply) and to the validation of what was
    # decoded, which takes no message body deeper than 64 levels.
    bound = 1 + 2 * (raw.count(b",") + raw.count(b"[") + raw.count(b"{"))
    if bound <= max_values and _LONG_NUMBER not in raw.translate(_DIGITS_AS_ZERO):
        return
    values = depth = 0
    for match in _JSON_TOKEN.finditer(raw):
        token = match.group()
        first = token[0]
        if first in b"[{":
            depth += 1
            if depth > MAX_DEPTH:
                _refuse(f"the body nests deeper than {MAX_DEPTH} levels")
        elif first in b"]}":
            depth -= 1
            continue
        elif first == 0x2D or 0x30 <= first <= 0x39:
            _check_json_number(token)
        values += 1
        if values > max_values:
            _refuse(f"the body holds more than {max_values} values")


def _check_json_number(token: bytes) -> None:
    if any(c in token for c in b".eE"):
        if not math.isfinite(float(token)):
            _refuse(f"number {token[:40].decode()} is out of range (no infinities)")
        return
    if len(token) > 21 or not INT_MIN <= int(token) < INT_END:
        _refuse(f"integer {token[:40].decode()} is outside 64 bits")


_FLOATS = {25: struct.Struct(">e"), 26: struct.Struct(">f"), 27: struct.Struct(">d")}
_SIMPLE_OK = (20, 21, 22)          # false, true, null
_ARG_SIZES = {24: 1, 25: 2, 26: 4, 27: 8}


def check_cbor(raw: bytes) -> None:
    """One CBOR item, walked header by header without building it (the
    stream's every frame passes here: the loop is kept tight)."""
    end = len(raw)
    pos = values = 0
    # Per open container, the items still to read (a map's keys and values
    # both count: a key comes when an even number is left) and whether it is
    # a map; the outermost level holds the one item.
    left = [1]
    maps = [False]
    while left:
        remaining = left[-1]
        if not remaining:
            left.pop()
            maps.pop()
            continue
        left[-1] = remaining - 1
        if pos >= end:
            _refuse("the CBOR body ends inside an item")
        initial = raw[pos]
        major = initial >> 5
        info = initial & 31
        pos += 1
        if info < 24:
            arg = info
        elif info <= 27:
            size = _ARG_SIZES[info]
            if pos + size > end:
                _refuse("the CBOR body ends inside an item header")
            if major == 7:
                if info == 24:
                    _refuse("CBOR simple values other than false, true and null are not accepted")
                if not math.isfinite(_FLOATS[info].unpack_from(raw, pos)[0]):
                    _refuse("non-finite numbers (NaN, infinities) are not accepted")
            arg = int.from_bytes(raw[pos:pos + size], "big")
            pos += size
        else:
            _refuse("indefinite-length or reserved CBOR items are not accepted")
        values += 1
        if values > MAX_VALUES:
            _refuse(f"the body holds more than {MAX_VALUES} values")
        if major == 3:
            if arg > end - pos:
                _refuse("a CBOR string declares more bytes than the body holds")
            pos += arg
            continue
        if maps[-1] and not remaining & 1:
            _refuse("CBOR map keys must be text strings")
        if major == 0:
            continue
        if major == 2:
            if arg > end - pos:
                _refuse("a CBOR string declares more bytes than the body holds")
            pos += arg
        elif major == 5 or major == 4:
            count = arg + arg if major == 5 else arg
            if count > end - pos:      # every item takes at least one byte
                _refuse("a CBOR container declares more items than the body holds")
            if len(left) > MAX_DEPTH:
                _refuse(f"the body nests deeper than {MAX_DEPTH} levels")
            left.append(count)
            maps.append(major == 5)
        elif major == 1:
            if arg >= 1 << 63:
                _refuse("integer is outside 64 bits")
        elif major == 6:
            _refuse("CBOR tags are not accepted")
        elif info < 24 and info not in _SIMPLE_OK:
            _refuse("CBOR simple values other than false, true and null are not accepted")
    if pos != end:
        _refuse("the CBOR body has bytes after its item")

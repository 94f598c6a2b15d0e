"""docs/security.md states the numbers the code enforces.

Each row of its "Input bounds" and "Caps" tables, and each limit of its Raft
port list, is read from the document and compared with the code: a row that
names a `--option` with the default of `raftq node`'s option (and of
`api.app.Settings`/`Limits`, which the node is built from); any other row with
the constant or the behaviour it describes (INPUT_BOUNDS). A new row is
checked as soon as it is added: one naming an option `raftq node` lacks, or
an input bound not mapped below, fails and says what to do.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from raftq.api import bounded, stream
from raftq.api.app import Settings
from raftq.api.limits import Limits
from raftq.api.routes import ROUTES
from raftq.api.sqs import (attributes as sqs_attributes, message_actions as sqs_messages, protocol as sqs_protocol,
                           query as sqs_query)
from raftq.engine.committer import MAX_ENTRY_BYTES
from raftq.engine.raft import wire as raft_wire
from raftq.cli import parser
from raftq.statemachine import backoff, check_command, machine, principals, queue, ready, staging, validation
import raftq.wire_format

DOC = Path(__file__).resolve().parent.parent / "docs" / "security.md"
SIZES = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
SECONDS = {"ms": 0.001, "s": 1, "second": 1, "seconds": 1, "minute": 60, "minutes": 60, "hour": 3600,
           "hours": 3600, "day": 86400, "days": 86400}
WORDS = {"one": 1, "two": 2}
# a number (1 000 or 1000 or 2.5 or 2^40), then its unit if any
QUANTITY = re.compile(r"(-?)(?:(\d+)\^(\d+)(-1)?|(\d{1,3}(?: \d{3})+|\d+(?:\.\d+)?)|\b(one|two)\b)"
                      r"(?:\s*(KiB|MiB|GiB|ms|seconds|second|s|minutes|minute|hours|hour|days|day)\b)?")


def quantities(text: str) -> list[tuple[float, str | None]]:
    """Every number in `text` with its unit, sizes in bytes and times in seconds
    (unit "size" or "time"), bare numbers with unit None."""
    found = []
    for sign, base, power, minus_one, plain, word, unit in QUANTITY.findall(text):
        if base:
            value = int(base) ** int(power) - (1 if minus_one else 0)
        elif plain:
            value = float(plain.replace(" ", ""))
        else:
            value = WORDS[word]
        value = -value if sign else value
        if unit in SIZES:
            found.append((value * SIZES[unit], "size"))
        elif unit in SECONDS:
            found.append((value * SECONDS[unit], "time"))
        elif not word:
            found.append((value, None))
    return found


def section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def table(title: str) -> list[list[str]]:
    """The rows of the first table in a section, as cells (header and rule dropped)."""
    rows = [line for line in section(title).splitlines() if line.startswith("|")]
    assert len(rows) > 2, f"no table under '## {title}'"
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def node_option_defaults() -> dict[str, object]:
    """`raftq node`'s options and the defaults it runs with (raftq/cli/run.py)."""
    given = parser().parse_args(["node", "--config", "cluster.toml", "--id", "n1"])
    return {"--" + dest.replace("_", "-"): value for dest, value in vars(given).items()}


def option_in_code(option: str, defaults: dict) -> float:
    """The default of `option`, after checking that the settings the node is
    built from default to the same value (the option is what a node runs with)."""
    assert option in defaults, (
        f"docs/security.md names {option}, which `raftq node` does not have: add the option "
        "(raftq/cli/run.py, api.limits.Limits), or correct the row")
    value = defaults[option]
    field = option[2:].replace("-", "_")
    for holder in (Settings(), Settings().limits):
        if field in {f.name for f in dataclasses.fields(holder)}:
            assert getattr(holder, field) == value, (
                f"{type(holder).__name__}.{field} defaults to {getattr(holder, field)}, {option} to {value}")
    return value


def expected_in_option_units(option: str, documented: tuple[float, str | None]) -> float:
    value, unit = documented
    if option.endswith("-ms"):
        assert unit == "time", f"{option} is in milliseconds; the row should give a duration"
        return value * 1000
    if option.endswith("-s"):
        assert unit == "time", f"{option} is in seconds; the row should give a duration"
        return value
    assert unit != "time", f"{option} is no duration"
    return value


def _largest_key_accepted() -> int:
    """The longest message key a put may carry, found by the validator itself."""
    def ok(length: int) -> bool:
        return check_command({"op": "put", "queue": "q", "now_ms": 0,
                              "messages": [{"body": "b", "key": "k" * length}]}) is None
    longest = 1
    while ok(longest * 2):
        longest *= 2
    step = longest // 2
    while step:
        if ok(longest + step):
            longest += step
        step //= 2
    return longest


def _browse_limit() -> int:
    route = next(r for r in ROUTES if r.method == "GET" and r.path.endswith("/messages"))
    return next(schema["maximum"] for name, schema in route.query if name == "limit")


def _string_map_bounds(field: str) -> list[int]:
    """As the rows state them: entries, then names from 1 to their longest, then the longest value."""
    entries, longest_name, longest_value = validation.STRING_MAPS[field]
    return [entries, 1, longest_name, longest_value]


# Input bounds that name no option: what in the code each row states, by the
# start of its first cell, as the row's numbers (a bare number, or (value,
# "time") in seconds) or the text it quotes. None: the row states no number
# (tests/test_security_input.py proves it).
INPUT_BOUNDS = {
    "values in a body": lambda: [bounded.MAX_VALUES],
    "nesting of a body": lambda: [bounded.MAX_DEPTH, bounded.MAX_DEPTH - 4],
    "integers": lambda: [bounded.INT_MIN, bounded.INT_END - 1],
    "floats": None,
    "CBOR": None,
    "messages per put": lambda: [validation.MAX_BATCH],
    "`max` of a receive": lambda: [validation.MAX_RECEIVE],
    "`wait_ms` of a receive": lambda: [validation.MAX_WAIT_MS],
    "key, id": lambda: [_largest_key_accepted()],
    "durations": lambda: [(validation.MAX_DURATION_MS / 1000, "time")],
    "`limit` of a browse": lambda: [_browse_limit()],
    "queue, group, node names": lambda: [raftq.wire_format.NAME_PATTERN],
    "a commit's `batch` past": lambda: [staging.MAX_BATCH_STEP],
    "new queues made by one log entry": lambda: [machine.MAX_NEW_QUEUES_PER_ENTRY],
    "stored messages of a queue a group may start": lambda: [queue.MAX_EARLIEST_GROUP_MESSAGES],
    "a message's `ordering_key`": lambda: [validation.MAX_ORDERING_KEY],
    "a message's `priority`": lambda: [0, ready.PRIORITIES - 1],
    "a back-off policy's `factor`": lambda: [1, backoff.MAX_FACTOR, 0, 1],
    "a group's `rate_limit`": lambda: [validation.MAX_RATE_LIMIT],
    "a queue's `tags`": lambda: _string_map_bounds("tags"),
    "a queue's `sqs_attributes`": lambda: _string_map_bounds("sqs_attributes"),
    "SQS: entries of a batch": lambda: [sqs_messages.MAX_BATCH, (sqs_messages.MAX_BATCH_BYTES, "size")],
    "SQS: message attributes per message": lambda: [sqs_attributes.MAX_MESSAGE_ATTRIBUTES],
    "SQS: parameters of a query-protocol call": lambda: [sqs_query.MAX_FIELDS, sqs_query.MAX_INDEX,
                                                         sqs_query.MAX_NAME_PARTS, sqs_query.MAX_NAME_CHARS],
    "SQS: values of a JSON-protocol body": lambda: [sqs_protocol.MAX_JSON_VALUES],
    "SQS: one message's `AWSTraceHeader`": None,     # tests/test_security_sqs.py proves it
    "SQS: keys the cluster keeps": lambda: [principals.MAX_SQS_KEYS],
}


def input_bound_rows():
    return [pytest.param(row, id=row[0][:40]) for row in table("Input bounds")]


def cap_rows():
    return [pytest.param(row, id=row[0]) for row in table("Caps")]


@pytest.mark.parametrize("row", input_bound_rows())
def test_each_input_bound_is_the_codes(row):
    what, maximum, _ = row
    option = re.search(r"`(--[a-z-]+)`", maximum)
    if option:
        option = option.group(1)
        documented = expected_in_option_units(option, quantities(maximum.replace(option, ""))[0])
        in_code = option_in_code(option, node_option_defaults())
        assert documented == in_code, f"'{what}': the document says {maximum}, {option} defaults to {in_code}"
        return
    key = next((k for k in INPUT_BOUNDS if what.startswith(k)), None)
    assert key is not None, (f"docs/security.md's input bound '{what}' names no `--option`: map it to "
                             "what the code enforces in INPUT_BOUNDS (tests/test_security_docs.py)")
    if INPUT_BOUNDS[key] is None:
        return
    in_code = INPUT_BOUNDS[key]()
    if isinstance(in_code[0], str):
        assert f"`{in_code[0]}`" in maximum, f"'{what}': the document says {maximum}, the code {in_code[0]}"
        return
    in_code = [item if isinstance(item, tuple) else (item, None) for item in in_code]
    documented = quantities(maximum)[:len(in_code)]
    assert documented == in_code, f"'{what}': the document says {maximum}, the code {in_code}"


@pytest.mark.parametrize("row", cap_rows())
def test_each_cap_is_the_default_of_its_option(row):
    option, default, _ = row
    assert re.fullmatch(r"`--[a-z-]+`", option), f"a Caps row names its `--option` first, not {option}"
    option = option.strip("`")
    documented = quantities(default)
    assert documented, f"{option}: no number in '{default}'"
    in_code = option_in_code(option, node_option_defaults())
    assert expected_in_option_units(option, documented[0]) == in_code, (
        f"docs/security.md gives {option} as {default}; its default is {in_code}")


def test_every_cap_of_the_node_has_a_row():
    documented = {row[0].strip("`") for row in table("Caps")}
    options = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(Limits)}
    assert options <= documented, f"caps without a row in docs/security.md: {sorted(options - documented)}"


def test_the_raft_port_limits_are_the_codes():
    text = " ".join(section("The Raft port").split())
    frame = re.search(r"at most `2 \* \(max entry \+ 64 KiB\) \+ 1 MiB` \(([\d.]+) MiB with the (\d+) MiB entries",
                      text)
    assert frame, "the Raft port's frame limit is no longer stated as the test reads it"
    assert int(frame.group(2)) << 20 == MAX_ENTRY_BYTES
    assert raft_wire.max_frame_bytes(MAX_ENTRY_BYTES) == 2 * (MAX_ENTRY_BYTES + (64 << 10)) + (1 << 20)
    assert float(frame.group(1)) == round(raft_wire.max_frame_bytes(MAX_ENTRY_BYTES) / (1 << 20), 1)
    deadline = re.search(r"within ([\d.]+) s \(`HANDSHAKE_DEADLINE_S`\)", text)
    assert deadline and float(deadline.group(1)) == raft_wire.HANDSHAKE_DEADLINE_S
    pending = re.search(r"at most (\d+) such unidentified connections per remote address and (\d+) in all", text)
    assert pending and (int(pending.group(1)), int(pending.group(2))) == (
        raft_wire.PENDING_PER_ADDRESS, raft_wire.PENDING_LIMIT)
    preamble = re.search(r"a preamble of at most (\d+) bytes \(`PREAMBLE_MAX_BYTES`", text)
    assert preamble and int(preamble.group(1)) == raft_wire.PREAMBLE_MAX_BYTES
    backlog = re.search(r"waits in a backlog of (\d+) and up to (\d+) are accepted per tick", text)
    assert backlog and (int(backlog.group(1)), int(backlog.group(2))) == (
        raft_wire.LISTEN_BACKLOG, raft_wire.ACCEPTS_PER_TICK)
    warnings = re.search(r"each kind of warning at most once per ([\d.]+) s", text)
    assert warnings and float(warnings.group(1)) == raft_wire.STRANGER_WARNING_INTERVAL_S


def test_the_streaming_wire_frame_bound_is_the_codes():
    text = " ".join(section("Input bounds").split())
    stated = re.search(r"the streaming wire's CBOR frames alike, each at most (\d+) MiB", text)
    assert stated and int(stated.group(1)) << 20 == stream.MAX_FRAME_BYTES

"""engine.storage.records: the one record format and its writers, byte for byte."""

import os
import stat
import struct
import zlib

import pytest

from chaos import disk_faults
from raftq.engine.storage import records

MAGIC = b"RAFTQTST"


def test_a_record_is_length_crc_of_length_and_payload_then_payload():
    record = records.encode(b"hello")
    length = struct.pack("<I", 5)
    assert record == length + struct.pack("<I", zlib.crc32(b"hello", zlib.crc32(length))) + b"hello"


def test_whole_file_round_trip_is_0600_with_its_header(tmp_path):
    path = tmp_path / "f"
    size = records.write_file(path, MAGIC, [b"one", b"", b"three" * 1000], tag=7)
    data = path.read_bytes()
    assert size == len(data)
    assert records.FILE_HEADER.unpack_from(data) == (MAGIC, 7)
    assert records.read_file(path, MAGIC) == [b"one", b"", b"three" * 1000]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    records.check_file(path, MAGIC, 3)
    for count in (2, 4):
        with pytest.raises(records.DamagedFile):
            records.check_file(path, MAGIC, count)
    path.write_bytes(b"")
    with pytest.raises(records.DamagedFile):
        records.check_file(path, MAGIC, 0)


def test_a_streamed_payload_is_the_record_its_bytes_would_be(tmp_path):
    """A payload written by a function (a snapshot's state, encoded into the file) makes the file
    the same bytes would: its header, written last, holds its length and checksum."""
    large = os.urandom(3 * records.STREAM_BUFFER_BYTES + 17)     # more than one read back

    def produce(out):
        out.write(large[:10])               # small writes gathered, a large one passed through
        out.write(large[10:])

    streamed, whole = tmp_path / "streamed", tmp_path / "whole"
    size = records.write_file(streamed, MAGIC, [b"header", produce, lambda out: None, b"after"])
    records.write_file(whole, MAGIC, [b"header", large, b"", b"after"])
    assert streamed.read_bytes() == whole.read_bytes() and size == whole.stat().st_size
    assert records.read_file(streamed, MAGIC) == [b"header", large, b"", b"after"]


def test_a_streamed_payload_that_fails_fails_the_write(tmp_path):
    def produce(out):
        out.write(b"half a state")
        raise RuntimeError("the state machine cannot encode its state")

    path = tmp_path / "f"
    with pytest.raises(RuntimeError):
        records.write_file(path, MAGIC, [b"header", produce])
    assert not path.exists()                       # no half file is left to be read as a damaged one


@pytest.mark.parametrize("damage", ["payload bit", "length bit", "crc bit", "torn", "extra byte", "magic"])
def test_a_damaged_whole_file_is_refused(tmp_path, damage):
    path = tmp_path / "f"
    records.write_file(path, MAGIC, [b"first record", b"second record"])
    data = bytearray(path.read_bytes())
    second = records.FILE_HEADER.size + len(records.encode(b"first record"))
    if damage == "payload bit":
        data[second + 8 + 2] ^= 0x01
    elif damage == "length bit":
        data[second] ^= 0x01       # one byte shorter: still fits the file
    elif damage == "crc bit":
        data[second + 4] ^= 0x80
    elif damage == "torn":
        del data[-1]
    elif damage == "extra byte":
        data += b"\0"
    else:
        data[0] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(records.DamagedFile):
        records.read_file(path, MAGIC)
    with pytest.raises(records.DamagedFile):
        records.check_file(path, MAGIC, 2)


def test_the_reader_stops_at_the_first_bad_record(tmp_path):
    payloads = [b"a" * 10, b"b" * 20, b"c" * 30]
    data = bytearray(records.file_header(MAGIC) + b"".join(records.encode(p) for p in payloads))
    ends = [end for _, end, _ in records.iter_records(bytes(data))]
    assert len(ends) == 3 and ends[-1] == len(data)
    data[ends[0] + 8 + 5] ^= 0x04          # inside the second payload
    found = list(records.iter_records(bytes(data)))
    assert [bytes(p) for _, _, p in found] == [b"a" * 10]
    # a record whose length runs past the end is a torn tail, not a record
    assert [bytes(p) for _, _, p in records.iter_records(bytes(data[:ends[1] - 1]))] == [b"a" * 10]


def test_replace_file_leaves_no_temp_and_replaces_whole(tmp_path):
    path = tmp_path / "f"
    records.replace_file(path, MAGIC, [b"old"])
    records.replace_file(path, MAGIC, [b"new", b"er"])
    assert records.read_file(path, MAGIC) == [b"new", b"er"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_the_appender_writes_at_its_end_and_syncs_only_what_is_new(tmp_path, monkeypatch):
    path = tmp_path / "log"
    records.write_file(path, MAGIC)
    log = records.Appender(path, preallocate=4096)
    synced = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd)))
    first = log.append(records.encode(b"x" * 10))
    assert first == records.FILE_HEADER.size
    assert log.sync() is True and log.sync() is False
    log.append(records.encode(b"y" * 10))
    assert log.sync() is True
    assert synced == [log.fd, log.fd]
    assert path.stat().st_size == 4096 + records.FILE_HEADER.size      # preallocated
    log.trim()
    log.close()
    data = path.read_bytes()
    assert [bytes(p) for _, _, p in records.iter_records(data)] == [b"x" * 10, b"y" * 10]
    assert len(data) == log.end


# -- writes are checked (issue 47) ----------------------------------------------------------------

@pytest.fixture
def faults(tmp_path):
    """The fault seam armed in this process, through a control file; disarmed at the end."""
    control = tmp_path / "disk-faults.json"
    disk_faults.install(control)
    try:
        yield control
    finally:
        disk_faults.uninstall()
        records.on_fatal(None)


def appended(path):
    return [bytes(p) for _, _, p in records.iter_records(path.read_bytes())]


@pytest.mark.parametrize("preallocate", [0, 4096])
def test_a_short_write_is_completed(tmp_path, faults, preallocate):
    path = tmp_path / "log"
    records.write_file(path, MAGIC)
    log = records.Appender(path, preallocate=preallocate)
    disk_faults.arm(faults, {"kind": "short_write", "path": str(path)})
    for payload in (b"a" * 1000, b"b" * 3):
        log.append(records.encode(payload))
        log.sync()
    whole = tmp_path / "whole"
    records.write_file(whole, MAGIC, [b"c" * 5000, lambda out: out.write(b"d" * 7000)])
    disk_faults.disarm(faults)
    log.trim()
    log.close()
    assert appended(path) == [b"a" * 1000, b"b" * 3]
    assert records.read_file(whole, MAGIC) == [b"c" * 5000, b"d" * 7000]


@pytest.mark.parametrize("preallocate", [0, 4096])
def test_a_write_that_finds_no_room_leaves_nothing_of_itself(tmp_path, faults, preallocate):
    """A full disk takes part of a write, then refuses the rest: the record is not counted, nothing
    of it stays after the last whole record, and the next append goes where it would have."""
    path = tmp_path / "log"
    records.write_file(path, MAGIC)
    log = records.Appender(path, preallocate=preallocate)
    log.append(records.encode(b"first"))
    end, size = log.end, path.stat().st_size
    disk_faults.arm(faults, {"kind": "no_room", "path": str(path)})
    with pytest.raises(records.InsufficientStorage):
        log.append(records.encode(b"x" * 10_000))
    assert log.end == end and path.stat().st_size == end <= size
    disk_faults.disarm(faults)
    assert log.append(records.encode(b"second")) == end
    log.sync()
    if preallocate:                                # room again: preallocation goes on
        assert path.stat().st_size == end + preallocate
    log.trim()
    log.close()
    assert appended(path) == [b"first", b"second"]


def test_a_whole_file_that_finds_no_room_is_not_left_half_written(tmp_path, faults):
    path = tmp_path / "f"
    disk_faults.arm(faults, {"kind": "no_room", "path": str(path)})
    with pytest.raises(records.InsufficientStorage):
        records.write_file(path, MAGIC, [b"x" * 10_000])
    assert not path.exists()


def test_a_failed_sync_is_fatal_and_never_retried(tmp_path, faults, monkeypatch):
    """After EIO from fsync the kernel may have dropped the dirty pages, and a second fsync would
    succeed (fsyncgate): the process's handler runs, and the appender never syncs again."""
    path = tmp_path / "log"
    records.write_file(path, MAGIC)
    log = records.Appender(path)
    fatal = []
    records.on_fatal(fatal.append)
    disk_faults.arm(faults, {"kind": "sync_eio", "path": str(path), "count": 1})
    log.append(records.encode(b"never acknowledged"))
    with pytest.raises(records.SyncFailed):
        log.sync()
    assert len(fatal) == 1 and str(path) in fatal[0] and "Input/output error" in fatal[0]
    assert disk_faults.hits(faults) == 1           # the fault is spent: a sync now would succeed
    synced = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd)))
    for retry in (log.sync, lambda: log.append(records.encode(b"more"))):
        with pytest.raises(records.SyncFailed):
            retry()
    assert synced == []

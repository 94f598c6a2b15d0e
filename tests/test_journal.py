"""engine.storage.journal.DurableJournal: what survives a reopen, a torn write, a kill -9."""

import errno
import logging
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chaos import sync_ledger
from chaos.power import node_site_env
from raftq.engine.storage import records
from raftq.engine.storage.damage import DamagedRecord
from raftq.engine.storage.journal import (KEPT_MAGIC, PREALLOCATE_BYTES, SEGMENT_HEADER, SYNC_MARK_BYTES,
                                          DurableJournal, encode_record)
from raftq.engine.storage.records import DamagedFile
from tests.tools import require_strace

ROOT = Path(__file__).resolve().parent.parent


def fill(journal, first, count, term=1, size=20):
    for idx in range(first, first + count):
        journal.add(bytes([idx % 251]) * size + b"#%d" % idx, idx, term)


def contents(journal):
    return [journal[i] for i in range(len(journal))]


def segments(path):
    return sorted(p for p in Path(path).iterdir() if p.name.startswith("seg-"))


def records_end(segment) -> int:
    """Where the intact records of a segment file end (entries and sync marks alike)."""
    return ([SEGMENT_HEADER.size] + [end for _, end, _ in records.iter_records(Path(segment).read_bytes())])[-1]


def flip(path, offset):
    data = bytearray(Path(path).read_bytes())
    data[offset] ^= 0x10
    Path(path).write_bytes(bytes(data))


def record_of(journal, index):
    """(segment file, offset, length) of the entry's record."""
    position = index - journal._first
    return (journal._dir / f"seg-{journal._seqs[position]:012d}.log", journal._offsets[position],
            journal._lengths[position])


def test_reopen_returns_every_entry(tmp_path):
    j = DurableJournal(tmp_path, segment_bytes=300)
    fill(j, 1, 50)
    before = contents(j)
    j._destroy()
    assert len(segments(tmp_path)) > 1
    j = DurableJournal(tmp_path, segment_bytes=300)
    assert contents(j) == before
    assert all(isinstance(e, tuple) and isinstance(e[0], bytes) for e in before)
    fill(j, 51, 5)
    j._destroy()
    assert [e[1] for e in contents(DurableJournal(tmp_path))] == list(range(1, 56))


def test_open_notes_the_entries_of_one_kind_across_segments_and_only_those_it_keeps(tmp_path):
    j = DurableJournal(tmp_path, segment_bytes=300)
    for idx in range(1, 41):
        j.add((b"\x02" if idx % 7 == 0 else b"\x00") + b"c%d" % idx, idx, 1)
    j._destroy()
    assert len(segments(tmp_path)) > 1
    assert DurableJournal(tmp_path).noted_at_open == []
    j = DurableJournal(tmp_path, noted_kind=2)
    assert j.noted_at_open == [7, 14, 21, 28, 35]
    j.deleteEntriesFrom(20 - 1)        # list position: entries 20.. go
    j._destroy()
    assert DurableJournal(tmp_path, noted_kind=2).noted_at_open == [7, 14]


def test_torn_tail_is_truncated_at_open(tmp_path):
    j = DurableJournal(tmp_path)
    fill(j, 1, 10)
    seg, offset, length = record_of(j, 10)
    crash(j)
    with open(seg, "r+b") as f:
        f.truncate(offset + length - 7)   # the last record is cut short
    torn_at = records_end(seg)
    j = DurableJournal(tmp_path)
    assert [e[1] for e in contents(j)] == list(range(1, 10))
    assert seg.stat().st_size == torn_at
    fill(j, 10, 3)                     # appends continue right after the last good record
    j._destroy()
    assert [e[1] for e in contents(DurableJournal(tmp_path))] == list(range(1, 13))


def test_garbage_tail_is_truncated(tmp_path):
    j = DurableJournal(tmp_path)
    fill(j, 1, 4)
    j._destroy()
    seg = segments(tmp_path)[-1]
    good = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(b"\0" * 4096)          # a file extended but never written
    assert [e[1] for e in contents(DurableJournal(tmp_path))] == [1, 2, 3, 4]
    assert seg.stat().st_size == good


def crash(journal):
    """Stop using a journal the way kill -9 would (no sync of its own, no trim)."""
    os.close(journal._appender.fd)
    journal._appender = None


def test_the_live_segment_is_preallocated_and_trimmed_when_closed(tmp_path):
    j = DurableJournal(tmp_path)
    fill(j, 1, 10)
    seg = segments(tmp_path)[-1]
    assert seg.stat().st_size == PREALLOCATE_BYTES + SEGMENT_HEADER.size
    j._destroy()
    assert seg.stat().st_size == records_end(seg) < PREALLOCATE_BYTES
    assert [e[1] for e in contents(DurableJournal(tmp_path))] == list(range(1, 11))


def test_after_a_crash_the_unused_preallocation_is_not_damage(tmp_path, caplog):
    j = DurableJournal(tmp_path)
    fill(j, 1, 10)
    crash(j)
    with caplog.at_level(logging.WARNING, logger="raftq.engine.storage.journal"):
        j = DurableJournal(tmp_path)
    assert [e[1] for e in contents(j)] == list(range(1, 11))
    assert not caplog.records
    fill(j, 11, 3)                     # appends go right after the last record, into fresh space
    crash(j)
    assert [e[1] for e in contents(DurableJournal(tmp_path))] == list(range(1, 14))


def test_zeros_after_a_rolled_segment_keep_the_segments_after_it(tmp_path, caplog):
    j = DurableJournal(tmp_path, segment_bytes=300)
    fill(j, 1, 40)
    j._destroy()
    first = segments(tmp_path)[0]
    with open(first, "ab") as f:
        f.write(b"\0" * 1000)
    with caplog.at_level(logging.WARNING, logger="raftq.engine.storage.journal"):
        j = DurableJournal(tmp_path, segment_bytes=300)
    assert [e[1] for e in contents(j)] == list(range(1, 41))
    assert not caplog.records


def test_without_fallocate_the_journal_writes_as_it_goes(tmp_path, monkeypatch):
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")
    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    j = DurableJournal(tmp_path, segment_bytes=300)
    fill(j, 1, 30)
    assert segments(tmp_path)[-1].stat().st_size < 300 + 100
    crash(j)
    assert [e[1] for e in contents(DurableJournal(tmp_path))] == list(range(1, 31))


def test_a_truncation_inside_the_preallocation_then_appends(tmp_path):
    j = DurableJournal(tmp_path)
    fill(j, 1, 20)
    j.deleteEntriesFrom(8)
    fill(j, 9, 4, term=2)
    crash(j)
    reopened = contents(DurableJournal(tmp_path))
    assert [(e[1], e[2]) for e in reopened] == [(i, 1) for i in range(1, 9)] + [(i, 2) for i in range(9, 13)]


def test_damage_before_the_last_segment_is_given_up_only_until_the_log_holds_it_again(tmp_path, caplog):
    """A damaged record in a segment before the last was synced (each segment is, before the
    next is started), so this node may have acknowledged it and what follows: it gives them up
    and takes them again from the leader, but votes again only once its log holds everything the
    later segments show it held."""
    j = DurableJournal(tmp_path, segment_bytes=400)
    fill(j, 1, 40)
    victim, offset, _ = record_of(j, 15)
    j._destroy()
    segs = segments(tmp_path)
    assert victim in segs[:-1]
    flip(victim, offset + 8 + 16 + 3)             # inside its command
    with caplog.at_level(logging.ERROR, logger="raftq.engine.storage.journal"):
        j = DurableJournal(tmp_path, segment_bytes=400)
    assert [e[1] for e in contents(j)] == list(range(1, 15))
    assert j.regain_index == 40
    assert segments(tmp_path) == segs[:segs.index(victim) + 1]     # cut at the damage, later segments given up
    assert str(victim) in caplog.text and f"offset {offset}" in caplog.text and "index 15" in caplog.text
    j._destroy()
    j = DurableJournal(tmp_path, segment_bytes=400)
    assert j.regain_index == 40                    # it was written down before the cut
    fill(j, 15, 25)
    assert j.regain_index == 40
    j.add(b"the leader's entry 40", 40, 2)
    assert j.regain_index is None
    j._destroy()
    j = DurableJournal(tmp_path, segment_bytes=400)
    assert j.regain_index is None and [e[1] for e in contents(j)] == list(range(1, 41))


@pytest.mark.parametrize("closed", ["cleanly", "by a crash"])
def test_a_bad_record_with_synced_ones_after_it_in_the_last_segment_is_damage_not_a_torn_write(tmp_path, closed):
    j = DurableJournal(tmp_path)
    fill(j, 1, 20)                                 # each add synced: each later one starts with a sync mark
    _, offset, _ = record_of(j, 10)
    if closed == "cleanly":
        j._destroy()
    else:
        crash(j)
    (segment,) = segments(tmp_path)
    flip(segment, offset + 30)
    j = DurableJournal(tmp_path)
    assert [e[1] for e in contents(j)] == list(range(1, 10))
    # closed cleanly, the log says it synced all 20; after a crash its last sync (entry 20, which
    # it may have acknowledged) is in no mark, but its record lies intact past the damage
    assert j.regain_index == 20


@pytest.mark.parametrize("where", ["in its command", "in its length"])
def test_entries_past_damage_that_no_mark_names_are_regained_too(tmp_path, where):
    """A crash after a sync that no later append marked: the entries it made durable lie intact
    after a record damaged earlier, wherever the damage is (its length too, which hides where
    the next record starts). This node may have acknowledged them: it must hold them again
    before it votes (a chaos campaign found a node that gave up entries 60 to 3526 and voted
    again without 3527, which its leader had counted as acknowledged by it)."""
    j = DurableJournal(tmp_path)
    fill(j, 1, 20)
    with j.deferred():
        fill(j, 21, 10)                            # one sync for 21..30, which no later append marked
    _, offset, _ = record_of(j, 12)
    crash(j)
    (segment,) = segments(tmp_path)
    flip(segment, offset + (30 if where == "in its command" else 1))
    j = DurableJournal(tmp_path)
    assert [e[1] for e in contents(j)] == list(range(1, 12))
    assert j.regain_index == 30


def test_a_record_written_at_another_records_offset_is_damage(tmp_path):
    """A misdirected write: entry 30 landed on entry 10's place, and its own place holds nothing."""
    j = DurableJournal(tmp_path)
    fill(j, 1, 30)
    segment, ten, _ = record_of(j, 10)
    _, thirty, length = record_of(j, 30)
    j._destroy()
    data = bytearray(segment.read_bytes())
    data[ten:ten + length] = data[thirty:thirty + length]
    data[thirty:thirty + length] = bytes(length)
    segment.write_bytes(bytes(data))
    j = DurableJournal(tmp_path)
    assert [e[1] for e in contents(j)] == list(range(1, 10))
    assert j.regain_index == 30


@pytest.mark.parametrize("log_starts", ["at entry 1", "after a compaction", "where meta never saw an entry"])
def test_damage_to_the_first_record_of_the_log_gives_up_the_whole_log_from_its_first_entry(
        tmp_path, caplog, log_starts):
    """The log's first record has no record before it to say its index. Taken to follow the
    commit index, the damage there read as a torn write once the sync marks named nothing past
    it: the node went on with an empty log and voted, having lost entries it acknowledged (and
    what it said it gave up, when it did, was not what its log lost: a chaos campaign on 5
    nodes saw a node give up 'entries 2081 to 2082' whose log then ended at 1). Meta says which
    entry starts the log; when it does not know (the log was empty when meta was last written),
    the node gives up from entry 1."""
    j = DurableJournal(tmp_path)
    if log_starts == "where meta never saw an entry":
        j.clear()                                  # meta written with an empty log
        fill(j, 11, 30)
        first_said = 1
    else:
        fill(j, 1, 40)
        if log_starts == "after a compaction":
            j.deleteEntriesTo(10)                  # meta written with the log starting at 11
        first_said = j.index_and_term(0)[0]
        j.setRaftCommitIndex(40)
        j.onOneSecondTimer()                       # meta written with every entry committed
    first = j.index_and_term(0)[0]
    segment, offset, _ = record_of(j, first)
    crash(j)
    flip(segment, offset + 30)
    with caplog.at_level(logging.ERROR, logger="raftq.engine.storage.journal"):
        j = DurableJournal(tmp_path)
    assert len(j) == 0
    assert j.regain_index == 40                    # every later entry was synced: it may have acknowledged them
    assert f"gives up entries {first_said} to 40" in caplog.text


def test_a_tail_no_sync_covered_is_a_torn_write_however_it_was_lost(tmp_path):
    """A power cut may keep any part of what no sync covered -- a later record without an
    earlier one. None of it was acknowledged: it is cut like a torn write, and the node votes
    as before (were it taken for damage, a cluster that lost power could be left with a
    majority of nodes that wait for entries nobody has)."""
    j = DurableJournal(tmp_path)
    fill(j, 1, 20)
    with j.deferred():
        fill(j, 21, 10)                            # appended, sent, not yet synced: then the power went
        segment, offset, length = record_of(j, 25)
        data = bytearray(segment.read_bytes())
    crash(j)
    data[offset:offset + length] = bytes(length)
    segment.write_bytes(bytes(data))
    j = DurableJournal(tmp_path)
    assert [e[1] for e in contents(j)] == list(range(1, 25))
    assert j.regain_index is None


def test_index_gap_ends_the_log(tmp_path):
    j = DurableJournal(tmp_path)
    fill(j, 1, 3)
    j.add(b"skipped-ahead", 9, 1)
    j._destroy()
    assert [e[1] for e in contents(DurableJournal(tmp_path))] == [1, 2, 3]


def test_delete_entries_from_truncates_across_segments(tmp_path):
    j = DurableJournal(tmp_path, segment_bytes=300)
    fill(j, 1, 60)
    nsegs = len(segments(tmp_path))
    j.deleteEntriesFrom(12)            # positions, as pysyncobj passes them
    assert [e[1] for e in contents(j)] == list(range(1, 13))
    assert len(segments(tmp_path)) < nsegs
    fill(j, 13, 3, term=2)
    j._destroy()
    reopened = contents(DurableJournal(tmp_path, segment_bytes=300))
    assert [(e[1], e[2]) for e in reopened] == [(i, 1) for i in range(1, 13)] + [(i, 2) for i in range(13, 16)]


def test_delete_entries_to_unlinks_dead_segments_without_rewriting(tmp_path):
    j = DurableJournal(tmp_path, segment_bytes=300)
    fill(j, 1, 60)
    segs = segments(tmp_path)
    survivors = {p: p.stat().st_ino for p in segs}
    j.deleteEntriesTo(45)
    assert [e[1] for e in contents(j)] == list(range(46, 61))
    left = segments(tmp_path)
    assert 0 < len(left) < len(segs)
    # the remaining segments are the same files, not rewritten copies
    assert all(survivors[p] == p.stat().st_ino for p in left)
    fill(j, 61, 2)
    j._destroy()
    assert [e[1] for e in contents(DurableJournal(tmp_path, segment_bytes=300))] == list(range(46, 63))


def test_bytes_before_counts_the_records_a_compaction_would_drop(tmp_path):
    j = DurableJournal(tmp_path, segment_bytes=300)
    fill(j, 1, 60)
    # every record of the log in order, entries and sync marks, as (entry index or None, size)
    log = [(None if len(payload) == 16 and payload[:8] == b"\xff" * 8 else int.from_bytes(payload[:8], "little"),
            end - start)
           for seg in segments(tmp_path) for start, end, payload in records.iter_records(seg.read_bytes())]
    assert [index for index, _ in log if index is not None] == list(range(1, 61))

    def before(first, index):
        """Bytes of the log from entry `first` (its sync mark not included) up to entry `index`."""
        at = [n for n, (i, _) in enumerate(log) if i in (first, index)]
        return sum(size for _, size in log[at[0]:at[-1]]) if index != first else 0

    assert j.bytes_before(0) == 0
    assert [j.bytes_before(p) for p in (1, 7, 59)] == [before(1, p + 1) for p in (1, 7, 59)]
    assert j.bytes_before(60) == j.bytes_before(1000) == before(1, 60) + log[-1][1]
    j.deleteEntriesTo(25)              # the live log now starts inside a segment
    assert [j.bytes_before(p) for p in (0, 1, 30)] == [before(26, 26 + p) for p in (0, 1, 30)]

def test_delete_everything_then_append(tmp_path):
    j = DurableJournal(tmp_path)
    fill(j, 1, 5)
    j.deleteEntriesTo(5)
    assert len(j) == 0
    fill(j, 6, 2)
    j._destroy()
    assert [e[1] for e in contents(DurableJournal(tmp_path))] == [6, 7]


def test_clear_starts_a_new_log(tmp_path):
    j = DurableJournal(tmp_path, segment_bytes=300)
    fill(j, 1, 30)
    old = segments(tmp_path)
    assert j.last_index() == 30
    j.clear()
    assert len(j) == 0 and j.last_index() is None   # what a status read mid-install sees
    assert not set(old) & set(segments(tmp_path))
    j.add(b"prev", 100, 4)
    j.add(b"last", 101, 4)
    assert j.last_index() == 101
    j._destroy()
    assert contents(DurableJournal(tmp_path)) == [(b"prev", 100, 4), (b"last", 101, 4)]


def big_command(idx, size=100_000):
    return bytes([idx % 251]) * size + b"#%d" % idx


def test_the_commands_held_in_memory_are_bounded_by_recent_bytes_whatever_the_log_holds(tmp_path):
    # 60 entries of 100 kB (6 MB) and no compaction: what stays in RAM is the newest
    # entries up to recent_bytes, and the first entry's; every other command is read back
    recent = 250_000
    j = DurableJournal(tmp_path, fsync=False, recent_bytes=recent)
    most = 0
    for idx in range(1, 61):
        j.add(big_command(idx), idx, 1)
        assert j[0] == (big_command(1), 1, 1)       # pysyncobj reads the first entry often
        most = max(most, j.held_command_bytes())
    largest = len(big_command(60))
    assert most <= recent + largest
    assert j.stats()["held_command_bytes"] == j.held_command_bytes() <= recent + largest
    expected = [(big_command(i), i, 1) for i in range(1, 61)]
    assert contents(j) == expected and j[:] == expected and j[-3:] == expected[-3:]
    assert [j.command(i) for i in (1, 2, 30, 60)] == [big_command(i) for i in (1, 2, 30, 60)]
    assert j.held_command_bytes() <= recent + largest      # reading them back held none of them
    j._destroy()
    reopened = DurableJournal(tmp_path, fsync=False, recent_bytes=recent)
    assert reopened.held_command_bytes() == 0
    assert contents(reopened) == expected


def test_entries_reads_only_what_pysyncobj_asks_for(tmp_path):
    j = DurableJournal(tmp_path, fsync=False, recent_bytes=0)
    for idx in range(1, 21):
        j.add(big_command(idx, 1000), idx, 1)
    size = len(big_command(1, 1000))
    assert [e[1] for e in j.entries(5)] == list(range(5, 21))
    assert [e[1] for e in j.entries(5, 3)] == [5, 6, 7]
    # as pysyncobj cuts them: up to and with the entry that reaches max_bytes
    assert [e[1] for e in j.entries(5, None, 2 * size)] == [5, 6]
    assert [e[1] for e in j.entries(5, None, 2 * size + 1)] == [5, 6, 7]
    assert j.entries(21) == [] and j.entries(1, 1) == [j[0]]
    j.deleteEntriesTo(4)
    assert j.entries(3) == [] and j.entries(5, 1) == [(big_command(5, 1000), 5, 1)]
    assert [j.index_and_term(p) for p in (0, -1)] == [(5, 1), (20, 1)]


def test_a_truncated_then_rewritten_entry_reads_back_as_rewritten(tmp_path):
    j = DurableJournal(tmp_path, fsync=False, segment_bytes=30_000, recent_bytes=5_000)
    for idx in range(1, 21):
        j.add(big_command(idx, 4000), idx, 1)
    j.deleteEntriesFrom(9)                      # positions: entries 10.. go
    for idx in range(10, 16):
        j.add(b"term 2 #%d" % idx, idx, 2)
    assert [j[p] for p in range(8, 15)] == [(big_command(9, 4000), 9, 1)] + [
        (b"term 2 #%d" % i, i, 2) for i in range(10, 16)]
    assert [j.command(i) for i in (1, 9, 10, 15)] == [big_command(1, 4000), big_command(9, 4000),
                                                      b"term 2 #10", b"term 2 #15"]
    j.deleteEntriesFrom(0)
    assert len(j) == 0 and j.held_command_bytes() == 0 and j.command(1) is None
    j.add(b"again" * 1000, 1, 3)
    j.add(b"after", 2, 3)                       # the first entry's command leaves the recent ones
    assert j[0] == (b"again" * 1000, 1, 3) and j.command(1) == b"again" * 1000


def test_a_damaged_record_read_back_is_refused_not_returned(tmp_path):
    j = DurableJournal(tmp_path, fsync=False, recent_bytes=0)
    for idx in range(1, 4):
        j.add(big_command(idx, 1000), idx, 1)
    (segment,) = segments(tmp_path)
    with open(segment, "r+b") as f:
        f.seek(j._offsets[1] + 100)
        f.write(b"\xff")
    with pytest.raises(DamagedFile):
        j.command(2)


def overwrite(journal, index, data, at=0):
    """Write `data` over the record of entry `index`, `at` bytes into it, in place (what a disk
    that rots, or misdirects a write, leaves)."""
    place = journal._place(index)
    with open(journal._dir / f"seg-{place.seq:012d}.log", "r+b") as f:
        f.seek(place.offset + at)
        f.write(data)


def record_bytes(journal, index):
    place = journal._place(index)
    with open(journal._dir / f"seg-{place.seq:012d}.log", "rb") as f:
        f.seek(place.offset)
        return f.read(place.length)


@pytest.mark.parametrize("damage", ["a flipped byte", "a stale record of another term", "another entry's record"])
@pytest.mark.parametrize("kept", [False, True], ids=["log", "kept"])
def test_every_record_read_back_is_checked_and_an_intact_copy_repairs_it_in_place(tmp_path, damage, kept):
    """A read of a log or kept entry checks its record's checksum and its identity, the index and
    term the journal holds for it (issue 47): damage is raised naming the entry, told to
    on_damage, never returned; the intact copy written back in place reads back as it was."""
    j = DurableJournal(tmp_path, fsync=False, recent_bytes=0)
    for idx in range(1, 7):
        j.add(big_command(idx, 1000), idx, 1 if idx < 3 else 2)
    if kept:
        j.retain([3])
        j.deleteEntriesTo(4)            # entries 1-4 leave the log; 3 is kept, with its term
        assert j._first == 5 and j.term_of(3) == 2
    intact = record_bytes(j, 3)
    if damage == "a flipped byte":
        overwrite(j, 3, bytes([intact[100] ^ 0x01]), at=100)
    elif damage == "a stale record of another term":
        overwrite(j, 3, encode_record(big_command(3, 1000), 3, 1))
    else:
        overwrite(j, 3, encode_record(big_command(9, 1000), 9, 2))
    told = []
    j.on_damage = lambda damage, serving: told.append((damage, serving))
    with pytest.raises(DamagedRecord) as raised:
        j.command(3)
    assert raised.value.index == 3 and raised.value.term == 2 and told == [(raised.value, True)]
    with pytest.raises(DamagedRecord):
        j.check(3)
    assert len(told) == 1                         # the scrubber's check reports nothing itself
    if not kept:
        assert [e[1] for e in j.entries(1)] == [1, 2]      # what precedes it goes out (to a follower)
    assert not j.repair(3, 1, big_command(3, 1000))              # another term: not this entry
    assert not j.repair(3, 2, big_command(3, 999))               # would not fill its place
    assert j.repair(3, 2, big_command(3, 1000))
    assert record_bytes(j, 3) == intact and j.command(3) == big_command(3, 1000)
    j._destroy()
    reopened = DurableJournal(tmp_path, fsync=False)
    assert reopened.command(3) == big_command(3, 1000)


def test_a_kept_rec_from_before_terms_were_kept_reads_its_entries_checked_by_index(tmp_path):
    j = DurableJournal(tmp_path, fsync=False)
    fill(j, 1, 6, term=3)
    j.retain([2])
    j.deleteEntriesTo(4)
    j._destroy()
    sizes, *columns = records.read_file(tmp_path / "kept.rec", KEPT_MAGIC)
    records.replace_file(tmp_path / "kept.rec", KEPT_MAGIC, [sizes, *columns[:4]])
    j = DurableJournal(tmp_path, fsync=False)
    assert j.term_of(2) is None and j.command(2) == command_of(2)
    overwrite(j, 2, encode_record(command_of(5), 5, 3))
    with pytest.raises(DamagedRecord):
        j.command(2)
    assert not j.repair(2, None, command_of(2))          # no term to write it with
    assert j.repair(2, 3, command_of(2)) and j.command(2) == command_of(2)


def test_meta_survives_reopen(tmp_path):
    j = DurableJournal(tmp_path)
    fill(j, 1, 9)
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (0, None, 1)
    j.setCurrentTerm(7, "127.0.0.1:4001")
    j.setRaftCommitIndex(6)
    j.onOneSecondTimer()
    j.setRaftCommitIndex(8)            # not yet persisted: the commit index is written lazily
    reread = DurableJournal(tmp_path)
    assert (reread.getCurrentTerm(), reread.getVotedForNodeId(), reread.getRaftCommitIndex()) == (7, "127.0.0.1:4001", 6)
    reread._destroy()
    j._destroy()                       # a clean close persists the rest
    reread = DurableJournal(tmp_path)
    assert reread.getRaftCommitIndex() == 8
    assert reread.getCurrentTerm() == 7


def test_term_and_vote_are_on_disk_when_set_current_term_returns(tmp_path):
    j = DurableJournal(tmp_path)
    j.setCurrentTerm(3, "127.0.0.1:4002")
    crash(j)                           # no clean close, no one-second timer
    reread = DurableJournal(tmp_path)
    assert (reread.getCurrentTerm(), reread.getVotedForNodeId()) == (3, "127.0.0.1:4002")


@pytest.mark.parametrize("copy", ["meta.rec", "meta.copy.rec"])
def test_a_damaged_copy_of_meta_leaves_term_and_vote_to_the_other(tmp_path, copy):
    j = DurableJournal(tmp_path)
    fill(j, 1, 3)
    j.setCurrentTerm(5, "x")
    j._destroy()
    flip(tmp_path / copy, 30)
    j = DurableJournal(tmp_path)
    assert (j.getCurrentTerm(), j.getVotedForNodeId()) == (5, "x")
    j.setCurrentTerm(6, None)                      # both copies are whole again
    j._destroy()
    assert all(records.read_file(tmp_path / name, b"RAFTQJM1") for name in ("meta.rec", "meta.copy.rec"))


def test_meta_damaged_in_both_copies_refuses_to_open_with_what_to_do(tmp_path):
    j = DurableJournal(tmp_path)
    j.setCurrentTerm(5, "x")
    j._destroy()
    for copy in ("meta.rec", "meta.copy.rec"):
        flip(tmp_path / copy, 30)
    with pytest.raises(DamagedFile, match=r"meta\.rec is damaged.*meta\.copy\.rec is damaged.*could vote twice.*"
                                          r"raftq cluster remove"):
        DurableJournal(tmp_path)


def test_a_journal_with_entries_whose_meta_is_gone_refuses_to_open(tmp_path):
    j = DurableJournal(tmp_path)
    fill(j, 1, 3)
    j.setCurrentTerm(5, "x")
    j._destroy()
    for copy in ("meta.rec", "meta.copy.rec"):
        (tmp_path / copy).unlink()
    with pytest.raises(DamagedFile, match="meta.rec is missing"):
        DurableJournal(tmp_path)


@pytest.mark.parametrize("crash", ["while the first copy is written", "between the copies",
                                   "while the second copy is written"])
def test_a_crash_while_meta_is_written_leaves_the_term_acted_on_or_the_one_about_to_be(tmp_path, crash):
    j = DurableJournal(tmp_path)
    j.setCurrentTerm(5, "x")
    before = {name: (tmp_path / name).read_bytes() for name in ("meta.rec", "meta.copy.rec")}
    j.setCurrentTerm(6, "y")
    j._destroy()
    after = {name: (tmp_path / name).read_bytes() for name in ("meta.rec", "meta.copy.rec")}
    first, second = {
        "while the first copy is written": (after["meta.rec"][:-5], before["meta.copy.rec"]),
        "between the copies": (after["meta.rec"], before["meta.copy.rec"]),
        "while the second copy is written": (after["meta.rec"], after["meta.copy.rec"][:-5]),
    }[crash]
    (tmp_path / "meta.rec").write_bytes(first)
    (tmp_path / "meta.copy.rec").write_bytes(second)
    j = DurableJournal(tmp_path)
    expected = (5, "x") if crash == "while the first copy is written" else (6, "y")
    assert (j.getCurrentTerm(), j.getVotedForNodeId()) == expected


def test_a_journal_of_the_older_meta_format_is_refused_not_reset_to_term_0(tmp_path):
    (tmp_path / "meta.json").write_text('{"body": {"term": 9, "voted_for": "x"}, "crc": 0}')
    with pytest.raises(DamagedFile, match="older raftq"):
        DurableJournal(tmp_path)

def test_the_snapshot_is_fsynced_before_the_entries_it_replaces_are_dropped(tmp_path, monkeypatch):
    snapshot = tmp_path / "snapshot.bin"
    j = DurableJournal(tmp_path / "journal", segment_bytes=300, snapshot_path=snapshot)
    fill(j, 1, 40)
    snapshot.write_bytes(b"state up to entry 30")   # as pysyncobj leaves it: written, renamed, not synced
    events = []
    real_fsync, real_replace, real_unlink = os.fsync, os.replace, os.unlink

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    def unlink(path):
        events.append(("unlink", str(path)))
        real_unlink(path)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "unlink", unlink)
    j.deleteEntriesTo(30)
    monkeypatch.undo()
    synced = events.index(("fsync", str(snapshot)))
    moved = events.index(("fsync", str(tmp_path / "journal" / "meta.rec")))
    dropped = [i for i, e in enumerate(events) if e[0] == "unlink" and "/seg-" in e[1]]
    assert dropped and synced < moved < min(dropped)
    j._destroy()
    assert [e[1] for e in contents(DurableJournal(tmp_path / "journal"))] == list(range(31, 41))


def test_rewrites_flush_queued_acknowledgements_first(tmp_path):
    j = DurableJournal(tmp_path)
    fill(j, 1, 5)
    calls = []
    j.before_rewrite = lambda: calls.append(len(j))
    j.setCurrentTerm(2, None)
    j.deleteEntriesFrom(3)
    j.clear()
    assert calls == [5, 5, 3]


WRITER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    from raftq.engine.storage.journal import DurableJournal
    path, fsync, n_synced, n_unsynced = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
    marker = os.open(os.path.join(os.path.dirname(path), "marker"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    j = DurableJournal(path, fsync=fsync)
    for i in range(n_synced):
        j.add(b"entry-%d" % i, i + 1, 1)
        os.write(marker, b"A")         # add() has returned
    j.flush()
    # what the consensus module does between a round of appends and its sync
    with j.deferred():
        for i in range(n_synced, n_synced + n_unsynced):
            j.add(b"entry-%d" % i, i + 1, 1)
        print("ready", flush=True)
        sys.stdin.read()
""")


def spawn_writer(tmp_path, *, fsync, n_synced, n_unsynced, prefix=(), env=None):
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=str(ROOT)))
    jdir = tmp_path / "journal"
    proc = subprocess.Popen([*prefix, sys.executable, str(script), str(jdir), "1" if fsync else "0",
                             str(n_synced), str(n_unsynced)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    return proc, jdir


def kill9(proc):
    try:
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)


@pytest.mark.parametrize("fsync", [False, True])
def test_a_power_cut_loses_exactly_what_was_not_synced(tmp_path, fsync):
    """The production write path (pwrite into the preallocated segment, then
    fdatasync), killed -9 and then cut back to what its syncs covered
    (chaos/sync_ledger.py): exactly the synced entries come back."""
    ledger = tmp_path / "ledger"
    proc, jdir = spawn_writer(tmp_path, fsync=fsync, n_synced=20, n_unsynced=15,
                              env=node_site_env({"RAFTQ_SYNC_LEDGER": str(ledger)}))
    try:
        assert proc.stdout.readline().strip() == "ready"
    finally:
        kill9(proc)
    # the written tail is in the file (the page cache) until the power goes
    assert [e[1] for e in contents(DurableJournal(jdir, fsync=False))] == list(range(1, 36))
    dropped = sync_ledger.cut(jdir, ledger, baseline={})
    # the first append after the sync begins with the sync mark that names it
    assert list(dropped.values()) == [SYNC_MARK_BYTES + sum(len(encode_record(b"entry-%d" % i, i + 1, 1))
                                                            for i in range(20, 35))]
    assert [e[1] for e in contents(DurableJournal(jdir))] == list(range(1, 21))


def test_every_add_is_fdatasynced_before_it_returns(tmp_path):
    require_strace()
    trace = tmp_path / "trace"
    n = 25
    proc, jdir = spawn_writer(tmp_path, fsync=True, n_synced=n, n_unsynced=0,
                              prefix=("strace", "-f", "-y", "-o", str(trace),
                                      "-e", "trace=write,pwrite64,fsync,fdatasync"))
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            kill9(proc)
    events = []
    for line in trace.read_text().splitlines():
        m = re.search(r"\b(write|pwrite64|fdatasync|fsync)\(\d+<([^>]*)>", line)
        if m is None:
            continue
        call, path = m.groups()
        if path.endswith("/marker"):
            events.append("returned")
        elif re.search(r"/seg-\d+\.log$", path):
            events.append("sync" if call in ("fsync", "fdatasync") else "write")
    # Between two returns of add(): the record's write, then a sync, and no
    # write left unsynced (the first round also creates the segment file).
    rounds = "".join({"write": "w", "sync": "s", "returned": "|"}[e] for e in events).split("|")[:n]
    assert len(rounds) == n
    assert all(re.fullmatch(r"(ws)+", r) for r in rounds), rounds
    assert sum(r.count("s") for r in rounds[1:]) == n - 1


# -- entries kept for the snapshot -------------------------------------------------------

def command_of(idx, size=20):
    return bytes([idx % 251]) * size + b"#%d" % idx


def segment_of(journal, index):
    kept = journal._kept
    return kept.seqs[kept.find(index)]


def test_compaction_keeps_the_segments_of_the_entries_the_snapshot_names(tmp_path):
    j = DurableJournal(tmp_path, segment_bytes=300)
    fill(j, 1, 60)
    j.retain([3, 17, 40, 55])            # 55 stays in the log itself
    j.deleteEntriesTo(45)
    assert [e[1] for e in contents(j)] == list(range(46, 61))     # the log's RAM holds the rest only
    assert {i: j.command(i) for i in (3, 17, 40, 55)} == {i: command_of(i) for i in (3, 17, 40, 55)}
    assert j.command(4) is None and j.command(44) is None
    assert j.holds(17) and not j.holds(18)
    kept_segments = {segment_of(j, i) for i in (3, 17, 40)}
    start_seq = j._log_start()[0]
    on_disk = {int(p.name[4:16]) for p in segments(tmp_path)}
    assert {s for s in on_disk if s < start_seq} <= kept_segments
    assert j.stats()["kept_entries"] == 3
    j._destroy()
    reopened = DurableJournal(tmp_path, segment_bytes=300)
    assert {i: reopened.command(i) for i in (3, 17, 40)} == {i: command_of(i) for i in (3, 17, 40)}
    assert [e[1] for e in contents(reopened)] == list(range(46, 61))


@pytest.mark.parametrize("seed", range(6))
def test_after_every_compaction_no_named_entry_lies_in_a_deleted_segment(tmp_path, seed):
    """Rounds of appends, a snapshot naming a random part of what the journal holds, compaction
    (and now and then a clear or a reopen): every entry the last snapshot named reads back."""
    rng = random.Random(seed)
    j = DurableJournal(tmp_path, segment_bytes=rng.choice([200, 400, 1000]))
    nxt, named = 1, []
    for round in range(12):
        count = rng.randint(1, 40)
        fill(j, nxt, count)
        nxt += count
        held = [i for i in range(1, nxt) if j.holds(i)]
        named = sorted(rng.sample(held, rng.randint(0, min(len(held), 15))))
        j.retain(named)
        if rng.random() < 0.15:
            j.clear()
            fill(j, nxt, 2)
            nxt += 2
        else:
            j.deleteEntriesTo(rng.randint(0, len(j)))
        assert {i: j.command(i) for i in named} == {i: command_of(i) for i in named}, round
        if rng.random() < 0.3:
            j._destroy()
            j = DurableJournal(tmp_path, segment_bytes=1000)
            j.retain(named)
            assert {i: j.command(i) for i in named} == {i: command_of(i) for i in named}, round
        first_live_seq = j._log_start()[0]
        below = {int(p.name[4:16]) for p in segments(tmp_path)} - {s for s in j._segment_sizes if s >= first_live_seq}
        assert below == {s for s in set(j._kept.seqs) if s < first_live_seq}, round
    assert not list(tmp_path.glob("*.rewrite"))
    j._destroy()


def mostly_dead(tmp_path):
    """A journal whose first segments hold one named entry each among 10 others."""
    j = DurableJournal(tmp_path, segment_bytes=400)
    fill(j, 1, 60)
    j.retain([2, 14])
    return j


def test_a_mostly_dead_kept_segment_is_rewritten_with_its_named_entries_only(tmp_path):
    j = mostly_dead(tmp_path)
    paths = [tmp_path / f"seg-{j._seqs[index - 1]:012d}.log" for index in (2, 14)]
    assert paths[0] != paths[1]
    before = {path: path.stat() for path in paths}

    def rewritten():
        return [path for path in paths if path.stat().st_ino != before[path].st_ino]

    j.deleteEntriesTo(50)
    assert len(rewritten()) == 1           # one rewrite per compaction: the other at the next one
    [path] = rewritten()
    assert path.stat().st_size < before[path].st_size / 2
    assert (j.command(2), j.command(14)) == (command_of(2), command_of(14))
    fill(j, 61, 5)
    j.deleteEntriesTo(len(j) - 1)
    assert rewritten() == paths
    assert (j.command(2), j.command(14)) == (command_of(2), command_of(14))
    j._destroy()
    reopened = DurableJournal(tmp_path, segment_bytes=400)
    assert (reopened.command(2), reopened.command(14)) == (command_of(2), command_of(14))


class Crash(Exception):
    pass


def crash_at(monkeypatch, tmp_path, step):
    """Make the segment rewrite stop at `step`, as a kill -9 there would."""
    import raftq.engine.storage.journal as journal_module
    real_fsync, real_replace, real_fsync_dir, real_replace_file = (
        os.fsync, os.replace, journal_module.fsync_dir, journal_module.records.replace_file)
    rewriting = []

    def fsync(fd):
        if step == "before the temp file is synced" and os.readlink(f"/proc/self/fd/{fd}").endswith(".rewrite"):
            raise Crash(step)
        real_fsync(fd)

    def replace(src, dst):
        if str(src).endswith(".rewrite"):
            if step == "before the rename":
                raise Crash(step)
            rewriting.append(dst)
        real_replace(src, dst)

    def fsync_dir(path):
        if rewriting and step == "before the directory is synced":
            raise Crash(step)
        real_fsync_dir(path)

    def replace_file(path, *args, **kwargs):
        if rewriting and step == "before the new offsets are recorded":
            raise Crash(step)
        real_replace_file(path, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(journal_module, "fsync_dir", fsync_dir)
    monkeypatch.setattr(journal_module.records, "replace_file", replace_file)


@pytest.mark.parametrize("step", ["before the temp file is synced", "before the rename",
                                  "before the directory is synced", "before the new offsets are recorded"])
def test_a_rewrite_stopped_at_any_step_loses_nothing(tmp_path, monkeypatch, step):
    j = mostly_dead(tmp_path)
    crash_at(monkeypatch, tmp_path, step)
    with pytest.raises(Crash):
        j.deleteEntriesTo(50)
    monkeypatch.undo()
    reopened = DurableJournal(tmp_path, segment_bytes=400)
    reopened.retain([2, 14])
    assert (reopened.command(2), reopened.command(14)) == (command_of(2), command_of(14))
    assert [e[1] for e in contents(reopened)] == list(range(51, 61))
    assert not list(tmp_path.glob("*.rewrite"))
    # and the next compaction goes on from there
    fill(reopened, 61, 5)
    reopened.deleteEntriesTo(len(reopened) - 1)
    assert (reopened.command(2), reopened.command(14)) == (command_of(2), command_of(14))


def test_a_rewritten_segment_is_synced_before_it_replaces_the_old_one(tmp_path, monkeypatch):
    j = mostly_dead(tmp_path)
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    j.deleteEntriesTo(50)
    monkeypatch.undo()
    rewrites = [e[1] for e in events if e[0] == "replace" and e[1].endswith(".rewrite")]
    assert rewrites
    for temporary in rewrites:
        renamed = events.index(("replace", temporary))
        assert ("fsync", temporary) in events[:renamed]
        assert ("fsync", str(tmp_path)) in events[renamed:]


OLD_RELEASE_FOLLOWER = """
import sys
from engine.storage.journal import DurableJournal
j = DurableJournal(sys.argv[1])
for idx in range(1, 6):
    j.add(b"entry %d" % idx, idx, 3)       # a follower's appends: it never voted, so no meta
j._destroy()
"""


def test_a_journal_of_the_release_before_sync_marks_that_never_voted_opens_from_term_0(tmp_path):
    """7c4791e wrote meta.rec at a node's first vote or term change only: a follower of a group that
    never voted has entries and no meta. It opens (as that release did, from term 0, no vote) with
    its entries whole; meta gone from a journal of this release is still refused (above)."""
    from tests.test_operations import exported
    tree = exported("7c4791e", tmp_path / "tree")
    journal_dir = tmp_path / "journal"
    subprocess.run([sys.executable, "-c", OLD_RELEASE_FOLLOWER, str(journal_dir)], env={"PYTHONPATH": str(tree)},
                   cwd=tree, check=True, capture_output=True, timeout=120)
    assert not (journal_dir / "meta.rec").exists()
    j = DurableJournal(journal_dir)
    assert (j.getCurrentTerm(), j.getVotedForNodeId()) == (0, None)
    assert [j[i][0] for i in range(len(j))] == [b"entry %d" % idx for idx in range(1, 6)]
    j._destroy()
    assert (journal_dir / "meta.rec").exists() and (journal_dir / "meta.copy.rec").exists()

"""The chaos campaign's disk means (chaos/disks.py) on real record files: bit rot lands in place in
live records a sync covered, each one a read then finds damaged, and a small filesystem fills up
and grows back. No node processes."""

import errno
import os
import random
from pathlib import Path

import pytest

from chaos.disks import SmallDisks, rot
from raftq.engine.storage import snapshot_file
from raftq.engine.storage.damage import DamagedRecord
from raftq.engine.storage.journal import DurableJournal
from tests.tools import in_ci

ENTRIES = 60


def journal_of(data_dir: Path) -> DurableJournal:
    """A running node's journal: entries whose text holds words over several segments, the first
    20 compacted away but for the kept entries 5 and 12, nothing held in memory but the last."""
    journal = DurableJournal(data_dir / "raft" / "journal", segment_bytes=1500, recent_bytes=1)
    for index in range(1, ENTRIES + 1):
        journal.add(b"\xa3put body message%04d lorem" % index, index, 1)
    journal.retain([5, 12])
    journal.deleteEntriesTo(20)
    return journal


def sizes(data_dir: Path) -> dict:
    return {p: p.stat().st_size for p in data_dir.rglob("*") if p.is_file()}


def test_rot_flips_bytes_in_place_in_live_records_a_sync_covered_and_each_read_finds_it(tmp_path):
    journal = journal_of(tmp_path)
    try:
        before = sizes(tmp_path)
        flips = rot(tmp_path, random.Random(3), 30, snapshot=False)
        assert len(flips) == 30 and sizes(tmp_path) == before               # in place, the same length
        assert {flip.what for flip in flips} == {"word", "bit"}
        flipped = {flip.index for flip in flips}
        # live: the log from index 21 on and the kept entries, never what compaction dropped; and
        # never the last entry, after the last sync mark: a torn write's place, which start-up cuts
        assert flipped <= {5, 12} | set(range(21, ENTRIES)), flipped
        for flip in flips:
            assert flip.still_there()
            with pytest.raises(DamagedRecord) as damage:
                journal.command(flip.index)
            assert damage.value.index == flip.index
        for flip in flips:                                                   # a repair writes the byte back
            fd = os.open(flip.path, os.O_WRONLY)
            os.pwrite(fd, bytes([flip.was]), flip.offset)
            os.close(fd)
            assert not flip.still_there()
        assert [journal.command(i) for i in (5, 12, 21)] == [b"\xa3put body message%04d lorem" % i for i in (5, 12, 21)]
    finally:
        journal._destroy()


def test_rot_of_a_snapshot_damages_one_of_its_records(tmp_path):
    path = tmp_path / "raft" / "snapshot.bin"
    path.parent.mkdir(parents=True)
    carried = {3: b"\xa3carried entry three", 4: b"\xa3carried entry four"}
    snapshot_file.write(path, last=[b"", 9, 1], prev=[b"", 8, 1], cluster=[], state=b"the state machine's words",
                        carried=[3, 4], entry_at=carried.get)
    snapshot_file.check(path)
    [flip] = rot(tmp_path, random.Random(5), 1, snapshot=True)
    assert flip.path == str(path) and flip.index is None
    with pytest.raises(ValueError):
        snapshot_file.check(path)


def test_a_small_disk_fills_up_grows_back_and_keeps_its_files_when_unmounted(tmp_path):
    disks = SmallDisks(tmp_path, ["n1"], raft_groups=1)
    why_not = disks.mount()
    if why_not:
        if in_ci():
            pytest.fail(why_not, pytrace=False)
        pytest.skip(why_not)
    try:
        (tmp_path / "n1" / "kept").write_bytes(b"x" * 100_000)
        free = disks.fill(64 * 1024)["n1"]
        assert 0 < free <= 64 * 1024 + 4096
        with pytest.raises(OSError) as full:
            (tmp_path / "n1" / "more").write_bytes(b"y" * 1_000_000)
        assert full.value.errno == errno.ENOSPC
        disks.grow()
        (tmp_path / "n1" / "more").write_bytes(b"y" * 1_000_000)
    finally:
        assert disks.unmount() == []
    assert not os.path.ismount(tmp_path / "n1")
    assert (tmp_path / "n1" / "kept").read_bytes() == b"x" * 100_000

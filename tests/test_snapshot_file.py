"""engine.storage.snapshot_file: the state, then the live log entries its body references name."""

import os

import cbor2
import pytest

from raftq.engine.storage import records, snapshot_file

ENTRIES = {3: b"entry three", 7: b"", 12: b"entry twelve" * 5_000}


def written(path):
    return snapshot_file.write(path, last=[b"c", 20, 2], prev=[b"b", 19, 2], cluster=[["a:1", "n1"]],
                               state=b"the state", carried=sorted(ENTRIES), entry_at=ENTRIES.__getitem__)


def test_the_live_entries_read_back_by_index_and_only_they(tmp_path):
    path = tmp_path / "snapshot.bin"
    assert written(path) == path.stat().st_size
    header, state, entries = snapshot_file.read(path)
    assert (header["entries"], state) == (sorted(ENTRIES), b"the state")
    assert {index: entries.get(index) for index in range(15)} == {index: ENTRIES.get(index) for index in range(15)}
    entries.close()


def test_a_replaced_file_stays_readable_through_its_entries_until_they_are_closed(tmp_path):
    path = tmp_path / "snapshot.bin"
    written(path)
    entries = snapshot_file.LiveEntries(path)
    os.unlink(path)
    assert entries.get(12) == ENTRIES[12]
    entries.close()


@pytest.mark.parametrize("cut", [1, len(b"entry twelve" * 5_000) + 8])
def test_a_file_missing_the_end_of_its_live_entries_is_damaged(tmp_path, cut):
    path = tmp_path / "snapshot.bin"
    size = written(path)
    os.truncate(path, size - cut)
    with pytest.raises(ValueError, match="damaged snapshot"):
        snapshot_file.check(path)
    with pytest.raises(ValueError, match="damaged snapshot"):
        snapshot_file.read(path)


def test_a_snapshot_names_the_entries_the_journal_keeps_and_ships_them_carried(tmp_path):
    path, shipped = tmp_path / "snapshot.bin", tmp_path / "shipped.bin"
    in_journal = {5: b"kept in the journal", 9: b"another" * 1_000}
    snapshot_file.write(path, last=[b"c", 20, 2], prev=[b"b", 19, 2], cluster=[["a:1", "n1"]], state=b"the state",
                        carried=[3, 7, 12], entry_at=ENTRIES.__getitem__, in_journal=sorted(in_journal))
    header, _, entries = snapshot_file.read(path)
    assert (header["entries"], entries.in_journal) == ([3, 7, 12], [5, 9])
    assert entries.get(5) is None and entries.get(12) == ENTRIES[12]
    entries.close()
    with pytest.raises(ValueError, match="does not carry"):
        snapshot_file.check(path, self_contained=True)

    shipment = snapshot_file.Shipment(path, in_journal.__getitem__)
    with open(shipped, "wb") as out:
        while chunk := shipment.read(1000):
            out.write(chunk)
    snapshot_file.check(shipped, self_contained=True)
    header, state, entries = snapshot_file.read(shipped)
    assert (header["entries"], entries.in_journal, state) == ([3, 5, 7, 9, 12], [], b"the state")
    assert {index: entries.get(index) for index in range(15)} == \
        {index: {**ENTRIES, **in_journal}.get(index) for index in range(15)}
    entries.close()


def test_a_snapshot_of_the_previous_format_is_still_read(tmp_path):
    path = tmp_path / "snapshot.bin"
    header = cbor2.dumps({"last": [b"c", 20, 2], "prev": [b"b", 19, 2], "cluster": [], "entries": [3]})
    records.write_file(path, b"RAFTQSN2", [header, b"the state", ENTRIES[3]])
    snapshot_file.check_format(path)
    header, state, entries = snapshot_file.read(path)
    assert (state, entries.get(3), entries.in_journal) == (b"the state", ENTRIES[3], [])
    assert snapshot_file.last_entry(path) == (20, 2)
    entries.close()

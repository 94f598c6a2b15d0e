"""engine.storage.snapshot_file: the state, then the live log entries its body references name."""

import os

import pytest

from engine.storage import snapshot_file

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

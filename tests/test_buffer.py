"""The local put buffer: durable FIFO, torn tails cut, restart-safe."""

from raftq.engine.storage.put_buffer import BufferFull, PutBuffer
from raftq.engine.storage.records import FILE_HEADER


def test_fifo_survives_reopen_and_advances(tmp_path):
    buf = PutBuffer(tmp_path)
    buf.append("a", [{"body": 1, "id": "x"}])
    buf.append("b", [{"body": b"\x00", "id": "y"}])
    buf.close()
    buf = PutBuffer(tmp_path)
    pos, queue, messages = buf.oldest()
    assert (queue, messages) == ("a", [{"body": 1, "id": "x"}])
    buf.forwarded(pos)
    buf.close()
    buf = PutBuffer(tmp_path)
    pos, queue, messages = buf.oldest()
    assert (queue, messages) == ("b", [{"body": b"\x00", "id": "y"}])
    buf.forwarded(pos)
    assert buf.oldest() is None and buf.pending_bytes == 0
    assert (tmp_path / "buffer.log").stat().st_size == FILE_HEADER.size


def test_torn_tail_is_cut(tmp_path):
    buf = PutBuffer(tmp_path)
    buf.append("a", [{"body": "kept", "id": "1"}])
    buf.append("a", [{"body": "torn", "id": "2"}])
    buf.close()
    log = tmp_path / "buffer.log"
    log.write_bytes(log.read_bytes()[:-3])
    buf = PutBuffer(tmp_path)
    pos, _, messages = buf.oldest()
    assert messages == [{"body": "kept", "id": "1"}]
    buf.forwarded(pos)
    assert buf.oldest() is None


def test_full_buffer_refuses(tmp_path):
    buf = PutBuffer(tmp_path, max_bytes=200)
    buf.append("a", [{"body": "x" * 50, "id": "1"}])
    try:
        buf.append("a", [{"body": "x" * 200, "id": "2"}])
    except BufferFull:
        pass
    else:
        raise AssertionError("a full buffer took more")
    assert buf.oldest()[2] == [{"body": "x" * 50, "id": "1"}]

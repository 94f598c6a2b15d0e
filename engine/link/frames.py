"""The link between a node's engine process and its front processes.

One connected Unix socket pair per front, made by the engine process before
it forks the front, so nothing else can reach it (no path, no port).  Each
direction carries frames: a 4-byte big-endian length, then one CBOR array of
messages.  A side queues what it has to say during one turn of its event
loop and writes it as a single frame at the end of the turn, so a burst of
requests from many HTTP connections crosses as one write and one read.

Messages, each a CBOR array:
- front -> engine: ``[call_id, method, args]``; ``call_id`` 0 asks for no answer.
- engine -> front: ``[call_id, error, value]``, ``error`` None or a
  ``CommitError`` code; or ``[0, "view", view]``, pushed whenever the routing
  view (role, leader, term, quorum, members' HTTP addresses) changes.
"""

from __future__ import annotations

import asyncio
import struct

import cbor2

HEADER = struct.Struct(">I")
# A front's largest call is one command (a put of up to max_entry_bytes); the
# engine's largest answer is a read such as all_queue_stats. Beyond this a
# frame is a bug, and the link is closed rather than grown without bound.
MAX_FRAME_BYTES = 256 << 20


class LinkClosed(Exception):
    """The other process went away."""


class FrameWriter:
    """Queues messages and sends those of one loop turn as one frame."""

    def __init__(self, writer: asyncio.StreamWriter):
        self._writer = writer
        self._queued: list = []
        self._scheduled = False

    def send(self, message: list) -> None:
        self._queued.append(message)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if not self._queued or self._writer.is_closing():
            self._queued.clear()
            return
        payload = cbor2.dumps(self._queued)
        self._queued = []
        self._writer.write(HEADER.pack(len(payload)) + payload)

    def close(self) -> None:
        self._writer.close()


async def read_frame(reader: asyncio.StreamReader) -> list:
    """The next frame's messages; LinkClosed at the end of the stream."""
    try:
        header = await reader.readexactly(HEADER.size)
        (length,) = HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise LinkClosed(f"a frame of {length} bytes")
        return cbor2.loads(await reader.readexactly(length))
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise LinkClosed(str(exc)) from None

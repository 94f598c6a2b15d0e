"""The link between a front and its engine, as a front sees it (``engine.link.remote``).

The engine's side here is the link's own frames written by the test: it
answers each call as an engine refusing it would.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import weakref
from pathlib import Path

import pytest

from raftq.engine.link.frames import FrameWriter, read_frame
from raftq.engine.link.remote import RemoteNode
from raftq.engine.outcome import CommitError


class Command(dict):
    """A command a weak reference can follow (a plain dict cannot be referenced weakly)."""


async def refuse_every_call(sock: socket.socket, error: str) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    out = FrameWriter(writer)
    while True:
        for call_id, _method, _args in await read_frame(reader):
            out.send([call_id, error, None])


def test_a_refused_call_lets_go_of_its_command_without_the_cyclic_collector(tmp_path: Path):
    """A front held every refused put's batch of bodies (2.5 MB each) until the
    cyclic collector ran: the failed call's traceback and its future held each other."""

    async def scenario() -> weakref.ref:
        front_side, engine_side = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        engine = asyncio.create_task(refuse_every_call(engine_side, "not_leader"))
        node = RemoteNode("n1", auto_create=False, data_dir=tmp_path, node_pid=0)
        await node.connect(front_side)
        command = Command(op="put", queue="q", messages=[{"body": b"x" * 100_000}])
        held = weakref.ref(command)
        with pytest.raises(CommitError, match="not_leader"):
            await node.apply(command)
        del command
        await node.close()
        engine.cancel()
        return held

    gc.disable()
    try:
        held = asyncio.run(scenario())
        assert held() is None, "the refused command is still held: only a reference cycle keeps it"
    finally:
        gc.enable()

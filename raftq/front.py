"""A front process of a node: the HTTP API, the streaming wire, long polls,
metrics and the put buffer, over the engine's face (``engine.link.remote``).

A node runs one or more fronts (``raftq node --workers``), forked by the
node's supervisor (``raftq.server``) before any thread exists; each front
serves its own listening socket on the node's HTTP port (SO_REUSEPORT: the
kernel spreads connections over them) and holds one link to each of the
node's engines, one per Raft group (``ENGINES`` in ``api.keys``).  Their
CPU — parsing, JSON, rendering metrics, thousands of waiting connections —
is spent outside the interpreters that send Raft's heartbeats.  A front
lives only as long as the node: it exits when a link to an engine closes,
and the kernel kills it if the supervisor dies (PR_SET_PDEATHSIG), so a
killed node never leaves a port half served.
"""

import asyncio
import logging
import signal
import socket
import ssl
from pathlib import Path

from aiohttp import web

from api.app import Settings, make_app
from engine.lifetime import die_with, name_process
from engine.link.remote import RemoteNode
from engine.placement import Placement

log = logging.getLogger(__name__)

def cap_connections(server: web.Server, limit: int) -> None:
    """Close any connection beyond `limit` as soon as it is made (aiohttp has no such cap)."""
    track = server.connection_made
    refused = [0]

    def connection_made(handler, transport) -> None:
        track(handler, transport)
        if len(server.connections) > limit:
            if not refused[0]:
                log.warning("more than %d HTTP connections (--max-connections); closing the excess", limit)
            refused[0] += 1
            transport.close()
    server.connection_made = connection_made


def buffer_dir(data_dir: Path, worker: int) -> Path:
    """Each front keeps its own put buffer: appends never contend across processes."""
    return data_dir / ("buffer" if worker == 0 else f"buffer-{worker}")


async def serve_front(*, worker: int, listener: socket.socket, links: dict[int, socket.socket],
                      placement: Placement, node_id: str, data_dir: Path, settings: Settings,
                      tls: tuple[str, str] | None, auto_create: bool, node_pid: int) -> None:
    engines = {}
    for group, link in links.items():
        engines[group] = RemoteNode(node_id, auto_create=auto_create, data_dir=data_dir, node_pid=node_pid)
        await engines[group].connect(link)
    limits = settings.limits
    # aiohttp's keep-alive timer also runs from the moment a connection is
    # made, and closes it unless a request's headers are complete: the
    # header timeout, which is therefore the idle timeout as well.
    runner = web.AppRunner(make_app(engines, placement, settings, buffer_dir(data_dir, worker)), access_log=None,
                           handle_signals=False, keepalive_timeout=limits.header_timeout_s)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    try:
        await runner.setup()
        cap_connections(runner.server, limits.max_connections)
        ssl_context = None
        if tls:
            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(*tls)
        await web.SockSite(runner, listener, ssl_context=ssl_context).start()
        engine_gone = [asyncio.create_task(engine.closed.wait()) for engine in engines.values()]
        await asyncio.wait({*engine_gone, asyncio.create_task(stopping.wait())},
                           return_when=asyncio.FIRST_COMPLETED)
        if not stopping.is_set():
            log.error("front %d: an engine is gone; exiting", worker)
            return
        await runner.shutdown()           # stop accepting; in-flight requests finish or fail cleanly
    finally:
        await runner.cleanup()
        for engine in engines.values():
            await engine.close()


def run_front(**kwargs) -> int:
    """The body of a forked front process; its exit status."""
    # Ctrl-C reaches the whole process group; the supervisor decides how the node stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with(kwargs["node_pid"])
    name_process(f"raftq-front-{kwargs['worker']}")
    try:
        asyncio.run(serve_front(**kwargs))
    except Exception:
        log.exception("front %d failed", kwargs["worker"])
        return 1
    return 0

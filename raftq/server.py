"""`raftq node`: one node process — Raft replication plus the HTTP API.

SIGTERM and SIGINT shut it down cleanly: stop taking connections, hand
leadership over when leading, answer or fail what is in flight, flush the
journal, exit 0.
"""

import asyncio
import logging
import signal
import ssl
import sys
import time

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from api.app import Settings, make_app

from engine.config import ClusterConfig
from engine.node import Node

log = logging.getLogger("raftq.server")


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line, so logs can be shipped and queried as data."""

    def __init__(self, node_id: str):
        super().__init__()
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                 "node": self.node_id, "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


class MalformedRequestFilter(logging.Filter):
    """aiohttp answers a malformed request (bad header bytes, a broken request
    line) with 400 itself, then logs it as an error with a traceback: any
    client could fill the log that way. One line at debug level instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], HttpProcessingError):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.msg, record.args = "malformed request answered 400: %s", (record.exc_info[1],)
            record.exc_info = None
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


def setup_logging(node_id: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter(node_id))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.server").addFilter(MalformedRequestFilter())


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


async def serve(cluster: ClusterConfig, node_id: str, data_dir: str, *, settings: Settings,
                tls: tuple[str, str] | None = None, auto_create: bool = True) -> None:
    # Without a [cluster] secret the consensus module logs a loud security warning.
    node = Node(cluster, node_id, data_dir, auto_create=auto_create)
    await node.start()
    limits = settings.limits
    # aiohttp's keep-alive timer also runs from the moment a connection is
    # made, and closes it unless a request's headers are complete: the
    # header timeout, which is therefore the idle timeout as well.
    runner = web.AppRunner(make_app(node, settings), access_log=None, handle_signals=False,
                           keepalive_timeout=limits.header_timeout_s)
    try:
        await runner.setup()
        cap_connections(runner.server, limits.max_connections)
        host, _, port = node.spec.http.rpartition(":")
        ssl_context = None
        if tls:
            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(*tls)
        site = web.TCPSite(runner, host, int(port), ssl_context=ssl_context, reuse_address=True)
        await site.start()
        log.info("node %s serving HTTP on %s, Raft on %s", node_id, node.spec.http, node.spec.raft)

        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        await stopping.wait()

        started = time.monotonic()
        log.info("shutting down")
        await node.hand_over()            # clients are redirected to the next leader at once
        await runner.shutdown()           # stop accepting; in-flight requests finish or fail cleanly
    finally:
        # also when the HTTP port cannot be bound: a node nobody can reach
        # must not go on voting and leading
        await runner.cleanup()
        await node.close()                # journal flushed and closed
    log.info("stopped in %.2fs", time.monotonic() - started)

"""`raftq node`: one node — an engine process and its front processes.

The process started as `raftq node` binds the node's HTTP port, forks the
fronts (``raftq.front``) while it has no other thread yet, then becomes the
engine: pysyncobj's tick thread, the journal, the state machine and log
time, serving the fronts over socket pairs (``engine.link.service``).  Its PID is
the node's: stopping or killing it stops the node.

SIGTERM and SIGINT shut it down cleanly: hand leadership over when leading,
let the fronts stop taking connections and answer or fail what is in flight,
flush the journal, exit 0.  A front that dies on its own takes the node down
with it (exit 1), so that a supervisor restarts a whole node rather than
leaving part of its port unserved.
"""

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

import orjson
from aiohttp.http_exceptions import HttpProcessingError

from api.app import Settings
from engine.config import ClusterConfig
from engine.link.service import EngineService
from engine.node import Node
from engine.pauses import keep_pauses_short

from .front import run_front

log = logging.getLogger(__name__)

FRONT_STOP_S = 20.0


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line, so logs can be shipped and queried as data."""

    def __init__(self, node_id: str):
        super().__init__()
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                 "node": self.node_id, "pid": record.process, "logger": record.name, "msg": record.getMessage()}
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


def bind_http(address: str, count: int) -> list[socket.socket]:
    """`count` listening sockets on one address (SO_REUSEPORT); OSError if it is taken."""
    host, _, port = address.rpartition(":")
    listeners = []
    try:
        for _ in range(count):
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host.strip("[]"), int(port)))
            sock.listen(1024)
            sock.setblocking(False)
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    return listeners


def run_node(cluster: ClusterConfig, node_id: str, data_dir: str, *, settings: Settings,
             tls: tuple[str, str] | None = None, auto_create: bool = True, workers: int = 1) -> int:
    """Run the node until it is told to stop; its exit status."""
    data_dir = Path(data_dir)
    http = cluster.node(node_id).http
    listeners = bind_http(http, workers)
    engine_pid = os.getpid()
    links, fronts = [], []
    for worker, listener in enumerate(listeners):
        engine_end, front_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            engine_end.close()
            for other in [*listeners, *links]:
                if other is not listener:
                    other.close()
            os._exit(run_front(worker=worker, listener=listener, link=front_end, node_id=node_id,
                               data_dir=data_dir, settings=settings, tls=tls, auto_create=auto_create,
                               engine_pid=engine_pid))
        front_end.close()
        links.append(engine_end)
        fronts.append(pid)
    for listener in listeners:
        listener.close()
    keep_pauses_short()
    log.info("node %s: %d front(s) serving HTTP on %s", node_id, workers, http)
    return asyncio.run(_run_engine(cluster, node_id, data_dir, settings=settings, auto_create=auto_create,
                                   links=links, fronts=fronts))


async def _run_engine(cluster: ClusterConfig, node_id: str, data_dir: Path, *, settings: Settings,
                      auto_create: bool, links: list[socket.socket], fronts: list[int]) -> int:
    node = Node(cluster, node_id, data_dir, auto_create=auto_create)
    service = EngineService(node, max_long_polls=settings.limits.max_long_polls,
                            max_long_polls_per_client=settings.limits.max_long_polls_per_client)
    await node.start()
    service.start()
    log.info("node %s: Raft on %s", node_id, node.spec.raft)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    served = [asyncio.create_task(service.serve(link)) for link in links]
    status = 0
    started = None
    try:
        await asyncio.wait([*served, asyncio.create_task(stopping.wait())], return_when=asyncio.FIRST_COMPLETED)
        started = time.monotonic()
        if not stopping.is_set():
            log.error("a front process ended; stopping the node")
            status = 1
        log.info("shutting down")
        await node.hand_over()            # clients are redirected to the next leader at once
        await _stop_fronts(fronts)        # they stop accepting; in-flight requests finish or fail
    finally:
        service.stop()
        await node.close()                # journal flushed and closed
        for pid in fronts:
            _reap(pid, signal.SIGKILL)
    if started is not None:
        log.info("stopped in %.2fs", time.monotonic() - started)
    return status


async def _stop_fronts(fronts: list[int]) -> None:
    for pid in fronts:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + FRONT_STOP_S
    while time.monotonic() < deadline and any(_alive(pid) for pid in fronts):
        await asyncio.sleep(0.02)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == 0


def _reap(pid: int, sig: int) -> None:
    if _alive(pid):
        _signal(pid, sig)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

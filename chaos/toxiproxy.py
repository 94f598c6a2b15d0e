"""A Toxiproxy-compatible fault-injecting TCP proxy, for chaos runs on 127.0.0.0/8.

Why it exists: the chaos suite drives network faults through Toxiproxy's HTTP
API with toxiproxy-python, but the real Toxiproxy (a Go program) is not
installable here and the kernel has no netem. This module serves the part of
that API the client uses, with the same paths, JSON shapes, status codes and
toxic semantics, so the same chaos code runs against either server.

Theory of operation
- One asyncio process holds every proxy. A proxy listens on `listen` and, for
  each accepted client, dials `upstream`; the pair is a `Connection` with two
  `Link`s, "upstream" (client -> server bytes) and "downstream" (server ->
  client). Each link has a reader task that stamps chunks with the time they
  were read and queues them (bounded, so a slow toxic pushes back on the
  sender as a slow network would), and a writer task that pushes each chunk
  through the link's toxic stages (chaos/toxics.py) and writes what comes out.
- A toxic belongs to a proxy; every open connection of that proxy gets a stage
  for it at once and every later connection gets one when it opens. Whether a
  connection gets the toxic at all is decided per connection by `toxicity`,
  drawn from one `random.Random(seed)` per server, so runs are reproducible.
- End of stream travels as a chunk and becomes a half-close (FIN) on the far
  side; the connection is closed once both directions have ended. A read or
  write error on either side aborts both sides with an RST, so a peer's reset
  is passed on as a reset.
- Disabling a proxy closes its listener and every connection through it; new
  connections are refused until it is enabled again on the same address. This
  is how partitions are made.
- Only 127.0.0.0/8 is ever listened on or dialed: the API refuses anything else.

Running it
    python -m chaos.toxiproxy --host 127.0.0.1 --port 8474 [--seed N]
prints the API URL as its first line on stdout (useful with --port 0) and logs
to stderr. From Python, `ToxiproxyServer.start()` runs it as a child process
and `start_toxiproxy()` prefers a real Toxiproxy when one is available.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from chaos.toxics import STREAMS, Chunk, InvalidToxic, Stage, Toxic

# The Toxiproxy API generation this mirrors; the suffix tells the servers apart.
VERSION = "2.0.0-raftq"
READ_SIZE = 32 * 1024
QUEUED_CHUNKS = 32

log = logging.getLogger(__name__)


def loopback_address(address: str) -> tuple[str, int]:
    """(host, port) from "host:port", refusing anything outside 127.0.0.0/8."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{address!r} is not host:port")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(host) in ipaddress.ip_network("127.0.0.0/8")
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"{address!r}: only 127.0.0.0/8 addresses are allowed")
    return host, int(port)


class Link:
    """One direction of a connection: source -> toxic stages -> destination."""

    def __init__(self, conn: Connection, stream: str, source: asyncio.StreamReader,
                 dest: asyncio.StreamWriter):
        self.conn = conn
        self.stream = stream
        self.source = source
        self.dest = dest
        self.stages: dict[str, Stage] = {}  # insertion order is chain order
        self.queue: asyncio.Queue[Chunk] = asyncio.Queue(QUEUED_CHUNKS)
        self.tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._write())]

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await self.source.read(READ_SIZE)
                await self.queue.put(Chunk(data, loop.time()))
                if not data:
                    return
        except OSError:
            self.conn.reset()

    async def _write(self) -> None:
        try:
            while True:
                chunk = await self.queue.get()
                # A toxic added while this chunk is in flight applies from the next chunk.
                await self._through(tuple(self.stages.values()), 0, chunk)
                if not chunk.data:
                    return
        except OSError:
            self.conn.reset()

    async def _through(self, stages: tuple[Stage, ...], index: int, chunk: Chunk) -> None:
        while index < len(stages) and stages[index].stopped:
            index += 1
        if index < len(stages):
            await stages[index].process(chunk, lambda out: self._through(stages, index + 1, out))
        elif chunk.data:
            self.dest.write(chunk.data)
            await self.dest.drain()
        else:
            if self.dest.can_write_eof():
                self.dest.write_eof()
            self.conn.ended(self.stream)

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for stage in self.stages.values():
            stage.stop()


class Connection:
    """A client connection and its upstream connection, joined by two links."""

    def __init__(self, proxy: Proxy, client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter]):
        self.proxy = proxy
        self.writers = (client[1], upstream[1])
        self.links = {"upstream": Link(self, "upstream", client[0], upstream[1]),
                      "downstream": Link(self, "downstream", upstream[0], client[1])}
        self._ended: set[str] = set()
        self.closed = False

    def start(self, toxics: list[Toxic]) -> None:
        for toxic in toxics:
            self.attach(toxic)
        for link in self.links.values():
            link.start()

    def attach(self, toxic: Toxic) -> None:
        """Put `toxic` to work here, replacing a stage of the same name in place."""
        stages = self.links[toxic.stream].stages
        if toxic.name in stages:
            stages[toxic.name].stop()
        stage = toxic.stage(self, self.proxy.rng)
        if stage is not None:
            stages[toxic.name] = stage
        else:
            stages.pop(toxic.name, None)

    def detach(self, toxic: Toxic) -> None:
        stage = self.links[toxic.stream].stages.pop(toxic.name, None)
        if stage is not None:
            stage.remove()

    def ended(self, stream: str) -> None:
        self._ended.add(stream)
        if self._ended.issuperset(STREAMS):
            self.close()

    def close(self) -> None:
        """Orderly close of both sides, after the bytes already written."""
        self._finish(reset=False)

    def reset(self) -> None:
        """Close both sides with RST (SO_LINGER 0), discarding unsent bytes."""
        self._finish(reset=True)

    def _finish(self, reset: bool) -> None:
        if self.closed:
            return
        self.closed = True
        self.proxy.connections.discard(self)
        for link in self.links.values():
            link.stop()
        for writer in self.writers:
            if reset:
                sock = writer.get_extra_info("socket")
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass  # already closed by the peer's own reset
                writer.transport.abort()
            else:
                writer.close()


class Proxy:
    def __init__(self, name: str, listen: str, upstream: str, rng: random.Random):
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.rng = rng
        self.enabled = False
        self.toxics: dict[str, Toxic] = {}
        self.connections: set[Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._generation = 0  # bumped on stop, so a dial in progress knows it is stale

    async def start(self) -> None:
        host, port = loopback_address(self.listen)
        self._server = await asyncio.start_server(self._accept, host, port)
        self.listen = f"{host}:{self._server.sockets[0].getsockname()[1]}"
        self.enabled = True
        log.info("proxy %s listening on %s -> %s", self.name, self.listen, self.upstream)

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._generation += 1
        for conn in list(self.connections):
            conn.close()
        if self.enabled:
            log.info("proxy %s stopped", self.name)
        self.enabled = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        generation = self._generation
        try:
            upstream = await asyncio.open_connection(*loopback_address(self.upstream))
        except OSError as e:
            log.info("proxy %s: upstream %s unreachable: %s", self.name, self.upstream, e)
            writer.close()
            return
        if generation != self._generation:
            writer.close()
            upstream[1].close()
            return
        conn = Connection(self, (reader, writer), upstream)
        self.connections.add(conn)
        conn.start(list(self.toxics.values()))

    def set_toxic(self, toxic: Toxic) -> None:
        self.toxics[toxic.name] = toxic
        for conn in list(self.connections):
            conn.attach(toxic)

    def remove_toxic(self, name: str) -> None:
        toxic = self.toxics.pop(name)
        for conn in list(self.connections):
            conn.detach(toxic)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "listen": self.listen, "upstream": self.upstream,
                "enabled": self.enabled, "toxics": [t.to_json() for t in self.toxics.values()]}


# --- HTTP API -----------------------------------------------------------------

class ApiError(Exception):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message = message
        self.status = status


PROXY_NOT_FOUND = ("proxy not found", 404)
TOXIC_NOT_FOUND = ("toxic not found", 404)


@web.middleware
async def _api_errors(request: web.Request, handler):
    # Like Toxiproxy, refuse browsers: a web page must not be able to drive
    # faults through a localhost API.
    if request.headers.get("User-Agent", "").startswith("Mozilla/"):
        return web.Response(status=403, text="User agent not allowed\n")
    try:
        return await handler(request)
    except ApiError as e:
        return web.json_response({"error": e.message, "status": e.status}, status=e.status)
    except InvalidToxic as e:
        return web.json_response({"error": str(e), "status": 400}, status=400)


class Api:
    """Toxiproxy's HTTP API over a set of proxies."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.proxies: dict[str, Proxy] = {}
        # Handlers await while starting listeners; one change at a time keeps
        # the proxy table and the sockets in step.
        self.lock = asyncio.Lock()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_api_errors])
        app.add_routes([
            web.get("/version", self.version),
            web.post("/reset", self.reset),
            web.get("/proxies", self.list_proxies),
            web.post("/proxies", self.create_proxy),
            web.get("/proxies/{proxy}", self.show_proxy),
            web.post("/proxies/{proxy}", self.update_proxy),
            web.patch("/proxies/{proxy}", self.update_proxy),
            web.delete("/proxies/{proxy}", self.delete_proxy),
            web.get("/proxies/{proxy}/toxics", self.list_toxics),
            web.post("/proxies/{proxy}/toxics", self.create_toxic),
            web.get("/proxies/{proxy}/toxics/{toxic}", self.show_toxic),
            web.post("/proxies/{proxy}/toxics/{toxic}", self.update_toxic),
            web.patch("/proxies/{proxy}/toxics/{toxic}", self.update_toxic),
            web.delete("/proxies/{proxy}/toxics/{toxic}", self.delete_toxic),
        ])
        app.on_cleanup.append(self._stop_all)
        return app

    async def _stop_all(self, _app) -> None:
        for proxy in self.proxies.values():
            proxy.stop()

    def _proxy(self, request: web.Request) -> Proxy:
        proxy = self.proxies.get(request.match_info["proxy"])
        if proxy is None:
            raise ApiError(*PROXY_NOT_FOUND)
        return proxy

    def _toxic(self, request: web.Request) -> tuple[Proxy, Toxic]:
        proxy = self._proxy(request)
        toxic = proxy.toxics.get(request.match_info["toxic"])
        if toxic is None:
            raise ApiError(*TOXIC_NOT_FOUND)
        return proxy, toxic

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError as e:
            raise ApiError(f"bad request body: {e}", 400) from None
        if not isinstance(body, dict):
            raise ApiError("bad request body: expected a JSON object", 400)
        return body

    @staticmethod
    def _field(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
        value = body.get(key, default)
        if not isinstance(value, kind):
            raise ApiError(f"bad request body: {key} must be a {kind.__name__}", 400)
        if kind is str and key in ("listen", "upstream"):
            try:
                loopback_address(value)
            except ValueError as e:
                raise ApiError(f"bad request body: {e}", 400) from None
        return value

    @staticmethod
    async def _start(proxy: Proxy) -> None:
        try:
            await proxy.start()
        except OSError as e:
            raise ApiError(f"listen {proxy.listen}: {e.strerror or e}", 500) from None

    async def version(self, request):
        return web.json_response({"version": VERSION})

    async def reset(self, request):
        async with self.lock:
            for proxy in self.proxies.values():
                if not proxy.enabled:
                    await self._start(proxy)
                for name in list(proxy.toxics):
                    proxy.remove_toxic(name)
        return web.Response(status=204)

    async def list_proxies(self, request):
        return web.json_response({name: p.to_json() for name, p in self.proxies.items()})

    async def create_proxy(self, request):
        body = await self._body(request)
        for key in ("name", "upstream"):
            if not body.get(key):
                raise ApiError(f"missing required field: {key}", 400)
        name = self._field(body, "name", str, "")
        upstream = self._field(body, "upstream", str, "")
        listen = self._field(body, "listen", str, "127.0.0.1:0")
        enabled = self._field(body, "enabled", bool, True)
        async with self.lock:
            if name in self.proxies:
                raise ApiError("proxy already exists", 409)
            proxy = Proxy(name, listen, upstream, self.rng)
            if enabled:
                await self._start(proxy)
            self.proxies[name] = proxy
        return web.json_response(proxy.to_json(), status=201)

    async def show_proxy(self, request):
        return web.json_response(self._proxy(request).to_json())

    async def update_proxy(self, request):
        body = await self._body(request)
        async with self.lock:
            proxy = self._proxy(request)
            listen = self._field(body, "listen", str, proxy.listen)
            upstream = self._field(body, "upstream", str, proxy.upstream)
            enabled = self._field(body, "enabled", bool, proxy.enabled)
            if (listen, upstream) != (proxy.listen, proxy.upstream):
                proxy.stop()  # connections to the old address or upstream are dropped
                proxy.listen, proxy.upstream = listen, upstream
            if enabled and not proxy.enabled:
                await self._start(proxy)
            elif not enabled:
                proxy.stop()
        return web.json_response(proxy.to_json())

    async def delete_proxy(self, request):
        async with self.lock:
            proxy = self._proxy(request)
            proxy.stop()
            del self.proxies[proxy.name]
        return web.Response(status=204)

    async def list_toxics(self, request):
        return web.json_response([t.to_json() for t in self._proxy(request).toxics.values()])

    async def create_toxic(self, request):
        body = await self._body(request)
        async with self.lock:
            proxy = self._proxy(request)
            toxic = Toxic.from_json(body)
            if toxic.name in proxy.toxics:
                raise ApiError("toxic already exists", 409)
            proxy.set_toxic(toxic)
        log.info("proxy %s: toxic %s added", proxy.name, toxic.to_json())
        return web.json_response(toxic.to_json())

    async def show_toxic(self, request):
        return web.json_response(self._toxic(request)[1].to_json())

    async def update_toxic(self, request):
        body = await self._body(request)
        async with self.lock:
            proxy, toxic = self._toxic(request)
            toxic = toxic.updated(body)
            proxy.set_toxic(toxic)
        log.info("proxy %s: toxic %s updated", proxy.name, toxic.to_json())
        return web.json_response(toxic.to_json())

    async def delete_toxic(self, request):
        async with self.lock:
            proxy, toxic = self._toxic(request)
            proxy.remove_toxic(toxic.name)
        log.info("proxy %s: toxic %s removed", proxy.name, toxic.name)
        return web.Response(status=204)


async def serve(host: str, port: int, seed: int = 0, exit_with_stdin: bool = False) -> None:
    """Run the API on host:port until SIGTERM or SIGINT (or stdin EOF, if asked)."""
    loopback_address(f"{host}:{port}")
    runner = web.AppRunner(Api(seed).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"http://{host}:{bound}", flush=True)
    log.info("toxiproxy API on http://%s:%d (seed %d)", host, bound, seed)

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if exit_with_stdin:
        # The parent holds our stdin pipe open; EOF means it is gone, and a
        # proxy left behind would hold its ports into the next run.
        def on_stdin() -> None:
            if not os.read(0, 4096):
                loop.remove_reader(0)
                stop.set()
        loop.add_reader(0, on_stdin)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m chaos.toxiproxy", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="API address, in 127.0.0.0/8")
    parser.add_argument("--port", type=int, default=8474, help="API port; 0 picks a free one")
    parser.add_argument("--seed", type=int, default=0, help="seed for toxicity and jitter draws")
    parser.add_argument("--exit-with-stdin", action="store_true", help="exit when the stdin pipe reaches EOF")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s toxiproxy %(levelname)s %(message)s")
    try:
        loopback_address(f"{args.host}:{args.port}")
    except ValueError as e:
        parser.error(str(e))
    asyncio.run(serve(args.host, args.port, args.seed, args.exit_with_stdin))


# --- Running a server from Python ---------------------------------------------

def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ToxiproxyServer:
    """A Toxiproxy API at a 127.0.0.0/8 URL, with the child process serving it if we started one."""

    def __init__(self, url: str, process: subprocess.Popen | None = None):
        parts = urlsplit(url)
        self.host, self.port = loopback_address(parts.netloc)
        self.url = f"http://{self.host}:{self.port}"
        self.process = process

    @classmethod
    def start(cls, host: str = "127.0.0.1", port: int = 0, seed: int = 0,
              stderr: Any = None, timeout: float = 10.0) -> ToxiproxyServer:
        """Run this module's server as a child process; port 0 lets it pick a free port."""
        loopback_address(f"{host}:{port}")
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        process = subprocess.Popen(
            [sys.executable, "-m", "chaos.toxiproxy", "--host", host, "--port", str(port),
             "--seed", str(seed), "--exit-with-stdin"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env)
        try:
            url = cls._first_line(process, timeout)
        except BaseException:
            process.kill()
            process.wait()
            raise
        return cls(url, process)

    @classmethod
    def start_binary(cls, binary: str, host: str = "127.0.0.1", seed: int = 0,
                     stderr: Any = None, timeout: float = 10.0) -> ToxiproxyServer:
        """Run a real toxiproxy-server on a free port and wait until its API answers."""
        port = _free_port(host)  # it cannot report a port it chose itself, so we choose
        process = subprocess.Popen([binary, "-host", host, "-port", str(port), "-seed", str(seed)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        server = cls(f"http://{host}:{port}", process)
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection((host, port), timeout=1).close()
                return server
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    server.stop()
                    raise RuntimeError(f"{binary} did not start on {server.url}") from None
                time.sleep(0.05)

    @staticmethod
    def _first_line(process: subprocess.Popen, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        out = b""
        while not out.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError("chaos.toxiproxy did not report its address in time")
            if select.select([process.stdout], [], [], remaining)[0]:
                data = os.read(process.stdout.fileno(), 256)
                if not data:
                    raise RuntimeError(f"chaos.toxiproxy exited with status {process.wait()}")
                out += data
        return out.decode().strip()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def client(self):
        """A toxiproxy-python client (`toxiproxy.Toxiproxy`) for this server.

        toxiproxy-python keeps the server address in class attributes, so this
        re-points every `Toxiproxy` object in the process at this server. It
        comes with the `dev` extra: the server itself needs only aiohttp.
        """
        from toxiproxy import Toxiproxy

        client = Toxiproxy()
        client.update_api_consumer(self.host, self.port)
        return client

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the child process (SIGTERM, then SIGKILL); a server we did not start is left alone."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe:
                pipe.close()

    def __enter__(self) -> ToxiproxyServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_toxiproxy(seed: int = 0, stderr: Any = None) -> ToxiproxyServer:
    """The best Toxiproxy available: $TOXIPROXY_URL, else toxiproxy-server on PATH, else ours."""
    url = os.environ.get("TOXIPROXY_URL")
    if url:
        return ToxiproxyServer(url)
    binary = shutil.which("toxiproxy-server")
    if binary:
        return ToxiproxyServer.start_binary(binary, seed=seed, stderr=stderr)
    return ToxiproxyServer.start(seed=seed, stderr=stderr)


if __name__ == "__main__":
    main()

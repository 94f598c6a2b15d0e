"""chaos.toxiproxy, tested as the chaos suite uses it: the server runs as a real
child process on a free 127.0.0.1 port, proxies and toxics are made through
toxiproxy-python (or raw HTTP where the client hides the server's answer), and
every toxic is measured on real sockets against small TCP servers run here.

Timing assertions are lower bounds (a toxic must cost at least what it says);
the two upper bounds leave seconds of headroom, so a loaded machine cannot
make them flake.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.toxiproxy import ToxiproxyServer, start_toxiproxy

PATTERN = bytes(range(256)) * 400  # 100 KiB whose corruption or reordering would show


class TcpServer:
    """A threaded TCP server on 127.0.0.1 running `handler(conn, server)` per connection."""

    def __init__(self, handler):
        self.handler = handler
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.reads: list[int] = []  # sizes of the recv() calls, for the slicer
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            try:
                self.handler(conn, self)
            except OSError:
                pass  # the proxy resetting us is part of several tests

    def close(self):
        self.sock.close()


def echo(conn, server):
    while data := conn.recv(65536):
        server.reads.append(len(data))
        conn.sendall(data)


def hello(conn, server):
    conn.sendall(b"hello")  # and close at once


def blast(conn, server):
    conn.sendall(PATTERN[:10_000])
    while conn.recv(65536):
        pass


@pytest.fixture(scope="module")
def server(request):
    srv = ToxiproxyServer.start(seed=1)
    request.addfinalizer(srv.stop)
    return srv


@pytest.fixture
def toxiproxy(server):
    yield server.client()
    client = server.client()  # re-pointed, in case a test aimed the client elsewhere
    client.reset()
    client.destroy_all()


@pytest.fixture(scope="module")
def echo_server(request):
    srv = TcpServer(echo)
    request.addfinalizer(srv.close)
    return srv


@pytest.fixture(scope="module")
def hello_server(request):
    srv = TcpServer(hello)
    request.addfinalizer(srv.close)
    return srv


@pytest.fixture(scope="module")
def blast_server(request):
    srv = TcpServer(blast)
    request.addfinalizer(srv.close)
    return srv


def connect(proxy) -> socket.socket:
    host, port = proxy.listen.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise AssertionError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def recv_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def round_trip(sock: socket.socket, payload: bytes = b"ping") -> float:
    start = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - start


def is_closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def api(server, method, path, **kwargs):
    return requests.request(method, server.url + path, timeout=5, **kwargs)


def test_proxy_forwards_bytes_faithfully_and_reports_its_address(server, toxiproxy, echo_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    listed = toxiproxy.proxies()["echo"]
    assert listed.enabled is True and listed.upstream == echo_server.address
    host, port = listed.listen.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0  # the port the proxy really got, not "0"
    with connect(proxy) as sock:
        sock.sendall(PATTERN)
        assert recv_exactly(sock, len(PATTERN)) == PATTERN
    assert api(server, "GET", "/version").json()["version"].endswith("-raftq")


def test_latency_delays_each_direction_on_open_connections(toxiproxy, echo_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    with connect(proxy) as sock:
        round_trip(sock)
        proxy.add_toxic(type="latency", attributes={"latency": 100})
        assert round_trip(sock) >= 0.099
        proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 100})
        assert round_trip(sock) >= 0.199
    toxics = proxy.toxics()
    assert toxics["latency_downstream"].attributes == {"latency": 100, "jitter": 0}
    assert toxics["latency_upstream"].stream == "upstream"


def test_latency_pipelines_rather_than_queueing(toxiproxy, echo_server):
    # 8 messages 50 ms apart through 300 ms of latency: a link with latency
    # delivers them all about 300 ms late, a queue would take 8 x 300 ms.
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="latency", attributes={"latency": 300})
    with connect(proxy) as sock:
        start = time.monotonic()
        for i in range(8):
            sock.sendall(b"%d" % i)
            time.sleep(0.05)
        assert recv_exactly(sock, 8) == b"01234567"
        elapsed = time.monotonic() - start
    assert 0.35 <= elapsed < 2.0


def test_removing_a_toxic_releases_the_data_it_holds(toxiproxy, echo_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="latency", attributes={"latency": 5000})
    with connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(b"held")
        time.sleep(0.2)
        proxy.destroy_toxic("latency_downstream")
        assert recv_exactly(sock, 4) == b"held"
        assert time.monotonic() - start < 3.0
        assert proxy.toxics() == {}


def test_updating_a_toxic_changes_open_connections(server, toxiproxy, echo_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="latency", name="lag", attributes={"latency": 10, "jitter": 5})
    with connect(proxy) as sock:
        round_trip(sock)
        reply = api(server, "POST", "/proxies/echo/toxics/lag", json={"attributes": {"latency": 300}})
        assert reply.status_code == 200
        assert reply.json()["attributes"] == {"latency": 300, "jitter": 5}
        assert round_trip(sock) >= 0.295  # 300 ms minus at most 5 ms of jitter


def test_bandwidth_limits_the_rate(toxiproxy, echo_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="bandwidth", attributes={"rate": 100})  # KB/s
    payload = PATTERN[:50_000]
    with connect(proxy) as sock:
        assert round_trip(sock, payload) >= 0.495  # 50 KB at 100 KB/s


def test_timeout_black_holes_then_closes(toxiproxy, echo_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="timeout", attributes={"timeout": 500})
    start = time.monotonic()
    with connect(proxy) as sock:
        sock.sendall(b"ping")
        assert recv_all(sock) == b""  # nothing comes back, then the connection closes
        assert time.monotonic() - start >= 0.495


def test_timeout_zero_holds_forever_and_removal_closes(toxiproxy, echo_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    with connect(proxy) as sock:
        round_trip(sock)
        proxy.add_toxic(type="timeout", attributes={"timeout": 0})
        sock.sendall(b"ping")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(10)
        sock.settimeout(5)
        # Bytes were dropped mid-stream, so the connection must not resume.
        proxy.destroy_toxic("timeout_downstream")
        assert is_closed(sock)
    with connect(proxy) as sock:
        round_trip(sock)


def test_reset_peer_resets_the_connection(toxiproxy, echo_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="reset_peer", stream="upstream", attributes={"timeout": 200})
    with connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(b"ping")
        with pytest.raises(ConnectionResetError):
            sock.recv(10)
        assert time.monotonic() - start >= 0.195


def test_limit_data_cuts_after_n_bytes(toxiproxy, blast_server):
    proxy = toxiproxy.create(upstream=blast_server.address, name="blast")
    with connect(proxy) as sock:
        assert recv_exactly(sock, 10_000) == PATTERN[:10_000]  # unlimited, as a control
    proxy.add_toxic(type="limit_data", attributes={"bytes": 1000})
    with connect(proxy) as sock:
        assert recv_all(sock) == PATTERN[:1000]


def test_slow_close_delays_the_close(toxiproxy, hello_server):
    proxy = toxiproxy.create(upstream=hello_server.address, name="hello")
    proxy.add_toxic(type="slow_close", attributes={"delay": 500})
    start = time.monotonic()
    with connect(proxy) as sock:
        assert recv_all(sock) == b"hello"  # the server closed at once; its FIN is held back
        assert time.monotonic() - start >= 0.495


def test_slicer_splits_data_into_small_pieces(toxiproxy):
    upstream = TcpServer(echo)
    try:
        proxy = toxiproxy.create(upstream=upstream.address, name="sliced")
        proxy.add_toxic(type="slicer", stream="upstream",
                        attributes={"average_size": 20, "size_variation": 5, "delay": 20_000})
        with connect(proxy) as sock:
            assert round_trip(sock, PATTERN[:200]) >= 0.18  # 9 or more gaps of 20 ms
        assert sum(upstream.reads) == 200 and len(upstream.reads) >= 3
    finally:
        upstream.close()


def test_toxicity_decides_per_connection_and_updates_live(server, toxiproxy, echo_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="timeout", toxicity=0.0, attributes={"timeout": 0})
    with connect(proxy) as sock:
        round_trip(sock)  # spared
        reply = api(server, "POST", "/proxies/echo/toxics/timeout_downstream", json={"toxicity": 1.0})
        assert reply.json()["toxicity"] == 1.0
        sock.sendall(b"ping")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(10)


def test_disable_partitions_and_enable_restores(toxiproxy, echo_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    address = proxy.listen
    with connect(proxy) as sock:
        round_trip(sock)
        with proxy.down():
            assert is_closed(sock)
            with pytest.raises(ConnectionRefusedError):
                connect(proxy)
            assert toxiproxy.get_proxy("echo").enabled is False
    listed = toxiproxy.get_proxy("echo")
    assert listed.enabled is True and listed.listen == address  # same port again
    with connect(proxy) as sock:
        round_trip(sock)


def test_changing_upstream_moves_new_connections_and_drops_old(server, toxiproxy, echo_server, hello_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="moving")
    with connect(proxy) as old:
        round_trip(old)
        reply = api(server, "POST", "/proxies/moving", json={"upstream": hello_server.address})
        assert reply.status_code == 200 and reply.json()["enabled"] is True
        assert is_closed(old)
    with connect(proxy) as sock:
        assert recv_all(sock) == b"hello"


def test_deleting_a_proxy_closes_everything(server, toxiproxy, echo_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    with connect(proxy) as sock:
        round_trip(sock)
        assert proxy.destroy() is True
        assert is_closed(sock)
        with pytest.raises(ConnectionRefusedError):
            connect(proxy)
    assert api(server, "GET", "/proxies/echo").status_code == 404


def test_reset_reenables_proxies_and_removes_toxics(toxiproxy, echo_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="latency", attributes={"latency": 1000})
    proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    proxy.disable()
    assert toxiproxy.reset() is True
    listed = toxiproxy.get_proxy("echo")
    assert listed.enabled is True and listed.toxics() == {}
    with connect(proxy) as sock:
        round_trip(sock)


def test_api_errors_match_toxiproxy(server, toxiproxy, echo_server):
    proxy = toxiproxy.create(upstream=echo_server.address, name="echo")
    proxy.add_toxic(type="latency", attributes={"latency": 1})

    def expect(status, error, method, path, body=None):
        reply = api(server, method, path, json=body)
        assert (reply.status_code, reply.json()) == (status, {"error": error, "status": status})

    expect(404, "proxy not found", "GET", "/proxies/nope")
    expect(404, "proxy not found", "POST", "/proxies/nope", {"enabled": False})
    expect(404, "proxy not found", "DELETE", "/proxies/nope")
    expect(404, "proxy not found", "GET", "/proxies/nope/toxics")
    expect(404, "toxic not found", "GET", "/proxies/echo/toxics/nope")
    expect(404, "toxic not found", "DELETE", "/proxies/echo/toxics/nope")
    expect(409, "proxy already exists", "POST", "/proxies",
           {"name": "echo", "upstream": echo_server.address})
    expect(409, "toxic already exists", "POST", "/proxies/echo/toxics", {"type": "latency"})
    expect(400, "missing required field: upstream", "POST", "/proxies", {"name": "x"})
    expect(400, "invalid toxic type", "POST", "/proxies/echo/toxics", {"type": "nope"})
    expect(400, "stream was invalid, can be either upstream or downstream",
           "POST", "/proxies/echo/toxics", {"type": "latency", "stream": "sideways"})

    # Nothing outside 127.0.0.0/8 is listened on or dialed.
    for body in ({"name": "x", "listen": "192.0.2.1:0", "upstream": echo_server.address},
                 {"name": "x", "upstream": "192.0.2.1:80"}):
        reply = api(server, "POST", "/proxies", json=body)
        assert reply.status_code == 400 and "127.0.0.0/8" in reply.json()["error"]
    assert set(toxiproxy.proxies()) == {"echo"}

    # toxiproxy-python turns these statuses into its exceptions.
    with pytest.raises(ProxyExists):
        proxy.add_toxic(type="latency")
    with pytest.raises(NotFound):
        proxy.destroy_toxic("nope")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="nope")


def test_server_process_lifecycle_and_preference(server, monkeypatch, tmp_path):
    monkeypatch.setenv("TOXIPROXY_URL", server.url)
    borrowed = start_toxiproxy()
    assert borrowed.pid is None and borrowed.url == server.url
    borrowed.stop()  # not ours: must leave it running
    assert server.process.poll() is None

    monkeypatch.setenv("TOXIPROXY_URL", "http://192.0.2.1:8474")
    with pytest.raises(ValueError):
        start_toxiproxy()

    monkeypatch.delenv("TOXIPROXY_URL")
    monkeypatch.setenv("PATH", str(tmp_path))  # no toxiproxy-server here
    own = start_toxiproxy(seed=3)
    try:
        assert own.pid != server.pid
        assert b"raftq" in own.client().version()
    finally:
        own.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(own.pid, 0)

    # A toxiproxy-server on PATH wins; this stand-in takes the Go server's flags.
    fake = tmp_path / "toxiproxy-server"
    fake.write_text('#!/bin/sh\n[ "$1 $3 $5" = "-host -port -seed" ] || exit 2\n'
                    f'exec {sys.executable} -m chaos.toxiproxy --host "$2" --port "$4" --seed "$6"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    real = start_toxiproxy(seed=3)
    try:
        assert real.process.args[0] == str(fake) and b"raftq" in real.client().version()
    finally:
        real.stop()
    assert real.process.returncode == 0  # stopped by SIGTERM, cleanly

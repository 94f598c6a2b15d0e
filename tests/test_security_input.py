"""Input no client may use to hurt a node: oversized, deep, numerous or
malformed bodies, odd query strings and headers, slow and idle sockets.
Each answer is a 4xx with the error body shape, never a 500, and changes
nothing."""

import socket
import threading
import time
from urllib.parse import urlsplit

import cbor2
import pytest

from tests.wire import call, token_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from tests.conftest import start_cluster
    cluster = start_cluster(tmp_path_factory.mktemp("input"), 3, node_args=("--header-timeout-s", "2",
                                                                                        "--body-timeout-s", "3"))
    yield cluster
    cluster.close()


@pytest.fixture
def leader_url(cluster):
    return cluster.url(cluster.wait_for_leader(30))


def refused(reply, status: int, code: str):
    assert (reply.status, reply.body["error"]) == (status, code), reply
    assert set(reply.body) >= {"error", "message"}


def raw_exchange(url: str, data: bytes, timeout: float = 15) -> bytes:
    """Send bytes as they are; what came back until the node closed or answered."""
    host, port = urlsplit(url).netloc.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        try:
            while b"\r\n\r\n" not in received or len(received) < 20:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
        except socket.timeout:
            pass
        return received


def head(method: str, path: str, url: str, extra: bytes = b"", length: int | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1".encode(), f"Host: {urlsplit(url).netloc}".encode(),
             f"Authorization: Bearer {token_for(url)}".encode(), b"Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}".encode())
    return b"\r\n".join(lines) + b"\r\n" + extra + b"\r\n"


# ---- the 500s of issue 11 ------------------------------------------------------------------

def test_a_non_ascii_digit_in_the_query_is_a_400(leader_url):
    refused(call("GET", leader_url + "/v1/queues/q/messages?limit=%C2%B2"), 400, "bad_request")
    refused(call("GET", leader_url + "/v1/queues/q/messages?from_seq=99999999999999999999999"), 400, "bad_request")


def test_a_cbor_map_key_of_5000_digits_is_a_400(leader_url):
    raw = cbor2.dumps({10 ** 5000: 1})
    refused(call("POST", leader_url + "/v1/queues/q/messages", raw=raw,
                 headers={"Content-Type": "application/cbor"}), 400, "bad_request")


def test_a_non_utf8_authorization_header_is_a_401(leader_url):
    answer = raw_exchange(leader_url, b"GET /v1/queues HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\x80\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


def test_metrics_while_queues_are_deleted_never_fail(cluster, leader_url):
    stop = threading.Event()
    failures = []

    def churn():
        i = 0
        while not stop.is_set():
            call("PUT", f"{leader_url}/v1/queues/churn{i % 20}", {})
            call("DELETE", f"{leader_url}/v1/queues/churn{(i + 10) % 20}")
            i += 1

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        for _ in range(150):
            reply = call("GET", leader_url + "/metrics")
            if reply.status != 200:
                failures.append(reply)
    finally:
        stop.set()
        worker.join()
    assert failures == []


def test_dot_names_are_refused(leader_url):
    # percent-encoded, so that no client or proxy collapses them before the node sees them
    for name in ("%2E", "%2E%2E", ".hidden", "-flag"):
        refused(call("PUT", f"{leader_url}/v1/queues/{name}", {}), 400, "bad_request")
    refused(call("POST", leader_url + "/v1/tx", {"put": [{"queue": "..", "messages": [{"body": 1}]}]}),
            400, "bad_request")
    assert call("PUT", f"{leader_url}/v1/queues/ok.name_1-2", {}).status in (200, 201)


@pytest.mark.parametrize("raw", [b"[]", b"0", b'""', b"false", b"null"])
def test_a_body_that_decodes_to_nothing_much_is_refused_not_taken_for_none(leader_url, raw):
    """A body is optional on these calls; one that is sent must be an object. Taken for "no
    body", [] or 0 ran the call with its defaults: a receive leased, a redrive moved."""
    queue = "falsy-" + {b"[]": "list", b"0": "zero", b'""': "text", b"false": "false", b"null": "null"}[raw]
    assert call("PUT", f"{leader_url}/v1/queues/{queue}", {"dead_letter": queue + "-dlq"}).status == 201
    assert call("POST", f"{leader_url}/v1/queues/{queue}/messages", {"body": "kept"}).status == 201
    headers = {"Content-Type": "application/json"}
    for path in (f"/v1/queues/{queue}/receive", f"/v1/queues/{queue}-dlq/redrive", f"/v1/queues/{queue}/groups/g2",
                 "/v1/cluster/leader", f"/v1/queues/{queue}-two"):
        method = "PUT" if path.endswith(("/g2", "-two")) else "POST"
        refused(call(method, leader_url + path, raw=raw, headers=headers), 400, "bad_request")
    stats = call("GET", f"{leader_url}/v1/queues/{queue}").body["stats"]
    assert (stats["depth"], stats["in_flight"], set(stats["groups"])) == (1, 0, {"default"})
    assert call("GET", f"{leader_url}/v1/queues/{queue}-two").status == 404


# ---- numbers ------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [b'{"body": 123456789012345678901234567890}', b'{"body": -9223372036854775809}',
                                 b'{"body": 1e400}', b'{"body": NaN}', b'{"body": [1, 2, 18446744073709551616]}'])
def test_json_numbers_outside_64_bits_or_not_finite_are_refused(leader_url, raw):
    refused(call("POST", leader_url + "/v1/queues/nums/messages", raw=raw), 400, "bad_request")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -(2 ** 64)], ids=["nan", "inf", "-2^64"])
def test_cbor_numbers_outside_64_bits_or_not_finite_are_refused(leader_url, value):
    refused(call("POST", leader_url + "/v1/queues/nums/messages", {"body": value}, cbor=True), 400, "bad_request")


def test_64_bit_edges_are_stored_exactly(leader_url):
    raw = b'{"messages": [{"body": 18446744073709551615}, {"body": -9223372036854775808}, {"body": 1.5}]}'
    assert call("POST", leader_url + "/v1/queues/edges/messages", raw=raw).status == 201
    got = call("GET", leader_url + "/v1/queues/edges/messages").body["messages"]
    assert [m["body"] for m in got] == [18446744073709551615, -9223372036854775808, 1.5]


# ---- sizes, counts, depth --------------------------------------------------------------------

def test_headers_key_and_id_count_toward_max_message_bytes(leader_url):
    big = "h" * (1 << 20)
    refused(call("POST", leader_url + "/v1/queues/sized/messages", {"body": "x", "headers": {"a": big}}),
            413, "too_large")
    refused(call("POST", leader_url + "/v1/queues/sized/messages", {"body": "x", "key": "k" * 1024,
                                                                    "headers": {"a": big[:-1000]}}), 413, "too_large")


def test_a_request_over_max_request_bytes_is_a_413(leader_url):
    refused(call("POST", leader_url + "/v1/queues/big/messages", raw=b"[" + b" " * (5 << 20) + b"]"),
            413, "too_large")


@pytest.mark.parametrize("cbor", [False, True], ids=["json", "cbor"])
def test_a_body_of_too_many_values_is_refused_before_it_is_built(leader_url, cbor):
    items = [{}] * 1_000_000
    raw = cbor2.dumps({"messages": items}) if cbor else b'{"messages": [' + b"{}," * 999_999 + b"{}]}"
    headers = {"Content-Type": "application/cbor"} if cbor else {}
    reply = call("POST", leader_url + "/v1/queues/many/messages", raw=raw, headers=headers)
    refused(reply, 400, "bad_request")
    assert "values" in reply.body["message"]


@pytest.mark.parametrize("cbor", [False, True], ids=["json", "cbor"])
def test_deep_nesting_is_refused(leader_url, cbor):
    depth = 100_000
    raw = b"\x81" * depth + b"\x00" if cbor else b"[" * depth + b"]" * depth
    headers = {"Content-Type": "application/cbor"} if cbor else {}
    refused(call("POST", leader_url + "/v1/queues/deep/messages", raw=raw, headers=headers), 400, "bad_request")


@pytest.mark.parametrize("raw", [b"\x9b" + (2 ** 62).to_bytes(8, "big"), b"\x7b" + (2 ** 62).to_bytes(8, "big"),
                                 b"\xbb" + (2 ** 62).to_bytes(8, "big"), b"\x9f\x01\xff", b"\xc2\x41\x01"],
                         ids=["array-2^62", "text-2^62", "map-2^62", "indefinite", "bignum-tag"])
def test_cbor_declaring_more_than_it_holds_is_refused(leader_url, raw):
    refused(call("POST", leader_url + "/v1/queues/decl/messages", raw=raw, headers={"Content-Type": "application/cbor"}),
            400, "bad_request")


def test_a_huge_declared_content_length_is_a_413_at_once(leader_url):
    answer = raw_exchange(leader_url, head("POST", "/v1/queues/q/messages", leader_url, length=10 << 30))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_a_follower_redirects_a_put_without_reading_its_body(cluster):
    leader = cluster.wait_for_leader(30)
    follower = next(n for n in cluster.ids if n != leader)
    reply = call("POST", cluster.url(follower) + "/v1/queues/q/messages", raw=b"[" * 50_000)
    assert reply.status == 307 and reply.headers["X-Raftq-Leader"] == leader


# ---- slow and idle sockets ---------------------------------------------------------------------

def test_slow_headers_are_cut_off_at_the_header_timeout(leader_url):
    host, port = urlsplit(leader_url).netloc.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        started = time.monotonic()
        closed = False
        sock.sendall(b"GET /health/live HTTP/1.1\r\n")
        try:
            for i in range(60):                       # one header byte every 0.5 s: 30 s if allowed
                sock.sendall(b"X")
                sock.settimeout(0.5)
                try:
                    if sock.recv(1024) == b"":
                        closed = True
                        break
                except socket.timeout:
                    pass
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        assert closed and time.monotonic() - started < 20


def test_idle_connections_are_closed(leader_url):
    host, port = urlsplit(leader_url).netloc.rsplit(":", 1)
    socks = [socket.create_connection((host, int(port)), timeout=20) for _ in range(50)]
    try:
        for sock in socks:
            try:
                assert sock.recv(1) == b""
            except ConnectionResetError:
                pass
    finally:
        for sock in socks:
            sock.close()


def test_a_slow_body_is_cut_off(leader_url):
    host, port = urlsplit(leader_url).netloc.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head("POST", "/v1/queues/q/messages", leader_url, length=100))
        sock.sendall(b'{"body": ')
        sock.settimeout(30)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]

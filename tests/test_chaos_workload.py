"""chaos.workload: how a client operation's outcome is classified."""

import socket
import threading

from chaos.history import History, ops
from chaos.workload import Caller, Endpoints, attempt, receive_result


def read_request(conn: socket.socket) -> None:
    """All of one request: closing with part of it unread would reset the
    connection, and the client would see a reset instead of `reply`."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += conn.recv(65536)


def serve_once(reply: bytes) -> tuple[str, threading.Thread, socket.socket]:
    """A server on 127.0.0.1 that reads one request, sends `reply` and closes."""
    server = socket.create_server(("127.0.0.1", 0))

    def run():
        conn, _ = server.accept()
        with conn:
            read_request(conn)
            conn.sendall(reply)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{server.getsockname()[1]}", thread, server


def classify(reply: bytes) -> tuple[str, object, list]:
    url, thread, server = serve_once(reply)
    history = History()
    caller = Caller(Endpoints({"n1": url}, {"n1": url}))
    try:
        outcome, value = attempt(history, caller, "c1", "receive", {"queue": "q"}, "n1", "POST",
                                 "/v1/queues/q/receive", {"max": 1}, timeout=5, result=receive_result)
    finally:
        caller.close()
        thread.join(5)
        server.close()
    return outcome, value, ops(history.events)


def test_a_reply_cut_inside_its_headers_is_an_unknown_outcome():
    outcome, value, [op] = classify(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
    assert outcome == "info" and "IncompleteRead" in value["exception"]
    assert op.type == "info"


def test_a_whole_reply_is_ok():
    body = b'{"messages": [{"seq": 1, "receipt": "r", "deliveries": 1, "put_at_ms": 5, "body": {"id": "p1-1"}}]}'
    outcome, value, [op] = classify(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                    b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert outcome == "ok" and op.ok
    assert value["messages"][0]["seq"] == 1


def test_a_redirect_to_a_nodes_real_address_is_followed_to_its_proxy():
    direct = {"n1": "http://127.0.0.1:8001", "n2": "http://127.0.0.1:8002"}
    proxies = {"n1": "http://127.0.0.1:9001", "n2": "http://127.0.0.1:9002"}
    endpoints = Endpoints(proxies, direct)
    assert endpoints.node_at("http://127.0.0.1:8002/v1/queues/q/messages") == "n2"    # where a 307 sends
    assert endpoints.node_at("http://127.0.0.1:9001/v1/queues/q/messages") == "n1"
    assert Caller(endpoints).urls["n2"] == proxies["n2"]    # and it is called through its proxy

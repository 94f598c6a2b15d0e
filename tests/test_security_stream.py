"""The streaming wire against a client that floods, never reads, or hoards
subscriptions: what one connection can make a node hold is bounded
(docs/stream.md, docs/security.md), against real node processes."""

import asyncio
import base64
import os
import select
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import cbor2
import pytest

from raftq.client import AsyncClient
from tests.wire import call

pytestmark = pytest.mark.integration

FLOOD_FRAMES = 3_000_000      # the most a flood sends
FLOOD_S = 60                  # and for at most this long
STALL_S = 5                   # a flood the node has not read from for this long has been stopped
RSS_GROWTH_BOUND = 50 << 20
# --stream-write-stall-s of the node a reader of nothing is dropped by (default 30). Well over
# STALL_S: the node's stall starts when its writes block, before the flood sees its own sends stop,
# and at 5 s a busy machine let the node drop the flood before the flood saw the stall (CI).
WRITE_STALL_S = 15


def front_pids(node_pid: int) -> list[int]:
    """The node's fronts: the processes its engine forked."""
    children = Path(f"/proc/{node_pid}/task/{node_pid}/children").read_text().split()
    return [int(pid) for pid in children]


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            continue      # a snapshot writer that finished
        kb = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
        total += int(kb) * 1024
    return total


def ws_frame(payload: bytes) -> bytes:
    """A masked binary frame (a client's must be masked); the zero mask leaves the payload as it is."""
    assert len(payload) < 126
    return bytes([0x82, 0x80 | len(payload)]) + b"\0\0\0\0" + payload


def open_stream(url: str, token: str) -> socket.socket:
    """A raw socket upgraded to /v1/stream, receiving into a 4 KB buffer that it never reads."""
    host, port = urlsplit(url).netloc.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /v1/stream HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                  f"Authorization: Bearer {token}\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def flood(url: str, token: str, node_pid: int, frame: bytes, *, wait_for_drop_s: float = 0) -> dict:
    """Send `frame` over and over without reading, while sampling the fronts'
    RSS; stops after FLOOD_FRAMES, FLOOD_S, when the node stopped reading for
    STALL_S, or when it closed the connection. Then, reading nothing still,
    waits up to `wait_for_drop_s` for the node to drop the connection."""
    pids = front_pids(node_pid)
    before = rss_bytes(pids)
    peak = before
    sock = open_stream(url, token)
    sock.setblocking(False)
    chunk = frame * 10_000
    view = memoryview(chunk)
    sent = offset = 0
    started = last_progress = time.monotonic()
    ended = "frames"
    try:
        while sent < FLOOD_FRAMES * len(frame):
            now = time.monotonic()
            if now - started > FLOOD_S:
                ended = "time"
                break
            if now - last_progress > STALL_S:
                ended = "stalled"
                break
            _, writable, _ = select.select([], [sock], [], 0.2)
            peak = max(peak, rss_bytes(pids))
            if not writable:
                continue
            try:
                written = sock.send(view[offset:])
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                ended = "closed"
                break
            sent += written
            offset = (offset + written) % len(chunk)
            last_progress = time.monotonic()
        # what the node had already taken in is still being answered
        settle_until = time.monotonic() + 3
        while time.monotonic() < settle_until:
            peak = max(peak, rss_bytes(pids))
            time.sleep(0.2)
        stalled_at, dropped_after = time.monotonic(), None
        while dropped_after is None and time.monotonic() - stalled_at < wait_for_drop_s:
            time.sleep(1)
            try:
                sock.send(frame)        # its buffers are full: only a reset connection answers
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                dropped_after = time.monotonic() - last_progress
    finally:
        sock.close()
    return {"growth": peak - before, "frames_sent": sent // len(frame), "ended": ended,
            "seconds": time.monotonic() - started, "dropped_after_s": dropped_after}


@pytest.fixture
def one_node(fresh_cluster):
    cluster = fresh_cluster(1)
    node = cluster.wait_for_leader(30)
    return cluster, cluster.url(node), cluster.pid(node)


def test_a_client_that_floods_bad_frames_and_never_reads_costs_the_front_little(one_node):
    cluster, url, pid = one_node
    empty_map = ws_frame(cbor2.dumps({}))           # 7 bytes, each earning an error
    result = flood(url, cluster.token, pid, empty_map)
    assert result["growth"] < RSS_GROWTH_BOUND, result
    assert result["ended"] in ("closed", "stalled"), result   # the node did not take it all in


def test_a_client_that_floods_answered_frames_and_never_reads_is_slowed_then_dropped(fresh_cluster):
    cluster = fresh_cluster(1, node_args=("--stream-write-stall-s", str(WRITE_STALL_S)))
    node = cluster.wait_for_leader(30)
    url, pid = cluster.url(node), cluster.pid(node)
    # each is answered "unsubscribed", never an error: only the outbox's bound stops it
    unsubscribe = ws_frame(cbor2.dumps({"op": "unsubscribe", "sub": 1}))
    result = flood(url, cluster.token, pid, unsubscribe, wait_for_drop_s=WRITE_STALL_S + 30)
    assert result["growth"] < RSS_GROWTH_BOUND, result
    assert result["ended"] == "stalled", result
    # and, since it lets nothing be written, it does not hold the connection forever
    assert result["dropped_after_s"] is not None, result
    # the node still serves
    assert call("GET", f"{url}/health/ready").status == 200


def test_many_malformed_frames_in_a_row_close_the_connection_with_1008(one_node):
    cluster, url, _ = one_node

    async def scenario():
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(url + "/v1/stream", headers={"Authorization": f"Bearer {cluster.token}"})
            await ws.receive(timeout=10)                       # hello
            # a good frame among bad ones starts the count again
            for _ in range(99):
                await ws.send_bytes(cbor2.dumps({}))
            await ws.send_bytes(cbor2.dumps({"op": "unsubscribe", "sub": 1}))
            for _ in range(150):
                await ws.send_bytes(cbor2.dumps({}))
            frames = []
            while True:
                msg = await ws.receive(timeout=10)
                if msg.type != aiohttp.WSMsgType.BINARY:
                    return frames, msg, ws.close_code
                frames.append(cbor2.loads(msg.data))
    frames, last, code = asyncio.run(scenario())
    assert code == 1008, (last, code)
    errors = [f for f in frames if f["op"] == "error"]
    assert [f["op"] for f in frames].count("unsubscribed") == 1
    # 99 before the good frame, 100 after it, and the one that says why
    assert len(errors) == 99 + 100 + 1, len(errors)
    assert "malformed frames in a row" in errors[-1]["message"]


async def stream_session(session: aiohttp.ClientSession, url: str, token: str):
    ws = await session.ws_connect(url + "/v1/stream", headers={"Authorization": f"Bearer {token}"})
    hello = cbor2.loads((await ws.receive(timeout=10)).data)
    assert hello["leader"], hello
    return ws


async def answers(ws, count: int) -> list[dict]:
    return [cbor2.loads((await ws.receive(timeout=30)).data) for _ in range(count)]


def test_one_connection_subscribing_1100_times_leaves_others_their_long_polls(fresh_cluster):
    cluster = fresh_cluster(1)          # --max-long-polls 1000, --max-subscriptions-per-connection 100
    url = cluster.url(cluster.wait_for_leader(30))
    assert call("PUT", f"{url}/v1/queues/hoard", {}).status == 201

    async def scenario():
        async with aiohttp.ClientSession() as session:
            hoarder = await stream_session(session, url, cluster.token)
            for sub in range(1100):
                await hoarder.send_bytes(cbor2.dumps({"op": "subscribe", "sub": sub, "queue": "hoard",
                                                      "prefetch": 1}))
            replies = await answers(hoarder, 1100)
            await asyncio.sleep(1.0)        # every accepted subscription is waiting now
            async with AsyncClient(url, token=cluster.token, retry_for=0) as client:
                polled = await client.receive("hoard", wait_ms=500)
            other = await stream_session(session, url, cluster.token)
            await other.send_bytes(cbor2.dumps({"op": "subscribe", "sub": "mine", "queue": "hoard"}))
            mine = (await answers(other, 1))[0]
            call("POST", f"{url}/v1/queues/hoard/messages", {"body": "for anyone"})
            await hoarder.close()
            await other.close()
            return replies, polled, mine
    replies, polled, mine = asyncio.run(scenario())
    assert polled["messages"] == []                      # it waited, and was not refused
    assert mine == {"op": "subscribed", "sub": "mine"}
    accepted = [r for r in replies if r["op"] == "subscribed"]
    refused = [r for r in replies if r["op"] == "error"]
    assert len(accepted) == 100 and len(refused) == 1000, (len(accepted), refused[:1])
    assert {(r["status"], r["error"]) for r in refused} == {(429, "limit_reached")}
    assert "--max-subscriptions-per-connection" in refused[0]["message"]


def test_one_client_address_gets_its_share_of_the_long_polls_and_another_its_own(fresh_cluster):
    cluster = fresh_cluster(1, node_args=("--max-long-polls", "10", "--max-long-polls-per-client", "4"))
    url = cluster.url(cluster.wait_for_leader(30))
    assert call("PUT", f"{url}/v1/queues/share", {}).status == 201
    headers = {"Authorization": f"Bearer {cluster.token}"}

    async def receive(session, wait_ms):
        async with session.post(f"{url}/v1/queues/share/receive", json={"wait_ms": wait_ms},
                                headers=headers) as reply:
            return reply.status, await reply.json()

    async def scenario():
        # the same node seen from two client addresses of the loopback network
        near = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.1", 0)))
        far = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0)))
        async with near, far:
            waiting = [asyncio.create_task(receive(near, 3000)) for _ in range(4)]
            await asyncio.sleep(1.0)
            over = await receive(near, 3000)
            elsewhere = await receive(far, 500)
            held = await asyncio.gather(*waiting)
            return over, elsewhere, held
    over, elsewhere, held = asyncio.run(scenario())
    assert over[0] == 429 and over[1]["error"] == "too_many_waiters", over
    assert "--max-long-polls-per-client" in over[1]["message"]
    assert elsewhere[0] == 200 and elsewhere[1]["messages"] == [], elsewhere
    assert [status for status, _ in held] == [200] * 4


def test_docs_security_states_the_streaming_wire_bounds_of_the_code():
    from raftq.api import stream
    from raftq.api.limits import Limits
    text = (Path(__file__).resolve().parent.parent / "docs" / "security.md").read_text()
    section = text[text.index("\n## A streaming-wire connection\n"):]
    section = section[:section.index("\n## ", 1)]
    cells = [[cell.strip() for cell in line.strip("|").split("|")]
             for line in section.splitlines() if line.startswith("|")][2:]     # header and rule dropped
    stated = {what.split(":")[0].split(" (")[0]: most for what, most, _ in cells}

    def spaced(n: int) -> str:
        return f"{n:,}".replace(",", " ")
    mib = 1 << 20
    assert stated == {
        "the outbox": f"{spaced(stream.MAX_OUTBOX_FRAMES)} frames, {stream.MAX_OUTBOX_BYTES // mib} MiB",
        "frames being applied": f"{stream.MAX_FRAMES_IN_FLIGHT} frames, {stream.MAX_BYTES_IN_FLIGHT // mib} MiB",
        "malformed frames in a row": str(stream.MAX_BAD_FRAMES_IN_A_ROW),
        "time a frame waits for a client that reads nothing":
            f"`--stream-write-stall-s` ({Limits().stream_write_stall_s:g} s)",
    }

"""Clients of the streaming wire (docs/stream.md): `Producer` and `Consumer`.

They batch for the user: a `Producer` gathers what `send` is given in one
turn of the event loop into one publish frame per queue (and, while earlier
messages await their confirms, what it is given within `linger_ms`, if
set), keeps at most
`window` messages unconfirmed, and resolves each `send`'s future with that
message's confirm. A `Consumer` subscribes with `prefetch` credit, hands out
pushed messages one at a time, and sends the acks and nacks it is given
together, one frame per moment. Import them from `raftq.client`.

Both talk to the leader only: a node's `hello` says whether it leads and, if
not, who does; a `redirect` or a dropped connection sends them to the next
node, for up to `retry_for` seconds. On the new connection a Producer resends
every unconfirmed message with the id it was given first (every message gets
one), so a failover stores each message exactly once, and a Consumer
subscribes again and resends unsettled acks (receipts outlive connections).

With several Raft groups (issue 24) a node leads some groups: it refuses a
frame for a queue of a group it does not lead with `not_leader` and that
leader's URL. A Producer then keeps one stream per leader node and sends
that queue's messages (the refused ones again, same ids) on the stream to
its leader; a Consumer moves its one subscription there, and its acks and
nacks not yet settled, when its subscription is refused so (on subscribing,
or once the node lost the group's lead) or when a settle is.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp
import cbor2

from .failover import DurabilityNotReached, Failover, RaftqError, backoff_delays

log = logging.getLogger(__name__)

UNKNOWN_OUTCOME = "no_quorum"    # refused without knowing whether it applied: resend, same ids
RESEND_AFTER_S = 0.05


class _Wire:
    """One WebSocket to the leader at a time; frames in order; reconnects on loss."""

    def __init__(self, urls, token: str | None, cafile: str | None, retry_for: float,
                 on_frame: Callable[[dict], None], on_connected: Callable[[], None]):
        self._route = Failover(urls, token, retry_for, timeout=10.0, cafile=cafile)
        self._on_frame = on_frame
        self._on_connected = on_connected
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task] = []
        self.connected = asyncio.Event()
        self.failed: Exception | None = None
        self._closing = False

    async def start(self) -> None:
        ssl_context = self._route.ssl_context
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl_context) if ssl_context else None)
        self._tasks = [asyncio.create_task(self._connect_loop()), asyncio.create_task(self._write_loop())]
        done = asyncio.create_task(self.connected.wait())
        await asyncio.wait({done, self._tasks[0]}, return_when=asyncio.FIRST_COMPLETED)
        done.cancel()
        if self.failed is not None:
            raise self.failed

    def send(self, frame: dict) -> None:
        self._outbox.put_nowait(frame)

    @property
    def base(self) -> str:
        """The base URL of the node this stream connects to (now, or next)."""
        return self._route.base

    def redirect(self, url: str) -> None:
        """Go to the node at `url`: the connection is closed and made again there."""
        self._route.follow(url)
        if self._ws is not None:
            asyncio.ensure_future(self._ws.close())

    async def close(self) -> None:
        self._closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._ws is not None:
            await self._ws.close()
        if self._session is not None:
            await self._session.close()

    async def _write_loop(self) -> None:
        while True:
            frame = await self._outbox.get()
            await self.connected.wait()
            try:
                await self._ws.send_bytes(cbor2.dumps(frame))
            except (aiohttp.ClientError, ConnectionError, RuntimeError, AttributeError):
                pass   # the connection went: what needs resending is resent on the next one

    async def _connect_loop(self) -> None:
        route = self._route
        headers = {k: v for k, v in route.headers.items() if k == "Authorization"}
        deadline = time.monotonic() + route.retry_for
        backoff = backoff_delays()
        while not self._closing:
            try:
                # route=group: this client sends each queue's frames to its group's leader (issue 24)
                ws = await self._session.ws_connect(route.base + "/v1/stream?route=group", headers=headers,
                                                    heartbeat=20,
                                                    max_msg_size=0, timeout=aiohttp.ClientWSTimeout(ws_close=2))
                hello = cbor2.loads((await ws.receive(timeout=10)).data)
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError, TypeError, ValueError) as exc:
                if isinstance(exc, aiohttp.WSServerHandshakeError) and exc.status in (401, 403):
                    self.failed = RaftqError(exc.status, "unauthorized", "the node refused the credentials")
                    return
                if time.monotonic() > deadline:
                    self.failed = ConnectionError(f"no raftq leader reachable for {route.retry_for} s: {exc}")
                    self._on_frame({"op": "failed", "error": str(self.failed)})
                    return
                route.next_node()
                await asyncio.sleep(next(backoff))
                continue
            if not hello.get("leader"):
                await ws.close()
                if hello.get("leader_url"):
                    route.follow(hello["leader_url"])
                else:
                    route.next_node()
                await asyncio.sleep(next(backoff))
                continue
            self._ws = ws
            backoff = backoff_delays()
            self.connected.set()
            self._on_connected()
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.BINARY:
                    break
                frame = cbor2.loads(msg.data)
                if frame.get("op") == "redirect":
                    if frame.get("leader_url"):
                        route.follow(frame["leader_url"])
                    break
                self._on_frame(frame)
            self.connected.clear()
            self._ws = None
            await ws.close()
            deadline = time.monotonic() + route.retry_for


def _error(frame: dict) -> RaftqError:
    return RaftqError(frame.get("status", 500), frame.get("error", "error"), frame.get("message", ""), frame)


class Producer:
    """Publishes with confirms; see the module docstring. Use in `async with`."""

    def __init__(self, urls="http://127.0.0.1:8001", *, token: str | None = None, window: int = 1000,
                 linger_ms: float = 0.0, max_batch: int = 250, durability: str = "quorum",
                 retry_for: float = 15.0, cafile: str | None = None):
        self.window = window
        # No linger by default: a timer's wake-up here costs more than its
        # millisecond, and a frame sent at the end of the turn is proposed at
        # once while group commit has room, or waits there filling an entry
        # (docs/benchmarks.md, "The producer's linger": W5 at 500 and 5 000
        # msgs/s lower, W2 no lower).
        self.linger_s = linger_ms / 1000
        # Frames smaller than the window travel at different stages at once
        # (one being applied while the next is replicated and the next
        # checked by the node): a whole window in one frame crosses every
        # stage alone, each waiting for the one before (measured: 1.2x the
        # messages per second at a quarter of the default window).
        self.max_batch = max_batch
        self.durability = durability
        self._connect = ([urls] if isinstance(urls, str) else list(urls), token, cafile, retry_for)
        # "" -> the stream to the nodes given; a leader's base URL -> the stream to that leader
        self._wires: dict[str, _Wire] = {}
        self._wire = self._new_wire("")
        self._wire_of: dict[str, str] = {}     # queue -> the key of the stream its messages take
        self._opening: set[asyncio.Task] = set()   # streams to leaders being opened
        self._slots = asyncio.Semaphore(window)
        self._cids = itertools.count(1)
        # A message's id unless given one: this producer's random prefix and
        # its cid, unique as a uuid4 (80 random bits per producer, 2^48
        # messages each) at a seventh of the cost per message.
        self._id_prefix = os.urandom(10).hex()
        self._unconfirmed: dict[int, tuple[str, dict, asyncio.Future]] = {}
        # cid -> the key of the stream it was last published on: a connection lost takes its
        # frames with it, whichever stream their queue has moved to since
        self._sent_on: dict[int, str] = {}
        self._batch: dict[str, list[dict]] = {}
        self._batched = 0
        self._flush_handle: asyncio.TimerHandle | None = None
        self._drained = asyncio.Event()
        self._drained.set()

    async def __aenter__(self) -> "Producer":
        await self._wire.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def send(self, queue: str, body: Any, *, key: str | None = None, id: str | None = None,
                   headers: dict | None = None, ttl_ms: int | None = None,
                   delay_ms: int | None = None, priority: int | None = None) -> asyncio.Future:
        """Wait for room in the window; returns a future of the message's confirm
        ({"seq", "duplicate", "replaced_seq", "durability"}) or its RaftqError
        (DurabilityNotReached when `all` was asked and not reached in time)."""
        wire = self._wires[self._wire_of.get(queue, "")]
        if wire.failed is not None:
            raise wire.failed
        await self._slots.acquire()
        cid = next(self._cids)
        message = {"cid": cid, "body": body, "id": id or f"{self._id_prefix}{cid:012x}"}
        for name, value in (("key", key), ("headers", headers), ("ttl_ms", ttl_ms), ("delay_ms", delay_ms),
                            ("priority", priority)):
            if value is not None:
                message[name] = value
        future = asyncio.get_running_loop().create_future()
        self._unconfirmed[cid] = (queue, message, future)
        self._drained.clear()
        self._batch.setdefault(queue, []).append(message)
        self._batched += 1
        if self._batched >= self.max_batch:
            self._flush()
        elif self._flush_handle is None:
            # Lingering pays only while confirms are awaited: a lone message
            # would just wait, while under load the wait fills a frame.
            awaiting = len(self._unconfirmed) > self._batched
            self._flush_handle = asyncio.get_running_loop().call_later(
                self.linger_s if awaiting else 0, self._flush)
        return future

    async def flush(self) -> None:
        """Send what lingers and wait until every message sent so far is confirmed or refused."""
        self._flush()
        await self._drained.wait()

    async def close(self) -> None:
        if self._unconfirmed and all(wire.failed is None for wire in self._wires.values()):
            await self.flush()
        await asyncio.gather(*(wire.close() for wire in self._wires.values()))

    def _new_wire(self, key: str) -> _Wire:
        """The stream `key` names ("": to the nodes given; else to the leader at that base URL)."""
        urls, token, cafile, retry_for = self._connect
        wire = self._wires[key] = _Wire(([key] if key else []) + urls, token, cafile, retry_for,
                                        lambda frame: self._on_frame(key, frame), lambda: self._resend_all(key))
        return wire

    def _follow(self, queue: str, leader_url: str) -> None:
        """`queue`'s messages go to the stream to `leader_url`, opened now if this producer has none.
        A stream that moved on to another node (its leader was unreachable) goes back there, and
        one that gave up is opened again: the leader is named anew, and frames left on a stream
        that goes nowhere would wait forever."""
        key = leader_url.rstrip("/")
        self._wire_of[queue] = key
        wire = self._wires.get(key)
        if wire is not None and wire.failed is None and wire.base != key:
            wire.redirect(key)
        elif wire is None or wire.failed is not None:
            if wire is not None:
                asyncio.ensure_future(wire.close())   # one that gave up is opened anew: the leader is there now
            opening = asyncio.ensure_future(self._new_wire(key).start())
            self._opening.add(opening)
            # a stream that cannot open says so with its "failed" frame, to the messages routed to it
            opening.add_done_callback(lambda task: self._opening.discard(task) or task.cancelled() or task.exception())

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        for queue, messages in self._batch.items():
            self._publish(queue, messages)
        self._batch, self._batched = {}, 0

    def _publish(self, queue: str, messages: list[dict]) -> None:
        key = self._wire_of.get(queue, "")
        wire = self._wires[key]
        for message in messages:
            self._sent_on[message["cid"]] = key
        for start in range(0, len(messages), self.max_batch):
            wire.send({"op": "publish", "queue": queue, "durability": self.durability,
                       "messages": messages[start:start + self.max_batch]})

    def _resend_all(self, key: str) -> None:
        """On a new connection of stream `key`: everything unconfirmed that was sent on it or whose
        queue it serves again, with its id, each on its queue's stream (the lost connection took
        the frames it carried, of queues that moved to another leader's stream too); held batches
        wait for their flush."""
        held = {m["cid"] for messages in self._batch.values() for m in messages}
        by_queue: dict[str, list[dict]] = {}
        for cid, (queue, message, _) in self._unconfirmed.items():
            if cid not in held and key in (self._sent_on.get(cid), self._wire_of.get(queue, "")):
                by_queue.setdefault(queue, []).append(message)
        for queue, messages in by_queue.items():
            self._publish(queue, messages)

    def _resolve(self, cid: int, outcome) -> None:
        entry = self._unconfirmed.pop(cid, None)
        if entry is None:
            return   # a resend's second confirm
        self._sent_on.pop(cid, None)
        future = entry[2]
        if not future.done():
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        self._slots.release()
        if not self._unconfirmed:
            self._drained.set()

    def _on_frame(self, key: str, frame: dict) -> None:
        op = frame.get("op")
        if op == "confirm":
            for result in frame.get("results", []):
                cid, shortfall = result.pop("cid"), result.get("durability_not_reached")
                self._resolve(cid, DurabilityNotReached(201, "durability_not_reached", shortfall["message"], result)
                              if shortfall else result)
            retry = []
            for refusal in frame.get("refused", []):
                if refusal["cid"] not in self._unconfirmed:
                    continue
                if refusal["error"] == "not_leader" and refusal.get("leader_url"):
                    self._follow(frame["queue"], refusal["leader_url"])
                    retry.append(self._unconfirmed[refusal["cid"]])
                elif refusal["error"] == UNKNOWN_OUTCOME:
                    retry.append(self._unconfirmed[refusal["cid"]])
                else:
                    self._resolve(refusal["cid"], _error(refusal))
            if retry:
                asyncio.get_running_loop().call_later(RESEND_AFTER_S, self._retry, retry)
        elif op == "failed":
            failed = self._wires[key].failed
            elsewhere = []     # sent on this stream before their queue moved to another one
            for cid, entry in list(self._unconfirmed.items()):
                if self._wire_of.get(entry[0], "") == key:
                    self._resolve(cid, failed)
                elif self._sent_on.get(cid) == key:
                    elsewhere.append(entry)
            self._retry(elsewhere)
        elif op == "error":
            log.warning("raftq stream: %s: %s", frame.get("error"), frame.get("message"))

    def _retry(self, entries: list[tuple[str, dict, asyncio.Future]]) -> None:
        by_queue: dict[str, list[dict]] = {}
        for queue, message, _ in entries:
            if message["cid"] in self._unconfirmed:
                by_queue.setdefault(queue, []).append(message)
        for queue, messages in by_queue.items():
            self._publish(queue, messages)


@dataclass
class Message:
    """A delivered message; `ack()` or `nack()` it when done (the consumer sends them in batches)."""

    seq: int
    receipt: str
    body: Any
    key: str | None
    headers: dict | None
    deliveries: int
    put_at_ms: int
    priority: int = 0
    _settle: Callable[[str, "Message", dict], None] = field(repr=False, default=None)

    def ack(self) -> None:
        self._settle("ack", self, {})

    def nack(self, delay_ms: int | None = None) -> None:
        """Give it back: ready again after `delay_ms`, or (None) as the queue's back-off policy says."""
        self._settle("nack", self, {} if delay_ms is None else {"delay_ms": delay_ms})


class Consumer:
    """Pushed messages of one (queue, group), `prefetch` unsettled at most; use in `async with`
    and `async for`."""

    def __init__(self, urls="http://127.0.0.1:8001", queue: str = "", *, group: str = "default",
                 prefetch: int = 1000, lease_ms: int | None = None, token: str | None = None,
                 ack_linger_ms: float = 1.0, retry_for: float = 15.0, cafile: str | None = None):
        self.queue, self.group, self.prefetch, self.lease_ms = queue, group, prefetch, lease_ms
        self.ack_linger_s = ack_linger_ms / 1000
        self._wire = _Wire(urls, token, cafile, retry_for, self._on_frame, self._subscribe)
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._subs = itertools.count(1)
        self._rids = itertools.count(1)
        self._sub = None
        self._subscribed = False    # the node answered "subscribed" to the current subscription
        self._pending: dict[tuple[str, tuple], list[str]] = {}   # (op, options) -> receipts to send
        self._unsettled: dict[int, dict] = {}                    # rid -> frame awaiting "settled"
        self._flush_handle: asyncio.TimerHandle | None = None
        self._settled = asyncio.Event()
        self._settled.set()
        self._error: RaftqError | Exception | None = None
        self._closed = False

    async def __aenter__(self) -> "Consumer":
        await self._wire.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __aiter__(self):
        return self

    async def __anext__(self) -> Message:
        message = await self.receive()
        if message is None:
            raise StopAsyncIteration
        return message

    async def receive(self, timeout: float | None = None) -> Message | None:
        """The next message; None after `timeout` seconds or once closed."""
        if self._error is not None:
            raise self._error
        if not self._inbox.empty():
            # what was pushed already: no timer, no task (wait_for makes both)
            item = self._inbox.get_nowait()
        else:
            try:
                item = await asyncio.wait_for(self._inbox.get(), timeout)
            except asyncio.TimeoutError:
                return None
        if isinstance(item, Exception):
            raise item
        return item

    def ack(self, message: Message) -> None:
        self._queue_settle("ack", message, {})

    def nack(self, message: Message, delay_ms: int | None = None) -> None:
        self._queue_settle("nack", message, {} if delay_ms is None else {"delay_ms": delay_ms})

    async def flush(self) -> None:
        """Send pending acks and nacks and wait until the node has settled them."""
        self._flush()
        await self._settled.wait()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._wire.failed is None:
                await self.flush()
            self._inbox.put_nowait(None)
            await self._wire.close()

    def _queue_settle(self, op: str, message: Message, options: dict) -> None:
        group = (op, tuple(sorted(options.items())) if options else ())
        self._pending.setdefault(group, []).append(message.receipt)
        self._settled.clear()
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_later(self.ack_linger_s, self._flush)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        for (op, options), receipts in self._pending.items():
            rid = next(self._rids)
            frame = {"op": op, "rid": rid, "queue": self.queue, "receipts": receipts, **dict(options)}
            self._unsettled[rid] = frame
            self._wire.send(frame)
        self._pending = {}

    def _subscribe(self) -> None:
        """On every (re)connection: a new subscription, and the settles not yet answered."""
        self._ask_subscription()
        for frame in self._unsettled.values():
            self._wire.send(frame)

    def _ask_subscription(self) -> None:
        self._sub = next(self._subs)
        self._subscribed = False
        frame = {"op": "subscribe", "sub": self._sub, "queue": self.queue, "group": self.group,
                 "prefetch": self.prefetch}
        if self.lease_ms is not None:
            frame["lease_ms"] = self.lease_ms
        self._wire.send(frame)

    def _ask_again(self, sub) -> None:
        """Subscribe anew if subscription `sub`, refused while no leader was known, is still the
        one this consumer waits for (a new connection subscribes by itself)."""
        if sub == self._sub and not self._closed:
            self._ask_subscription()

    def _done_settling(self, rid) -> None:
        self._unsettled.pop(rid, None)
        if not self._unsettled and not self._pending:
            self._settled.set()

    def _on_frame(self, frame: dict) -> None:
        op = frame.get("op")
        if op == "deliver" and frame.get("sub") == self._sub:
            for m in frame["messages"]:
                self._inbox.put_nowait(Message(m["seq"], m["receipt"], m["body"], m.get("key"), m.get("headers"),
                                               m["deliveries"], m["put_at_ms"], m.get("priority", 0),
                                               self._settle_from_message))
        elif op == "subscribed" and frame.get("sub") == self._sub:
            self._subscribed = True
        elif op == "settled":
            self._done_settling(frame.get("rid"))
        elif op == "error":
            error = _error(frame)
            if "rid" in frame and frame["rid"] in self._unsettled:
                if error.code == UNKNOWN_OUTCOME:
                    resend = self._unsettled[frame["rid"]]
                    asyncio.get_running_loop().call_later(RESEND_AFTER_S, self._wire.send, resend)
                elif error.code == "not_leader" and frame.get("leader_url"):
                    # the queue's group moved: unsettled, sent again on the connection to its leader
                    self._follow(frame["leader_url"])
                else:
                    log.warning("raftq stream: %s refused: %s", self._unsettled[frame["rid"]]["op"], error)
                    self._done_settling(frame["rid"])
            elif frame.get("sub") == self._sub and error.code == "not_leader" and frame.get("leader_url"):
                self._follow(frame["leader_url"])   # the queue's group is led there: subscribe there
            elif frame.get("sub") == self._sub and error.code == UNKNOWN_OUTCOME:
                # a subscription that runs retries by itself; one refused during an election is asked again
                if not self._subscribed:
                    asyncio.get_running_loop().call_later(RESEND_AFTER_S, self._ask_again, self._sub)
            elif frame.get("sub") == self._sub:
                self._error = error          # the subscription itself was refused: say so to the reader
                self._inbox.put_nowait(error)
        elif op == "failed":
            self._error = self._wire.failed
            self._inbox.put_nowait(self._wire.failed)

    def _follow(self, leader_url: str) -> None:
        """Connect to `leader_url`, unless the stream is already headed there (a subscription and
        the settles in flight may each be refused, naming the same leader)."""
        if self._wire.base != leader_url.rstrip("/"):
            self._wire.redirect(leader_url)

    def _settle_from_message(self, op: str, message: Message, options: dict) -> None:
        self._queue_settle(op, message, options)


class BlockingConsumer:
    """A Consumer for code without asyncio: a plain iterator; its event loop runs in a thread."""

    def __init__(self, *args, **kwargs):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="raftq-consumer", daemon=True)
        self._thread.start()
        self._consumer = self._call(self._make(args, kwargs))

    async def _make(self, args, kwargs) -> Consumer:
        consumer = Consumer(*args, **kwargs)
        await consumer._wire.start()
        return consumer

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> "BlockingConsumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self):
        return self

    def __next__(self) -> Message:
        message = self.receive()
        if message is None:
            raise StopIteration
        return message

    def receive(self, timeout: float | None = None) -> Message | None:
        message = self._call(self._consumer.receive(timeout))
        if message is not None:
            message._settle = self._settle_threadsafe
        return message

    def ack(self, message: Message) -> None:
        self._loop.call_soon_threadsafe(self._consumer.ack, message)

    def nack(self, message: Message, delay_ms: int | None = None) -> None:
        self._loop.call_soon_threadsafe(self._consumer.nack, message, delay_ms)

    def _settle_threadsafe(self, op: str, message: Message, options: dict) -> None:
        self._loop.call_soon_threadsafe(self._consumer._queue_settle, op, message, options)

    def flush(self) -> None:
        self._call(self._consumer.flush())

    def close(self) -> None:
        if self._loop.is_running():
            self._call(self._consumer.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

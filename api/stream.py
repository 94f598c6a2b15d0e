"""The streaming wire: `GET /v1/stream`, a WebSocket of CBOR frames (docs/stream.md).

Theory of operation
-------------------
One connection carries publishes with a confirm per message and any number of
subscriptions with credit. It is a thin handler over the same node face as
the HTTP routes — commands go through `commands.apply` into the group
committer, waiting receives through `commands.receive_waiting` — so its semantics are the
HTTP API's: idempotency ids, keys, durability levels, leases and receipts.
What it saves is a request per message: many messages ride in one frame, many
frames (from many connections) share one log entry, and deliveries are
pushed instead of polled.

- Only the leader serves. Every connection opens with a `hello` frame from
  the node; a follower's names the leader's URL and the node closes with
  4307. A leader that loses the lead sends `redirect` and closes likewise;
  the client reconnects and resends what was not confirmed, with the same
  ids, so nothing is stored twice. With several Raft groups (issue 24) a
  node leads some groups, not the cluster. A client that connects with
  `?route=group` routes by group: to it every node says hello as a leader,
  serves each frame from its queue's group when it leads that group, and
  refuses a frame for a group it does not lead with `not_leader` and that
  leader's `leader_url`, where the client sends that queue's frames. A
  group whose leadership this node loses while a frame of it is applied
  refuses that frame `no_quorum` (outcome unknown: resent with the same ids)
  and the connection goes on serving the other groups: ending it would drop
  every group's frames in flight and send the client to group 0's leader. To any
  other client "the leader" is group 0's, as the hello says; it too gets
  such refusals for queues of the groups that node does not lead.
- Everything a connection makes the node hold is bounded in frames and
  bytes: the frames being applied (MAX_FRAMES_IN_FLIGHT, MAX_BYTES_IN_FLIGHT)
  and the outbox of frames not yet written (MAX_OUTBOX_FRAMES,
  MAX_OUTBOX_BYTES). Whatever would add to a full one waits — the reader
  does not read the next frame, a subscription does not lease — so a client
  that sends without reading is slowed by TCP, not buffered for. This is the
  producer's back-pressure besides its own window. A client that takes
  nothing of a waiting frame for ``--stream-write-stall-s`` is dropped.
- MAX_BAD_FRAMES_IN_A_ROW malformed frames (each answered 400) in a row close
  the connection with 1008: a client that only earns errors costs no more.
- A subscription holds at most `prefetch` messages leased to this
  connection and not yet settled; an ack or nack of one (stale or not) or the
  end of its lease gives its credit back.
- Every frame is checked against the connection's principal as the node knows
  it at that moment (api/principals.py): a publish needs ``put`` on its queue, a
  subscribe, ack, nack or extend ``receive``, and a subscription asks again
  before each lease. A principal revoked (or whose token was replaced) while
  its connection is open gets an ``unauthorized`` error frame and the
  connection is closed; one whose rules no longer allow a frame gets a 403
  for it. The connection counts toward the principal's connections quota,
  its subscriptions toward its long polls.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

import cbor2
from aiohttp import WSMsgType, web

from raftq.engine.outcome import Committed
from raftq.statemachine import check_command
from raftq.statemachine.rules import PUT, RECEIVE
from raftq.statemachine.validation import MAX_RECEIVE, is_int

from .bounded import check_cbor
from .errors import ApiError, from_result
from .commands import apply, leader_read, receive_waiting
from .connections import held_connection
from .keys import GROUPS, NODE, SETTINGS
from .leader import Elsewhere, serve_here, serving_group
from .messages import DURABILITY, checked_message, reach_durability
from .principals import PRINCIPAL, PRINCIPALS, Principal, denial, forbidden
from .receipts import Opened
from .routing import checked_name

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 16 << 20
MAX_FRAMES_IN_FLIGHT = 256
MAX_BYTES_IN_FLIGHT = 64 << 20
MAX_OUTBOX_FRAMES = 1024
MAX_OUTBOX_BYTES = 16 << 20
MAX_BAD_FRAMES_IN_A_ROW = 100
MAX_PREFETCH = 10_000
CLOSE_NOT_LEADER = 4307
CLOSE_PROTOCOL_ERROR = 4400
CLOSE_POLICY = 1008
CLOSE_REVOKED = 4401
CLOSE_TIMEOUT_S = 5.0   # a client that reads nothing cannot hold a closing connection longer
SETTLE_OPS = {"ack": "acked", "nack": "nacked", "extend": "extended"}
ANSWERS = {"confirm", "settled", "subscribed", "unsubscribed"}   # a frame served: the bad ones' run ends
IDLE_RECHECK_S = 1.0    # a subscription re-reads readiness at least this often


def _leader_url(request: web.Request) -> str | None:
    node = request.app[NODE]
    address = node.http_addr(node.view()["leader_id"])
    return None if address is None else f"{request.scheme}://{address}"


async def stream(request: web.Request) -> web.WebSocketResponse:
    async with held_connection(request.app, request.get(PRINCIPAL)):   # 429 before the upgrade
        ws = web.WebSocketResponse(max_msg_size=MAX_FRAME_BYTES, heartbeat=20, compress=False)
        await ws.prepare(request)
        session = Session(request, ws)
        try:
            await session.run()
        finally:
            await session.close()
        return ws


class Revoked(Exception):
    """The connection's principal is no longer one this node takes."""


class LeadershipLost(Exception):
    """This node no longer leads: the connection goes to the leader."""


class Budget:
    """Frames and bytes a connection may have the node hold at once."""

    def __init__(self, frames: int, nbytes: int):
        self.max_frames, self.max_bytes = frames, nbytes
        self.frames = self.bytes = 0
        self._room = asyncio.Event()
        self._room.set()

    def spent(self) -> bool:
        return self.frames >= self.max_frames or self.bytes >= self.max_bytes

    async def room(self) -> None:
        """Return once the budget is not spent."""
        while self.spent():
            self._room.clear()
            await self._room.wait()

    async def take(self, size: int) -> None:
        """Hold one frame of `size` bytes once there is room: so at most one
        frame beyond the budget's bytes is ever held."""
        await self.room()
        self.take_now(size)

    def take_now(self, size: int) -> None:
        self.frames += 1
        self.bytes += size

    def give(self, size: int) -> None:
        self.frames -= 1
        self.bytes -= size
        if not self.spent():
            self._room.set()


class Outbox:
    """Encoded frames waiting for the writer, within a Budget."""

    def __init__(self):
        self.budget = Budget(MAX_OUTBOX_FRAMES, MAX_OUTBOX_BYTES)
        self._frames: collections.deque[bytes | None] = collections.deque()
        self._ready = asyncio.Event()

    async def put(self, frame: bytes) -> None:
        await self.budget.take(len(frame))
        self._append(frame)

    def put_last(self, frame: bytes | None) -> None:
        """A frame that ends the connection (None: the end itself), queued
        even when the budget is spent: a few per connection, at its end."""
        self.budget.take_now(len(frame or b""))
        self._append(frame)

    def _append(self, frame: bytes | None) -> None:
        self._frames.append(frame)
        self._ready.set()

    async def get(self) -> bytes | None:
        while not self._frames:
            self._ready.clear()
            await self._ready.wait()
        frame = self._frames.popleft()
        self.budget.give(len(frame or b""))
        return frame


class Session:
    def __init__(self, request: web.Request, ws: web.WebSocketResponse):
        self.request = request
        self.app = request.app
        self.node = request.app[NODE]
        self.ws = ws
        self.outbox = Outbox()
        self.in_flight = Budget(MAX_FRAMES_IN_FLIGHT, MAX_BYTES_IN_FLIGHT)
        self.bad_frames_in_a_row = 0
        self.writing = False       # the writer waits for the client to take a frame
        self.frames_written = 0
        self.tasks: set[asyncio.Task] = set()
        self.subscriptions: dict[object, Subscription] = {}
        self.receipts: dict[str, Subscription] = {}   # unsettled deliveries of this connection
        self.leaving = asyncio.Event()
        self.revoked = asyncio.Event()
        # Each frame is served by its queue's group: one group losing its leader is that group's
        # frames' concern (refused, the client resends them), not the whole connection's.
        self.routes_by_group = self.app[GROUPS].count > 1 and request.query.get("route") == "group"
        self.opened_by: Principal | None = request.get(PRINCIPAL)   # None: a node without tokens

    # ---- the connection ------------------------------------------------------------------------
    async def run(self) -> None:
        status = self.node.view()
        leads = self.routes_by_group or (status["role"] == "leader" and status["quorum_ok"])
        await self.ws.send_bytes(cbor2.dumps({
            "op": "hello", "version": PROTOCOL_VERSION, "node": self.node.id, "leader": leads,
            "leader_url": _leader_url(self.request), "max_frame_bytes": MAX_FRAME_BYTES,
            "max_prefetch": MAX_PREFETCH}))
        if not leads:
            await self._close(CLOSE_NOT_LEADER, b"not the leader")
            return
        writer = asyncio.create_task(self._write())
        watchdog = asyncio.create_task(self._watch_writes())
        reader = asyncio.create_task(self._read())
        leaving = asyncio.create_task(self.leaving.wait())
        revoked = asyncio.create_task(self.revoked.wait())
        watcher = asyncio.create_task(self._watch_principal())
        await asyncio.wait({reader, leaving, revoked, writer, watchdog}, return_when=asyncio.FIRST_COMPLETED)
        if self.revoked.is_set() and not self.ws.closed:
            self.outbox.put_last(cbor2.dumps(self._revocation()))
        elif self.leaving.is_set() and not self.ws.closed:
            self.outbox.put_last(cbor2.dumps({"op": "redirect", "leader_url": _leader_url(self.request)}))
        reader.cancel()
        leaving.cancel()
        revoked.cancel()
        watcher.cancel()
        for task in list(self.tasks):
            task.cancel()
        self.outbox.put_last(None)
        # A client that reads nothing keeps the writer waiting for room in
        # its socket: it is given CLOSE_TIMEOUT_S, then dropped.
        await asyncio.wait({writer}, timeout=CLOSE_TIMEOUT_S)
        writer.cancel()
        watchdog.cancel()
        await asyncio.gather(writer, watchdog, return_exceptions=True)
        await self._close(CLOSE_REVOKED if self.revoked.is_set() else CLOSE_NOT_LEADER if self.leaving.is_set()
                          else 1000)

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _close(self, code: int, message: bytes = b"") -> None:
        """Close with `code`; without the client's answer within CLOSE_TIMEOUT_S, drop the connection."""
        if self.ws.closed:
            return
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.ws.close(code=code, message=message)
        except TimeoutError:
            self._drop()

    def _drop(self) -> None:
        """End the connection now. (A transport's close waits until the client
        has read what is buffered for it: one that reads nothing would keep
        the connection, and this session, forever.)"""
        transport = self.request.transport
        if transport is not None:
            transport.abort()

    async def send(self, frame: dict | bytes) -> None:
        """Queue a frame (a map, or one already encoded), once the outbox has room."""
        if isinstance(frame, dict):
            if frame["op"] in ANSWERS:
                self.bad_frames_in_a_row = 0
            elif frame["op"] == "error" and frame["error"] == "bad_request":
                self.bad_frames_in_a_row += 1
            frame = cbor2.dumps(frame)
        await self.outbox.put(frame)

    async def _write(self) -> None:
        while True:
            frame = await self.outbox.get()
            if frame is None or self.ws.closed:
                return
            self.writing = True
            await self.ws.send_bytes(frame)
            self.writing = False
            self.frames_written += 1

    async def _watch_writes(self) -> None:
        """Drop the connection when, while a frame waits to be written, the
        client takes nothing for --stream-write-stall-s: neither a frame is finished nor
        the bytes buffered for it go down (a large frame to a slow reader is
        no stall)."""
        stall_s = self.app[SETTINGS].limits.stream_write_stall_s
        seen, progressed = None, time.monotonic()
        while True:
            await asyncio.sleep(stall_s / 6)
            transport = self.request.transport
            buffered = transport.get_write_buffer_size() if transport is not None else 0
            if not self.writing or seen is None or self.frames_written != seen[0] or buffered < seen[1]:
                seen, progressed = (self.frames_written, buffered), time.monotonic()
            elif time.monotonic() - progressed >= stall_s:
                self._drop()
                return

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != WSMsgType.BINARY:
                if msg.type == WSMsgType.TEXT:
                    await self._protocol_error("frames are binary CBOR, not text")
                return
            try:
                check_cbor(msg.data)          # measured before it is built (bounded.py)
                frame = cbor2.loads(msg.data)
            except ApiError as exc:
                await self._protocol_error(exc.message)
                return
            except Exception as exc:
                await self._protocol_error(f"a frame is not valid CBOR: {exc}")
                return
            # Sending an answer waits for room in the outbox, so the next
            # frame is not read before the client has read enough.
            try:
                await self._dispatch(frame, len(msg.data))
            except Revoked:
                self.revoked.set()
                return
            if self.bad_frames_in_a_row >= MAX_BAD_FRAMES_IN_A_ROW:
                await self._end(CLOSE_POLICY, f"{MAX_BAD_FRAMES_IN_A_ROW} malformed frames in a row")
                return

    async def _protocol_error(self, message: str) -> None:
        await self._end(CLOSE_PROTOCOL_ERROR, message, b"protocol error")

    async def _end(self, code: int, message: str, reason: bytes | None = None) -> None:
        """Send an error frame after what is queued, then close with `code`."""
        self.outbox.put_last(cbor2.dumps({"op": "error", "error": "bad_request", "status": 400,
                                          "message": message}))
        self.outbox.put_last(None)
        await asyncio.sleep(0)   # let the writer send the error first
        await self._close(code, message.encode() if reason is None else reason)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and isinstance(task.exception(), LeadershipLost):
            self.leaving.set()
        elif not task.cancelled() and isinstance(task.exception(), Revoked):
            self.revoked.set()
        elif not task.cancelled() and task.exception() is not None:
            log.error("stream task failed", exc_info=task.exception())

    # ---- who sends the frames ---------------------------------------------------------------------------
    def principal(self) -> Principal | None:
        """The connection's principal as this node knows it now; Revoked when it no longer takes it."""
        if self.opened_by is None:
            return None
        current = self.app[PRINCIPALS].current(self.opened_by)
        if current is None:
            raise Revoked()
        return current

    async def _watch_principal(self) -> None:
        """Close the connection as soon as its principal is revoked, frames or not."""
        while self.opened_by is not None and self.opened_by.kept:
            await self.app[PRINCIPALS].next_change()
            try:
                self.principal()
            except Revoked:
                self.revoked.set()
                return

    def _revocation(self) -> dict:
        return {"op": "error", "error": "unauthorized", "status": 401,
                "message": f"principal {self.opened_by.name!r} was revoked or given a new token: "
                           "connect again with a valid one"}

    def authorize(self, action: str, queue: str) -> Principal | None:
        """The current principal, when it may `action` on `queue`; else Revoked or 403 forbidden."""
        principal = self.principal()
        if principal is not None and denial(self.app, self.request, principal, action, [queue]) is not None:
            raise forbidden(principal, action, queue)
        return principal

    # ---- frames ------------------------------------------------------------------------------------------
    async def _dispatch(self, frame, size: int) -> None:
        try:
            self.principal()
        except Revoked:
            self.revoked.set()
            return
        op = frame.get("op") if isinstance(frame, dict) else None
        if op == "publish" or op in SETTLE_OPS:
            await self.in_flight.take(size)
            task = self._spawn(self._publish(frame) if op == "publish" else self._settle(op, frame))
            task.add_done_callback(lambda _: self.in_flight.give(size))
        elif op == "subscribe":
            await self._subscribe(frame)
        elif op == "unsubscribe":
            sub = self.subscriptions.pop(frame.get("sub"), None)
            if sub is not None:
                sub.task.cancel()
            await self.send({"op": "unsubscribed", "sub": frame.get("sub")})
        else:
            await self.send({"op": "error", "error": "bad_request", "status": 400,
                             "message": "a frame is a map whose op is publish, subscribe, unsubscribe, "
                                        "ack, nack or extend"})

    async def _group(self, queue: str, *, creating: bool = False) -> int:
        """The Raft group of `queue`, which this node leads; else ApiError not_leader naming the
        group's leader. With one group the connection was opened on its leader: there is nothing
        to choose."""
        if self.app[GROUPS].count == 1:
            return 0
        try:
            return await serving_group(self.app, [queue], creating=creating,
                                       authorization=self.request.headers.get("Authorization"),
                                       principal=self.principal())
        except Elsewhere as there:
            raise self._not_leader(there, queue) from None

    def _not_leader(self, there: Elsewhere, queue: str) -> ApiError:
        return ApiError("not_leader", f"node {there.node_id} leads the group of queue {queue!r}; send its "
                                      "frames there", leader=there.node_id,
                        leader_url=f"{self.request.scheme}://{there.address}")

    async def _apply(self, group: int, command: dict) -> Committed:
        """The command's result (refusals included) and index. When it cannot be known here because
        the group's leadership was lost: on a connection routed by group, ApiError no_quorum (an
        unknown outcome: the client resends the frame, with the same ids, and is sent on to the new
        leader), so the frames of the groups this node still leads go on; otherwise LeadershipLost."""
        if self.routes_by_group:
            return await apply(self.app, group, command, self.principal())
        return await self._leading(group, apply(self.app, group, command, self.principal()))

    async def _receive(self, group: int, command: dict) -> Committed | None:
        """A receive waiting up to IDLE_RECHECK_S; None when nothing came meanwhile. A receive
        that was applied is handed out even if the group's leadership went meanwhile: its leases
        are in the log. When nothing came because this node no longer leads the group:
        LeadershipLost, or on a connection routed by group, where the other groups' subscriptions
        go on, ApiError not_leader naming the group's new leader (no_quorum while none is known)."""
        try:
            committed = await receive_waiting(self.app, group, command, IDLE_RECHECK_S, last_try=False,
                                              encoded=True, client=self.request.remote,
                                              principal=self.authorize(RECEIVE, command["queue"]))
        except ApiError as exc:
            if exc.code != "no_quorum" or self._leads(group):
                raise
            committed = None
        if committed is None:
            await self._still_leads(group, command["queue"])
        return committed

    def _leads(self, group: int) -> bool:
        return self.app[GROUPS].engines[group].view()["role"] == "leader"

    async def _still_leads(self, group: int, queue: str) -> None:
        """Return while this node leads `group` (or leads it again after an election); else
        LeadershipLost, or on a connection routed by group, where the other groups' frames and
        subscriptions go on, ApiError not_leader naming the group's new leader for `queue`'s
        frames (no_quorum while none is known)."""
        if self._leads(group):
            return
        if not self.routes_by_group:
            raise LeadershipLost()
        try:
            await serve_here(self.app, group)     # waits for an election under way
        except Elsewhere as there:
            raise self._not_leader(there, queue) from None

    async def _leading(self, group: int, call):
        try:
            return await call
        except ApiError as exc:
            if exc.code == "no_quorum" and not self._leads(group):
                raise LeadershipLost() from None
            raise

    async def _publish(self, frame: dict) -> None:
        messages = frame.get("messages")
        cids = [m.get("cid") if isinstance(m, dict) else None for m in messages] \
            if isinstance(messages, list) else []
        try:
            queue = checked_name(frame.get("queue"), "queue")
            durability = frame.get("durability", "quorum")
            if durability not in DURABILITY:
                raise ApiError("bad_request", "durability must be quorum, all or leader")
            if not cids or not all(is_int(c) for c in cids):
                raise ApiError("bad_request", "messages must be a non-empty list of maps, each with an integer cid")
            self.authorize(PUT, queue)
        except ApiError as exc:
            await self.send({"op": "confirm", "queue": frame.get("queue"), "results": [],
                             "refused": [_refusal(c, exc) for c in cids if is_int(c)]}
                            if any(is_int(c) for c in cids)
                            else {"op": "error", "error": exc.code, "status": exc.status, "message": exc.message})
            return
        # Each message is checked on its own (checked_message: the rules of a
        # put's message), so that one malformed message is refused alone; the
        # queue name, the put's only other rule, was checked above.
        accepted, accepted_cids, refused = [], [], []
        limit = self.app[SETTINGS].max_message_bytes
        for index, raw in enumerate(messages):
            cid = raw.pop("cid")
            try:
                message = checked_message(raw, index, limit)
            except ApiError as exc:
                refused.append(_refusal(cid, exc))
                continue
            accepted.append(message)
            accepted_cids.append(cid)
        results = []
        if accepted:
            try:
                group = await self._group(queue, creating=self.node.auto_create)
                committed = await self._apply(group, {"op": "put", "queue": queue, "messages": accepted,
                                                      "auto_create": self.node.auto_create})
                result = committed.result
                if "error" in result:
                    raise from_result(result)
                given, shortfall = await reach_durability(self.app, group, durability, committed.index)
            except ApiError as exc:
                refused.extend(_refusal(cid, exc) for cid in accepted_cids)
            else:
                # the state machine's results (seq, duplicate, replaced_seq),
                # completed in place: one dict per message is built, not two
                results = result["messages"]
                for cid, m in zip(accepted_cids, results):
                    m["cid"] = cid
                    m["durability"] = given
                    if shortfall:
                        m["durability_not_reached"] = shortfall
        await self.send({"op": "confirm", "queue": queue, "results": results, "refused": refused})

    async def _settle(self, op: str, frame: dict) -> None:
        rid = frame.get("rid")
        receipts = frame.get("receipts")
        try:
            queue = checked_name(frame.get("queue"), "queue")
            if not isinstance(receipts, list) or not receipts or not all(isinstance(r, str) for r in receipts):
                raise ApiError("bad_request", "receipts must be a non-empty list of strings")
            command = {"op": op, "queue": queue, "receipts": receipts}
            for field in ("delay_ms", "lease_ms"):
                if frame.get(field) is not None:
                    command[field] = frame[field]
            problem = check_command({**command, "now_ms": 0})
            if problem:
                raise from_result(problem)
            self.authorize(RECEIVE, queue)
            group = await self._group(queue)
            opened = Opened(self.app)
            result = (await self._apply(group, {**command, "receipts": opened.open(queue, receipts)})).result
        except ApiError as exc:
            await self.send({"op": "error", "rid": rid, "error": exc.code, "status": exc.status,
                             "message": exc.message, **exc.details})
            return
        if result.get("error") == "stale_receipt":
            result = {SETTLE_OPS[op]: 0, "stale": opened.given(result.get("stale", []))}
        elif "stale" in result:
            result["stale"] = opened.given(result["stale"])
        elif "error" in result:
            refusal = from_result(result)
            await self.send({"op": "error", "rid": rid, "error": refusal.code, "status": refusal.status,
                             "message": refusal.message})
            return
        if op == "extend":
            for receipt in receipts:
                sub = self.receipts.get(receipt)
                if sub is not None:
                    sub.extended(receipt, command.get("lease_ms"))
        else:
            # Settled or stale, the lease is no longer this connection's.
            for receipt in receipts:
                sub = self.receipts.pop(receipt, None)
                if sub is not None:
                    sub.settled(receipt)
        await self.send({"op": "settled", "rid": rid, **result})

    async def _subscribe(self, frame: dict) -> None:
        sub_id = frame.get("sub")
        try:
            if sub_id is None or sub_id in self.subscriptions:
                raise ApiError("bad_request", "a subscription needs a 'sub' id not already in use")
            cap = self.app[SETTINGS].limits.max_subscriptions_per_connection
            if len(self.subscriptions) >= cap:
                raise ApiError("limit_reached", f"this connection has {cap} subscriptions "
                                                "(--max-subscriptions-per-connection); unsubscribe one first")
            queue = checked_name(frame.get("queue"), "queue")
            group = checked_name(frame.get("group", "default"), "group")
            prefetch = frame.get("prefetch", 100)
            if not is_int(prefetch) or not 1 <= prefetch <= MAX_PREFETCH:
                raise ApiError("bad_request", f"prefetch must be an integer from 1 to {MAX_PREFETCH}")
            lease_ms = frame.get("lease_ms")
            if lease_ms is not None and (not is_int(lease_ms) or not 1 <= lease_ms <= 1 << 40):
                raise ApiError("bad_request", "lease_ms must be a positive integer")
            self.authorize(RECEIVE, queue)
            group_of_queue = await self._group(queue)
            info = await leader_read(self.app, group_of_queue, "queue_info", queue)
            if "error" in info:
                raise from_result(info)
            if group not in info["stats"]["groups"]:
                raise ApiError("not_found", f"group {group!r} does not exist in queue {queue!r}")
        except ApiError as exc:
            await self.send({"op": "error", "sub": sub_id, "error": exc.code, "status": exc.status,
                             "message": exc.message, **exc.details})
            return
        sub = Subscription(self, sub_id, group_of_queue, queue, group, prefetch,
                           lease_ms or info["config"]["lease_ms"])
        self.subscriptions[sub_id] = sub
        sub.task = self._spawn(sub.run())
        await self.send({"op": "subscribed", "sub": sub_id})


# {"op": "deliver", "sub": ..., "messages": [...]}, put together from its
# encoded parts: a CBOR map is its header and its keys and values in a row.
DELIVER_HEAD = b"\xa3" + cbor2.dumps("op") + cbor2.dumps("deliver") + cbor2.dumps("sub")
MESSAGES_KEY = cbor2.dumps("messages")


def _deliver_frame(sub_id, encoded_messages: bytes) -> bytes:
    return DELIVER_HEAD + cbor2.dumps(sub_id) + MESSAGES_KEY + encoded_messages


def _refusal(cid, exc: ApiError) -> dict:
    return {"cid": cid, "error": exc.code, "status": exc.status, "message": exc.message, **exc.details}


class Subscription:
    """Pushes a group's ready messages to one connection, `prefetch` unsettled at most."""

    def __init__(self, session: Session, sub_id, raft_group: int, queue: str, group: str, prefetch: int,
                 lease_ms: int):
        self.session = session
        self.id = sub_id
        self.raft_group = raft_group
        self.queue = queue
        self.group = group
        self.prefetch = prefetch
        self.lease_ms = lease_ms
        self.leases: dict[str, float] = {}   # receipt -> when its lease ends (monotonic)
        self.credit = asyncio.Event()
        self.task: asyncio.Task | None = None

    def settled(self, receipt: str) -> None:
        if self.leases.pop(receipt, None) is not None:
            self.credit.set()

    def extended(self, receipt: str, lease_ms: int | None) -> None:
        if receipt in self.leases:
            self.leases[receipt] = time.monotonic() + (lease_ms or self.lease_ms) / 1000

    async def _refused(self, exc: ApiError) -> bool:
        """Tell the client why the subscription could not lease; whether that ends it (its group is
        led elsewhere now: the client subscribes there), else wait before it tries again."""
        await self.session.send({"op": "error", "sub": self.id, "error": exc.code, "status": exc.status,
                                 "message": exc.message, **exc.details})
        if exc.code in ("not_leader", "forbidden"):    # led elsewhere now, or no longer allowed
            self._end()
            return True
        await asyncio.sleep(IDLE_RECHECK_S)
        return False

    def _end(self) -> None:
        """The subscription is over; its leases run their course, no longer this connection's."""
        self.session.subscriptions.pop(self.id, None)
        for receipt in self.leases:
            self.session.receipts.pop(receipt, None)

    def _free(self) -> int:
        now = time.monotonic()
        for receipt in [r for r, ends in self.leases.items() if ends <= now]:
            del self.leases[receipt]            # its lease ended: the message is someone else's now
            self.session.receipts.pop(receipt, None)
        return self.prefetch - len(self.leases)

    async def run(self) -> None:
        session = self.session
        # Credit is spent in batches of at least a quarter of what one receive
        # may take (or of what is unsettled): each receive is a command in the
        # log, and a receive per returned ack would lease a few messages per
        # entry while the consumer still holds most of its prefetch.
        batch = max(1, min(self.prefetch, MAX_RECEIVE) // 4)
        while True:
            free = self._free()
            if free <= 0 or (free < batch and self.leases):
                self.credit.clear()
                # woken at least every IDLE_RECHECK_S: a group led elsewhere meanwhile is noticed
                # while its leases, whose acks now go to the new leader, run their course
                next_end = min(min(self.leases.values()) - time.monotonic(), IDLE_RECHECK_S)
                try:
                    await asyncio.wait_for(self.credit.wait(), max(0.001, next_end))
                except asyncio.TimeoutError:
                    try:
                        await session._still_leads(self.raft_group, self.queue)
                    except ApiError as exc:
                        if await self._refused(exc):
                            return
                continue
            # Nothing is leased while the client is not reading what it was sent.
            await session.outbox.budget.room()
            # The engine waits for a ready message and leases it in one call;
            # one message wakes one waiting receive, of a subscription or not.
            command = {"op": "receive", "queue": self.queue, "group": self.group,
                       "max": min(free, MAX_RECEIVE), "lease_ms": self.lease_ms}
            try:
                committed = await session._receive(self.raft_group, command)
            except ApiError as exc:
                if await self._refused(exc):
                    return
                continue
            if committed is None:
                continue
            result = committed.result
            if "error" in result:     # the queue or group was deleted: the subscription ends
                refusal = from_result(result)
                await session.send({"op": "error", "sub": self.id, "error": refusal.code,
                                    "status": refusal.status, "message": refusal.message})
                self._end()
                return
            ends = time.monotonic() + self.lease_ms / 1000
            receipts = result["receipts"]
            for receipt in receipts:
                self.leases[receipt] = ends
                session.receipts[receipt] = self
            if receipts:
                await session.send(_deliver_frame(self.id, result["encoded"]))

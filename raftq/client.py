"""Python clients for raftq: `Client` (blocking) and `AsyncClient` (asyncio).

Both speak the HTTP API of docs/api.md and behave the same way:

- they follow 307 redirects to the leader and remember it; with several
  Raft groups (issue 24) they keep the cluster's routing (GET
  /v1/cluster/routing: queue -> group, for good, and each group's leader),
  send a queue's calls to its group's leader, and ask the routing again
  (at most once a second) when a queue's group or its leader is unknown:
  a 307 names the new leader, a failure forgets the old one;
- on a failover (503 ``no_quorum``, a refused or dropped connection, a
  timeout) they retry against the next node, with backoff, for up to
  ``retry_for`` seconds — but only calls that are safe to repeat: reads,
  acks, and puts, to which they give every message an idempotency ``id``
  (kept across retries) so a retried put is stored exactly once.  A refused
  connection never reached a node, so any call moves on to the next one;
- message bodies may be ``bytes`` (sent as ``body_b64``, or as CBOR byte
  strings with ``cbor=True``) or JSON data, and come back the same way.

The request/response shapes live once, in ``_Calls``; the two classes differ
only in how they carry a request. ``Producer``, ``Consumer`` and
``BlockingConsumer`` (raftq/stream_client.py) speak the streaming wire and
are importable from here too.
"""

import asyncio
import http.client
import socket
import time
import uuid
from urllib.parse import quote, urlsplit

import aiohttp
from yarl import URL

from raftq.wire_format import with_body_b64

from .failover import DurabilityNotReached, Failover, RaftqError, backoff_delays
from .stream_client import BlockingConsumer, Consumer, Message, Producer

__all__ = ["Client", "AsyncClient", "Producer", "Consumer", "BlockingConsumer", "Message", "RaftqError",
           "DurabilityNotReached"]   # one door for every client

RETRYABLE_STATUS = {503}
# Which replica state a `consistency=any` read saw (docs/api.md).
APPLIED_INDEX_HEADER = "X-Raftq-Applied-Index"
GROUP_HEADER = "X-Raftq-Group"       # a 307's: the Raft group of the call's queue
# A redirect answers a redirect only while leadership moves; more than this is a loop.
MAX_REDIRECTS = 8
ROUTING_PATH = "/v1/cluster/routing"


def _part(name: str) -> str:
    """A name as one URL path segment or query value: quoted, so that whatever it holds reaches
    the server, whose one naming rule then answers (400 bad_request for a name it refuses)."""
    quoted = quote(str(name), safe="")
    # "." and ".." as a whole segment would be collapsed by the path's normalisation
    return quoted if quoted.strip(".") else quoted.replace(".", "%2E")


def _leader_read(queue: str, consistency: str) -> str | None:
    """The queue whose group's leader a read goes to; None for consistency=any, which the node
    the caller chose answers from its own replica."""
    return None if consistency == "any" else queue


def _wire_message(message) -> dict:
    if not isinstance(message, dict):
        message = {"body": message}
    message = with_body_b64(message)
    return message if "id" in message else {**message, "id": uuid.uuid4().hex}


class _Calls:
    """Every API call as (method, path, body, safe to retry)."""

    def _message_out(self, message: dict) -> dict:
        """A message as sent: a byte body as body_b64 in JSON, as it is in CBOR."""
        return message if self._route.cbor else with_body_b64(message)

    def put(self, queue: str, body=None, *, key=None, id=None, headers=None, ttl_ms=None,
            delay_ms=None, priority=None, durability: str | None = None):
        message = {"body": body}
        for field, value in (("key", key), ("id", id), ("headers", headers), ("ttl_ms", ttl_ms),
                             ("delay_ms", delay_ms), ("priority", priority)):
            if value is not None:
                message[field] = value
        return self.put_batch(queue, [message], durability=durability)

    def put_batch(self, queue: str, messages: list, *, durability: str | None = None):
        """All or nothing; each message a body or a dict with body/key/id/headers/ttl_ms/delay_ms/priority."""
        query = f"?durability={durability}" if durability else ""
        return self._call("POST", f"/v1/queues/{_part(queue)}/messages{query}",
                          {"messages": [_wire_message(m) for m in messages]}, retry=True, queue=queue)

    def receive(self, queue: str, *, group: str = "default", max: int = 1, wait_ms: int = 0,
                lease_ms: int | None = None):
        body = {"group": group, "max": max, "wait_ms": wait_ms}
        if lease_ms is not None:
            body["lease_ms"] = lease_ms
        # Retried like the rest: if a lost answer had leased messages, nobody
        # holds them; their lease expires and they are delivered again.
        return self._call("POST", f"/v1/queues/{_part(queue)}/receive", body, retry=True,
                          timeout=wait_ms / 1000 + 10, queue=queue)

    def ack(self, queue: str, receipts: list):
        return self._call("POST", f"/v1/queues/{_part(queue)}/ack", {"receipts": list(receipts)}, retry=True,
                          queue=queue)

    def nack(self, queue: str, receipts: list, *, delay_ms: int | None = None):
        body = {"receipts": list(receipts)}
        if delay_ms is not None:
            body["delay_ms"] = delay_ms
        return self._call("POST", f"/v1/queues/{_part(queue)}/nack", body, retry=True, queue=queue)

    def extend(self, queue: str, receipts: list, *, lease_ms: int | None = None):
        body = {"receipts": list(receipts)}
        if lease_ms is not None:
            body["lease_ms"] = lease_ms
        return self._call("POST", f"/v1/queues/{_part(queue)}/extend", body, retry=True, queue=queue)

    def create_queue(self, queue: str, **config):
        return self._call("PUT", f"/v1/queues/{_part(queue)}", config, retry=True, queue=queue)

    def patch_queue(self, queue: str, **config):
        return self._call("PATCH", f"/v1/queues/{_part(queue)}", config, retry=True, queue=queue)

    def delete_queue(self, queue: str):
        return self._call("DELETE", f"/v1/queues/{_part(queue)}", None, retry=True, queue=queue)

    def queues(self, *, consistency: str = "leader"):
        return self._call("GET", f"/v1/queues?consistency={consistency}", None, retry=True)

    def queue(self, queue: str, *, consistency: str = "leader"):
        return self._call("GET", f"/v1/queues/{_part(queue)}?consistency={consistency}", None, retry=True,
                          queue=_leader_read(queue, consistency))

    def add_group(self, queue: str, group: str, *, start: str | dict = "earliest"):
        """`start`: "earliest", "latest", {"seq": n} or {"time_ms": t} (docs/api.md)."""
        return self._call("PUT", f"/v1/queues/{_part(queue)}/groups/{_part(group)}", {"start": start}, retry=True,
                          queue=queue)

    def seek_group(self, queue: str, group: str, to: str | dict):
        """Move the group to `to` ("earliest", "latest", {"seq": n}, {"time_ms": t}): it replays the
        stored messages from there, retained ones too."""
        return self._call("POST", f"/v1/queues/{_part(queue)}/groups/{_part(group)}/seek", {"to": to},
                          retry=True, queue=queue)

    def pause_group(self, queue: str, group: str, *, for_ms: int | None = None, until_ms: int | None = None):
        """Hand the group nothing, for `for_ms`, until log time `until_ms`, or (neither) until resumed."""
        body = {"paused": True}
        for field, value in (("for_ms", for_ms), ("until_ms", until_ms)):
            if value is not None:
                body[field] = value
        return self._patch_group(queue, group, body)

    def resume_group(self, queue: str, group: str):
        return self._patch_group(queue, group, {"paused": False})

    def limit_group_rate(self, queue: str, group: str, rate_limit: int | None):
        """At most `rate_limit` deliveries a second to the group (None: no limit)."""
        return self._patch_group(queue, group, {"rate_limit": rate_limit})

    def _patch_group(self, queue: str, group: str, body: dict):
        return self._call("PATCH", f"/v1/queues/{_part(queue)}/groups/{_part(group)}", body, retry=True,
                          queue=queue)

    def delete_group(self, queue: str, group: str):
        return self._call("DELETE", f"/v1/queues/{_part(queue)}/groups/{_part(group)}", None, retry=True,
                          queue=queue)

    def browse(self, queue: str, *, group: str = "default", from_seq: int = 0, limit: int = 100,
               consistency: str = "leader", from_time_ms: int | None = None):
        """With consistency="any", the answer adds `applied_index`: the answering replica's
        state is at least that far along the log. `from_time_ms`: only messages put at or after
        that log time."""
        since = "" if from_time_ms is None else f"&from_time_ms={from_time_ms}"
        return self._call("GET", f"/v1/queues/{_part(queue)}/messages?group={_part(group)}&from_seq={from_seq}"
                                 f"&limit={limit}&consistency={consistency}{since}", None, retry=True,
                          queue=_leader_read(queue, consistency))

    def commit(self, queue: str, group: str, seq: int):
        return self._call("POST", f"/v1/queues/{_part(queue)}/groups/{_part(group)}/commit", {"seq": seq},
                          retry=True, queue=queue)

    # ---- staged writes: exactly-once producers (docs/api.md, statemachine/staging.py) ----
    def stage(self, producer: str, token: str, chunk: int, queue: str, messages: list, *,
              ttl_ms: int | None = None):
        """Park messages (dicts with body and key/id/headers/ttl_ms/delay_ms) invisibly under
        (token, chunk); a repeat replaces the chunk, so retrying is safe."""
        body = {"token": token, "chunk": chunk, "queue": queue,
                "messages": [self._message_out(m) for m in messages]}
        if ttl_ms is not None:
            body["ttl_ms"] = ttl_ms
        return self._call("POST", f"/v1/producers/{_part(producer)}/stage", body, retry=True, queue=queue)

    # `queue`: the queue the producer writes to, whose Raft group holds its stages and mark
    # (needed by a cluster of several groups, docs/api.md)
    def commit_stages(self, producer: str, batch: int, parts: list, *, retain_ms: int | None = None,
                      queue: str | None = None):
        """Publish the stages [{"token", "chunks"}] in one log entry, once per (producer, batch):
        a retry or replay at or below the producer's committed batch answers duplicate."""
        body = {"batch": batch, "parts": parts}
        if retain_ms is not None:
            body["retain_ms"] = retain_ms
        if queue is not None:
            body["queue"] = queue
        return self._call("POST", f"/v1/producers/{_part(producer)}/commit", body, retry=True, queue=queue)

    def abort_stages(self, producer: str, tokens: list, *, queue: str | None = None):
        body = {"tokens": list(tokens), **({} if queue is None else {"queue": queue})}
        return self._call("POST", f"/v1/producers/{_part(producer)}/abort", body, retry=True, queue=queue)

    def producer(self, producer: str, *, queue: str | None = None):
        return self._call("GET", f"/v1/producers/{_part(producer)}" + ("" if queue is None else f"?queue={_part(queue)}"),
                          None, retry=True, queue=queue)

    def delete_producer(self, producer: str, *, queue: str | None = None):
        return self._call("DELETE", f"/v1/producers/{_part(producer)}" + ("" if queue is None else f"?queue={_part(queue)}"),
                          None, retry=True, queue=queue)

    def transaction(self, *, ack: list | None = None, put: list | None = None):
        """ack: [{"queue", "receipts"}], put: [{"queue", "messages"}] — one all-or-nothing entry."""
        body = {"ack": ack or [], "put": [{"queue": p["queue"],
                                           "messages": [_wire_message(m) for m in p["messages"]]}
                                          for p in put or []]}
        named = [part["queue"] for part in body["ack"] + body["put"]]
        return self._call("POST", "/v1/tx", body, retry=True, queue=named[0] if named else None)

    def redrive(self, dead_letter_queue: str, *, from_queue: str | None = None, max: int | None = None):
        """Move dead letters back to their source queues; retried with one id, so moved once."""
        body = {"id": uuid.uuid4().hex}
        if from_queue is not None:
            body["from_queue"] = from_queue
        if max is not None:
            body["max"] = max
        return self._call("POST", f"/v1/queues/{_part(dead_letter_queue)}/redrive", body, retry=True,
                          queue=dead_letter_queue)

    def cluster(self):
        return self._call("GET", "/v1/cluster", None, retry=True)

    def routing(self):
        """Every Raft group's members and leader, and queue -> group (docs/api.md)."""
        return self._call("GET", ROUTING_PATH, None, retry=True)

    def verify(self):
        return self._call("POST", "/v1/cluster/verify", None, retry=True, timeout=30)

    def add_node(self, node_id: str, raft_addr: str, http_addr: str, *, force: bool = False):
        """force: even if the live voters would then be no majority (409 otherwise)."""
        return self._call("POST", "/v1/cluster/nodes" + ("?force=true" if force else ""),
                          {"id": node_id, "raft_addr": raft_addr, "http_addr": http_addr}, retry=True)

    def remove_node(self, node_id: str, *, force: bool = False):
        return self._call("DELETE", f"/v1/cluster/nodes/{_part(node_id)}" + ("?force=true" if force else ""),
                          None, retry=True)

    def rebalance(self):
        """Every Raft group's leader balancing, now: {"groups": [{"group", "moved"}], "moved"}."""
        return self._call("POST", "/v1/cluster/rebalance", None, retry=False, timeout=30)

    def transfer_leadership(self, to: str | None = None):
        return self._call("POST", "/v1/cluster/leader", {} if to is None else {"to": to}, retry=False,
                          timeout=30)

    def group(self, queue: str, group: str, *, consistency: str = "leader"):
        return self._call("GET", f"/v1/queues/{_part(queue)}/groups/{_part(group)}?consistency={consistency}", None,
                          retry=True, queue=_leader_read(queue, consistency))

    def groups(self, queue: str, *, consistency: str = "leader"):
        return self._call("GET", f"/v1/queues/{_part(queue)}/groups?consistency={consistency}", None, retry=True,
                          queue=_leader_read(queue, consistency))

    def sqs_keys(self, *, consistency: str = "leader"):
        """The SQS API's keys: access key ids, roles, where each is kept; never a secret."""
        return self._call("GET", f"/v1/sqs/keys?consistency={consistency}", None, retry=True)

    def add_sqs_key(self, role: str):
        """A new SQS key of `role` (admin or data), kept by the cluster: its secret is in this
        answer only. Not retried: a retry could make two."""
        return self._call("POST", "/v1/sqs/keys", {"role": role}, retry=False)

    def remove_sqs_key(self, access_key: str):
        return self._call("DELETE", f"/v1/sqs/keys/{_part(access_key)}", None, retry=True)

    def principals(self, *, consistency: str = "leader"):
        """Every principal the cluster keeps: rules, quotas, SQS access keys; never a secret."""
        return self._call("GET", f"/v1/principals?consistency={consistency}", None, retry=True)

    def principal(self, name: str, *, consistency: str = "leader"):
        return self._call("GET", f"/v1/principals/{_part(name)}?consistency={consistency}", None, retry=True)

    def add_principal(self, name: str, rules: list, *, quotas: dict | None = None, sqs: bool = False):
        """A new principal: its token (and SQS key) are in this answer only. Not retried: a retry
        would find it made, and its token gone."""
        body = {"name": name, "rules": rules, **({"quotas": quotas} if quotas else {}), **({"sqs": True} if sqs else {})}
        return self._call("POST", "/v1/principals", body, retry=False)

    def change_principal(self, name: str, *, rules: list | None = None, quotas: dict | None = None,
                         new_token: bool = False, new_sqs_key: bool = False):
        """Replace its rules or quotas; a new token or SQS key is in this answer only (not retried)."""
        body = {**({"rules": rules} if rules is not None else {}), **({"quotas": quotas} if quotas is not None else {}),
                **({"new_token": True} if new_token else {}), **({"new_sqs_key": True} if new_sqs_key else {})}
        return self._call("PATCH", f"/v1/principals/{_part(name)}", body, retry=not (new_token or new_sqs_key))

    def remove_principal(self, name: str):
        return self._call("DELETE", f"/v1/principals/{_part(name)}", None, retry=True)

    def audit(self, *, limit: int = 100):
        """The last credential changes, and the requests the answering node refused."""
        return self._call("GET", f"/v1/audit?limit={limit}", None, retry=True)

    def whoami(self):
        return self._call("GET", "/v1/whoami", None, retry=True)

    def live(self):
        return self._call("GET", "/health/live", None, retry=False)

    def metrics(self) -> str:
        """This node's Prometheus text."""
        return self._call("GET", "/metrics", None, retry=False, text=True)

    def raft_group(self, queue: str) -> int | None:
        """The Raft group `queue` lives in, as this client's routing has it (None: not learnt yet;
        any call for the queue learns it)."""
        return self._route._group(queue)

    def ready(self, groups: bool = False):
        """The node's readiness; with `groups`, also each Raft group it holds (role, leader, term)."""
        return self._call("GET", "/health/ready" + ("?groups=true" if groups else ""), None, retry=False,
                          accept_status=(200, 503))


class _Attempts:
    """One call's walk through redirects and failovers: what to do after each try.

    Both clients ask it, so they follow the same rules; each returns the delay
    before the next try, or None when there is no next try.
    """

    def __init__(self, route: Failover, retry: bool, queue: str | None):
        self.route = route
        self.retry = retry
        self.queue = queue
        self.deadline = time.monotonic() + route.retry_for
        self.backoff = backoff_delays()
        self.redirects = 0

    def after_failure(self, refused: bool) -> float | None:
        """No answer: None means give up (the caller re-raises)."""
        # A refused connection never reached a node: safe to retry any call.
        if not (self.retry or refused) or time.monotonic() > self.deadline:
            return None
        self.route.next_node(self.queue)
        return next(self.backoff)

    def after_reply(self, status: int, location: str | None, group: str | None = None) -> float | None:
        """An answer (a 307's `group`: its X-Raftq-Group): None means it is the call's result."""
        if status == 307 and self.redirects < MAX_REDIRECTS:
            self.redirects += 1
            self.route.follow(location, self.queue, int(group) if group and group.isdigit() else None)
            # a third redirect: leadership is moving, or a replica lags; give it a moment
            return 0.0 if self.redirects <= 2 else next(self.backoff)
        if status in RETRYABLE_STATUS and self.retry and time.monotonic() < self.deadline:
            self.route.next_node(self.queue)
            return next(self.backoff)
        return None


class Client(_Calls):
    """Blocking client over http.client, with keep-alive. One per thread.

    cbor=True speaks CBOR instead of JSON: byte bodies travel as they are,
    and large answers (browse pages) decode several times faster."""

    def __init__(self, urls="http://127.0.0.1:8001", *, token: str | None = None,
                 retry_for: float = 15.0, timeout: float = 15.0, cafile: str | None = None,
                 cbor: bool = False):
        self._route = Failover(urls, token, retry_for, timeout, cafile, cbor)
        self._conns: dict[str, http.client.HTTPConnection] = {}

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _conn(self, base: str, timeout: float) -> http.client.HTTPConnection:
        conn = self._conns.get(base)
        if conn is None:
            parts = urlsplit(base)
            if parts.scheme == "https":
                conn = http.client.HTTPSConnection(parts.netloc, timeout=timeout,
                                                   context=self._route.ssl_context)
            else:
                conn = http.client.HTTPConnection(parts.netloc, timeout=timeout)
            self._conns[base] = conn
        conn.timeout = timeout
        return conn

    def _call(self, method, path, body, *, retry, timeout=None, accept_status=(), text=False, queue=None):
        """`queue`: the call is served by that queue's group, whose leader it goes to first."""
        route = self._route
        if route.wants_routing(queue):
            route.learn(self._ask_routing())
        data = route.encode(body)
        attempts = _Attempts(route, retry, queue)
        while True:
            base = route.base_for(queue)
            try:
                conn = self._conn(base, timeout or route.timeout)
                conn.request(method, path, body=data, headers=route.headers)
                reply = conn.getresponse()
                raw = reply.read()
            except (OSError, http.client.HTTPException) as exc:
                self._conns.pop(base, None)
                delay = attempts.after_failure(isinstance(exc, ConnectionRefusedError))
                if delay is None:
                    raise
                time.sleep(delay)
                continue
            delay = attempts.after_reply(reply.status, reply.getheader("Location"), reply.getheader(GROUP_HEADER))
            if delay is None:
                route.answered(base)
                return route.decode(reply.status, raw, accept_status, text, reply.getheader("Content-Type"),
                                    reply.getheader(APPLIED_INDEX_HEADER))
            time.sleep(delay)

    def _ask_routing(self) -> dict | None:
        """The cluster's routing, asked once of the current node (None: no answer now)."""
        base = self._route.base
        try:
            conn = self._conn(base, self._route.timeout)
            conn.request("GET", ROUTING_PATH, headers=self._route.headers)
            reply = conn.getresponse()
            return _routing_answer(self._route, reply.status, reply.read(), reply.getheader("Content-Type"))
        except (OSError, http.client.HTTPException):
            self._conns.pop(base, None)
            return None


class AsyncClient(_Calls):
    """asyncio client over aiohttp; share one per event loop.

    At most `pool_size` connections are open at once; callers beyond that
    wait their turn for one, and `timeout` starts only once they have it, so
    no caller is starved by many others (thousands of concurrent calls are
    fine). For many single messages, the streaming `Producer` and
    `Consumer` cost far less per message.
    """

    def __init__(self, urls="http://127.0.0.1:8001", *, token: str | None = None,
                 retry_for: float = 15.0, timeout: float = 15.0, cafile: str | None = None,
                 pool_size: int = 100, cbor: bool = False):
        self._route = Failover(urls, token, retry_for, timeout, cafile, cbor)
        self._pool_size = pool_size
        self._session = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def _call(self, method, path, body, *, retry, timeout=None, accept_status=(), text=False, queue=None):
        """`queue`: the call is served by that queue's group, whose leader it goes to first."""
        if self._session is None:
            ssl_context = self._route.ssl_context
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ssl_context or True, limit=self._pool_size))
        route = self._route
        if route.wants_routing(queue):
            route.learn(await self._ask_routing())
        data = route.encode(body)
        attempts = _Attempts(route, retry, queue)
        while True:
            try:
                base = route.base_for(queue)
                async with self._session.request(
                        # encoded: the path is quoted already (_part), and requoting would undo a "%2E"
                        method, URL(base + path, encoded=True), data=data, headers=route.headers,
                        allow_redirects=False,
                        timeout=aiohttp.ClientTimeout(sock_connect=timeout or route.timeout,
                                                      sock_read=timeout or route.timeout)) as reply:
                    raw = await reply.read()
                    status, location = reply.status, reply.headers.get("Location")
                    group = reply.headers.get(GROUP_HEADER)
                    content_type = reply.headers.get("Content-Type")
                    applied_index = reply.headers.get(APPLIED_INDEX_HEADER)
            except (aiohttp.ClientError, asyncio.TimeoutError, socket.gaierror) as exc:
                delay = attempts.after_failure(isinstance(exc, aiohttp.ClientConnectorError))
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                continue
            delay = attempts.after_reply(status, location, group)
            if delay is None:
                route.answered(base)
                return route.decode(status, raw, accept_status, text, content_type, applied_index)
            await asyncio.sleep(delay)

    async def _ask_routing(self) -> dict | None:
        """The cluster's routing, asked once of the current node (None: no answer now)."""
        try:
            async with self._session.get(self._route.base + ROUTING_PATH, headers=self._route.headers,
                                         allow_redirects=False,
                                         timeout=aiohttp.ClientTimeout(total=self._route.timeout)) as reply:
                return _routing_answer(self._route, reply.status, await reply.read(),
                                       reply.headers.get("Content-Type"))
        except (aiohttp.ClientError, asyncio.TimeoutError, socket.gaierror):
            return None


def _routing_answer(route: Failover, status: int, raw: bytes, content_type: str | None) -> dict | None:
    """A routing answer, or None for any refusal (a node too old to route, a token without the
    data role): the calls then go where they went before routing existed."""
    if status != 200:
        return None
    try:
        return route.decode(status, raw, (), content_type=content_type)
    except ValueError:
        return None

"""What every raftq client shares: which node to try next and for how long,
how bodies are encoded and decoded, and the errors a call can raise."""

import base64
import json
import ssl
import time
from urllib.parse import urlsplit

import cbor2

CBOR = "application/cbor"
# An election takes 0.15-0.35 s: retry soon and often enough to find the new
# leader within a few tens of ms of it winning, without hammering the nodes.
BACKOFF_FIRST_S, BACKOFF_GROWTH, BACKOFF_MAX_S = 0.01, 1.5, 0.15
# How often at most a client asks a cluster for its routing (GET
# /v1/cluster/routing) while a queue's group or that group's leader is unknown:
# a queue not created yet is in no group, and asking again for each call
# would double its cost.
ROUTING_REFRESH_S = 1.0


def backoff_delays():
    delay = BACKOFF_FIRST_S
    while True:
        yield delay
        delay = min(delay * BACKOFF_GROWTH, BACKOFF_MAX_S)


class RaftqError(Exception):
    def __init__(self, status: int, code: str, message: str, body: dict | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.body = status, code, message, body or {}


class DurabilityNotReached(RaftqError):
    """A put with ``durability=all`` was stored on a majority (201), but some
    connected voter did not hold it within the write timeout. ``body`` is the
    whole answer (messages, seqs, ``durability: "quorum"``); putting again with
    the same ids stores nothing new and waits for every voter once more."""


def from_wire(value):
    if isinstance(value, dict):
        if "body_b64" in value:
            value = dict(value)
            value["body"] = base64.b64decode(value.pop("body_b64"))
        return {k: from_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_wire(v) for v in value]
    return value


class Failover:
    """Which node to try next, and for how long to keep trying; how bodies are encoded.

    Which node serves a queue (issue 24): the cluster's routing (``learn``)
    says which Raft group holds each queue — for good: an assignment never
    changes — and which node leads each group, as last heard. A call for a
    queue goes to its group's leader; a 307 names the new one, and a failure
    (503, a lost connection) forgets it until the routing is asked again.
    """

    def __init__(self, urls, token, retry_for: float, timeout: float, cafile: str | None,
                 cbor: bool = False):
        if isinstance(urls, str):
            urls = [urls]
        self.urls = [u.rstrip("/") for u in urls]
        self.current = 0
        self.cbor = cbor
        media = CBOR if cbor else "application/json"
        self.headers = {"Content-Type": media, "Accept": media}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.retry_for = retry_for
        self.timeout = timeout
        self.ssl_context = ssl.create_default_context(cafile=cafile) if cafile else None
        self.group_count: int | None = None    # as the routing said
        self.group_of: dict[str, int] = {}     # queue -> its Raft group (a queue made again may move: a 307 says)
        self.leaders: dict[int, str] = {}      # group -> its leader's base URL, as last heard
        self.routing_asked_at: float | None = None

    @property
    def base(self) -> str:
        return self.urls[self.current]

    def _group(self, queue: str | None) -> int | None:
        if queue is None:
            return None
        return 0 if self.group_count == 1 else self.group_of.get(queue)

    def base_for(self, queue: str | None) -> str:
        """Where a call for `queue` goes first: its group's leader when known, else the current node."""
        return self.leaders.get(self._group(queue), self.base)

    def wants_routing(self, queue: str | None) -> bool:
        """Whether to ask the routing before a call for `queue`: its group or that group's leader is
        unknown, and it was not asked within ROUTING_REFRESH_S."""
        if queue is None or self._group(queue) in self.leaders:
            return False
        return self.routing_asked_at is None or time.monotonic() - self.routing_asked_at >= ROUTING_REFRESH_S

    def learn(self, routing: dict | None) -> None:
        """The answer of GET /v1/cluster/routing (None: it could not be had; asked again later)."""
        self.routing_asked_at = time.monotonic()
        if routing is None:
            return
        self.group_count = routing["group_count"]
        self.group_of.update(routing["queues"])
        scheme = urlsplit(self.base).scheme
        self.leaders = {group["id"]: f"{scheme}://{group['leader_http_addr']}" for group in routing["groups"]
                        if group.get("leader_http_addr")}

    def answered(self, base: str) -> None:
        """The node at `base` answered: the next call without a queue goes there too (a caller
        may ask it next what it asked it first: the Spark planner's stats, then its index)."""
        if base not in self.urls:
            self.urls.append(base)
        self.current = self.urls.index(base)

    def follow(self, location: str, queue: str | None = None, group: int | None = None) -> None:
        """Go where a 307 sends a call for `queue`, which it says is in `group` when it names one."""
        parts = urlsplit(location)
        base = f"{parts.scheme}://{parts.netloc}"
        self.answered(base)
        if queue is not None and group is not None and self.group_count != 1:
            self.group_of[queue] = group
        if self._group(queue) is not None:
            self.leaders[self._group(queue)] = base

    def next_node(self, queue: str | None = None) -> None:
        """Move on from a node that failed; a call for `queue` forgets its group's leader."""
        self.leaders.pop(self._group(queue), None)
        self.current = (self.current + 1) % len(self.urls)

    def encode(self, body) -> bytes | None:
        if body is None:
            return None
        return cbor2.dumps(body) if self.cbor else json.dumps(body).encode()

    @staticmethod
    def decode(status: int, raw: bytes, accept_status, text: bool = False, content_type: str | None = None,
               applied_index: str | None = None):
        if text and status == 200:
            return raw.decode()
        if not raw:
            payload = {}
        elif (content_type or "").startswith(CBOR):
            payload = cbor2.loads(raw)
        else:
            payload = json.loads(raw)
        if isinstance(payload, dict) and "durability_not_reached" in payload:
            shortfall = payload["durability_not_reached"]
            raise DurabilityNotReached(status, "durability_not_reached", shortfall["message"], from_wire(payload))
        if 200 <= status < 300 or status in accept_status:
            result = from_wire(payload)
            if applied_index is not None and isinstance(result, dict):
                result["applied_index"] = int(applied_index)
            return result
        raise RaftqError(status, payload.get("error", "http_error"), payload.get("message", raw[:200]), payload)

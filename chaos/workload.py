"""What runs against the cluster during a campaign, and records every step.

Clients here are deliberately plain: one HTTP request per recorded attempt,
so that each attempt's outcome is exactly what the checker needs. raftq's own
client retries inside one call, which would hide whether a 409 on an ack
means "already acked by my first try" or "never acked". Clients reach the
nodes through their HTTP proxies, and a 307 to a node's real address is
followed to that node's proxy, so client-side faults stay in the path.

Outcomes: a 2xx is `ok`; a 4xx, a 507 (insufficient storage: refused before
the log, docs/api.md), a redirect not followed, or a refused connection
(nothing was sent) is `fail`; a timeout, a dropped connection, a 503 (raftq
answers it when a write's fate is unknown) or another 5xx is `info`. Puts
and receives record the bodies put and served, which the checker compares.

- Producers put one message at a time with an idempotency id and a priority
  (mostly the default, some higher), retrying the same id on other nodes
  until acknowledged (a 507 too: room comes back), and now and then re-send
  an acknowledged one on purpose (it must come back as a duplicate). Started
  with the nodes (`eager_first_put`), a producer retries without backing off
  until its first put is acknowledged, so the first puts of a brand-new
  cluster reach its first leader the moment it can take them.
- Consumers long-poll, then ack most messages, nack some (without a delay:
  the work queues' back-off policy, BACKOFF, decides when they come back) and
  drop a few (their lease runs out, and they back off too).
- Readers read queue stats and browse pages at `consistency=leader` and
  `strong`, for the stale-read check (each read's `last_seq`).
- The prober measures failover (puts from every node at once until one is
  acknowledged, to a probe queue of each Raft group that lost its leader) and
  how soon an isolated leader refuses writes.
- The monitor samples every node's /health/ready and the leader's
  /v1/cluster view, for the log-shrink check and the timeline.
- After healing, `drain` empties every group and `verify` compares replicas.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from chaos.checker import placed_alone
from chaos.history import History
from raftq.cli.cluster import VERIFY_EXITS

TIMEOUT_S = 3.0
WAIT_MS = 300
PUT_RETRY_FOR_S = 20.0
PRODUCER_PACE_S = 0.03
EAGER_RETRY_S = 0.002
DUPLICATE_CHANCE = 0.1
ACK_CHANCE, NACK_CHANCE = 0.8, 0.1   # the rest is dropped
PROBE_TIMEOUT_S = 0.5
# A write to an isolated leader hangs until it steps down; short attempts show
# when it starts refusing new ones to within this much.
STALE_PROBE_TIMEOUT_S = 0.1
MONITOR_PERIOD_S = 0.2
READY_PATH = "/health/ready?groups=true"   # with each Raft group's role, leader and term
# A node leading several Raft groups under load may take half a second to answer; a
# sample that times out says nothing of who leads.
MONITOR_TIMEOUT_S = 2.0
CLUSTER_PERIOD_S = 0.5
PROBE_QUEUE_PREFIX = "probe-"   # one probe queue per Raft group
CHURN_QUEUE_PREFIX = "churn-"   # with several Raft groups: queues made and deleted over and over
CHURN_QUEUES_PER_GROUP = 2
CHURN_PACE_S = 0.05
PLACEMENT_WAIT_S = 60.0   # for the last deleted names to leave the catalog (sweeps: 2 x 10 s)
READER_PACE_S = 0.05
READ_LEVELS = ("leader", "strong")
# Certainly not done, though a 5xx: a disk with no room refused it before the log (docs/api.md).
REFUSED_FOR_ROOM = 507
# The work queues' redelivery back-off (docs/api.md): without jitter, so that the checker's
# backoff_respected knows each delay exactly; short, so that redeliveries still happen within a run.
BACKOFF = {"initial_ms": 100, "factor": 2, "max_ms": 800, "jitter": 0}
PRIORITIES = (0, 0, 0, 0, 1, 5, 9)    # what a producer draws a message's priority from


class Refused(OSError):
    """The connection was refused: the request was never sent."""


@dataclass
class Reply:
    status: int
    body: object
    node: str


class Endpoints:
    """Where clients reach each node (its HTTP proxy) and where observers do (directly)."""

    def __init__(self, client_urls: dict[str, str], direct_urls: dict[str, str], token: str | None = None):
        self.client = client_urls
        self.direct = direct_urls
        self.token = token          # the cluster's admin token, sent with every call
        # a node's real address (a 307's Location names it) and its proxy's; merged by node id, the
        # proxies' would hide the real ones, and every 307 went unfollowed
        self._by_addr = {urlsplit(u).netloc: n for urls in (direct_urls, client_urls) for n, u in urls.items()}

    @property
    def ids(self) -> list[str]:
        return list(self.client)

    def node_at(self, url: str) -> str | None:
        return self._by_addr.get(urlsplit(url).netloc)


class Caller:
    """HTTP/1.1 with keep-alive; one per thread."""

    def __init__(self, endpoints: Endpoints, *, direct: bool = False):
        self.endpoints = endpoints
        self.urls = endpoints.direct if direct else endpoints.client
        self._conns: dict[str, http.client.HTTPConnection] = {}

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def _once(self, node: str, method: str, path: str, data: bytes | None, timeout: float):
        conn = self._conns.get(node)
        if conn is None:
            conn = http.client.HTTPConnection(urlsplit(self.urls[node]).netloc, timeout=timeout)
            try:
                conn.connect()
            except ConnectionRefusedError as exc:
                raise Refused(str(exc)) from None
            self._conns[node] = conn
        conn.timeout = timeout
        conn.sock.settimeout(timeout)
        try:
            headers = {"Content-Type": "application/json", "Accept": "application/json"}
            if self.endpoints.token:
                headers["Authorization"] = f"Bearer {self.endpoints.token}"
            conn.request(method, path, body=data, headers=headers)
            reply = conn.getresponse()
            raw = reply.read()
            if reply.getheader("Content-Length") is None and reply.status != 204:
                # Every raftq reply with a body has one. Without it the reply was
                # cut inside its headers (client-faults' limit_data): http.client
                # takes the cut for their end and the body for empty; the outcome
                # is unknown. A 204 (a delete) has none, and its status says it all.
                raise http.client.IncompleteRead(raw)
        except BaseException:
            conn.close()
            self._conns.pop(node, None)
            raise
        if reply.will_close:
            conn.close()
            self._conns.pop(node, None)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = {"raw": raw[:200].decode(errors="replace")}
        return reply.status, body, reply.getheader("Location")

    def request(self, node: str, method: str, path: str, body=None, *, timeout: float = TIMEOUT_S,
                follow: bool = True) -> Reply:
        data = None if body is None else json.dumps(body).encode()
        for _ in range(4):
            status, payload, location = self._once(node, method, path, data, timeout)
            target = self.endpoints.node_at(location) if status == 307 and location else None
            if not follow or target is None:
                return Reply(status, payload, node)
            node = target
        return Reply(status, payload, node)


def attempt(history: History, caller: Caller, process: str, f: str, value: dict, node: str,
            method: str, path: str, body=None, *, timeout: float = TIMEOUT_S, follow: bool = True,
            result=lambda payload: payload) -> tuple[str, object]:
    """One request, recorded as one operation; returns (outcome, payload or error)."""
    op = history.invoke(process, f, value, node)
    try:
        reply = caller.request(node, method, path, body, timeout=timeout, follow=follow)
    except Refused as exc:
        error = {"exception": f"refused: {exc}"}
        history.complete(op, "fail", error=error)
        return "fail", error
    except (OSError, http.client.HTTPException) as exc:
        error = {"exception": f"{type(exc).__name__}: {exc}"}
        history.complete(op, "info", error=error)
        return "info", error
    if 200 <= reply.status < 300:
        value = result(reply.body)
        history.complete(op, "ok", value, node=reply.node)
        return "ok", value
    error = {"status": reply.status, "code": (reply.body or {}).get("error") if isinstance(reply.body, dict) else None}
    outcome = "fail" if reply.status < 500 or reply.status == REFUSED_FOR_ROOM else "info"
    history.complete(op, outcome, error=error, node=reply.node)
    return outcome, error


def put_path(queue: str) -> str:
    return f"/v1/queues/{queue}/messages"


def put_body(mid: str, producer: str, n: int, priority: int = 0) -> dict:
    message = {"body": {"id": mid, "p": producer, "n": n}, "id": mid}
    if priority:
        message["priority"] = priority
    return {"messages": [message]}


def put_result(payload) -> dict:
    m = payload["messages"][0]
    return {"seq": m["seq"], "duplicate": m["duplicate"]}


def receive_result(payload) -> dict:
    return {"messages": [{"seq": m["seq"], "receipt": m["receipt"], "deliveries": m["deliveries"],
                          "put_at_ms": m.get("put_at_ms"), "body": m.get("body"),
                          "id": m["body"].get("id") if isinstance(m.get("body"), dict) else None}
                         for m in payload["messages"]]}


def read_path(queue: str, kind: str, consistency: str) -> str:
    if kind == "stats":
        return f"/v1/queues/{queue}?consistency={consistency}"
    # a page past the end: only last_seq matters, and it costs the node nothing
    return f"/v1/queues/{queue}/messages?from_seq={1 << 40}&limit=1&consistency={consistency}"


def read_result(kind: str):
    def result(payload) -> dict:
        return {"last_seq": payload["stats"]["last_seq"] if kind == "stats" else payload["last_seq"]}
    return result


def read(history: History, caller: Caller, process: str, queue: str, kind: str, consistency: str, node: str,
         *, timeout: float = TIMEOUT_S, follow: bool = True) -> tuple[str, object]:
    return attempt(history, caller, process, "read", {"queue": queue, "kind": kind, "consistency": consistency},
                   node, "GET", read_path(queue, kind, consistency), timeout=timeout, follow=follow,
                   result=read_result(kind))


def settle(history: History, caller: Caller, process: str, f: str, queue: str, group: str,
           receipts: list[str], node: str, stop: threading.Event | None, retry_for: float) -> str:
    """ack or nack, retried while its outcome is unknown; returns the node last used."""
    deadline = time.monotonic() + retry_for
    ids = itertools.cycle(caller.urls)
    while True:
        outcome, _ = attempt(history, caller, process, f, {"queue": queue, "group": group, "receipts": receipts},
                             node, "POST", f"/v1/queues/{queue}/{f}", {"receipts": receipts})
        if outcome != "info" or time.monotonic() > deadline or (stop is not None and stop.is_set()):
            return node
        node = next(ids)
        time.sleep(0.05)


class Workload:
    """Producers and consumers on their own threads, until `stop()`."""

    def __init__(self, history: History, endpoints: Endpoints, queues: dict[str, list[str]], *,
                 seed: int, lease_ms: int, producers: int = 4, consumers_per_group: int = 2,
                 readers: int = 2, eager_first_put: bool = False, churn: list[str] = ()):
        self.history = history
        self.endpoints = endpoints
        self.queues = queues
        self.seed = seed
        self.lease_ms = lease_ms
        self.producer_names = [f"p{i + 1}" for i in range(producers)]
        self.consumers_per_group = consumers_per_group
        self.reader_names = [f"r{i + 1}" for i in range(readers)]
        self.eager_first_put = eager_first_put
        self.churn = list(churn)
        self.churn_answers: dict[str, int] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for name in self.producer_names:
            self._spawn(name, self._produce, name)
        k = 0
        for queue, groups in self.queues.items():
            for group in groups:
                for _ in range(self.consumers_per_group):
                    k += 1
                    self._spawn(f"c{k}", self._consume, f"c{k}", queue, group)
        for name in self.reader_names:
            self._spawn(name, self._read, name)
        if self.churn:
            self._spawn("k1", self._churn, "k1")

    def _spawn(self, name, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _produce(self, name: str) -> None:
        rng = random.Random(f"{self.seed}-{name}")
        caller = Caller(self.endpoints)
        node = rng.choice(self.endpoints.ids)
        n = 0
        eager = self.eager_first_put
        try:
            while not self._stop.is_set():
                n += 1
                mid, queue = f"{name}-{n}", rng.choice(list(self.queues))
                priority = rng.choice(PRIORITIES)
                node, acked = self._put(caller, name, queue, mid, n, node, eager, priority)
                eager = eager and not acked
                if acked and rng.random() < DUPLICATE_CHANCE:
                    node, _ = self._put(caller, name, queue, mid, n, node, priority=priority)
                self._stop.wait(PRODUCER_PACE_S)
        finally:
            caller.close()

    def _put(self, caller, name, queue, mid, n, node, eager: bool = False, priority: int = 0) -> tuple[str, bool]:
        deadline = time.monotonic() + PUT_RETRY_FOR_S
        others = itertools.cycle(self.endpoints.ids)
        backoff = 0.05
        body = put_body(mid, name, n, priority)
        value = {"queue": queue, "id": mid, "producer": name, "priority": priority,
                 "body": body["messages"][0]["body"]}
        while True:
            outcome, error = attempt(self.history, caller, name, "put", value, node, "POST", put_path(queue), body,
                                     result=put_result)
            if outcome == "ok":
                return node, True
            if "status" in error and 400 <= error["status"] < 500:
                return node, False   # refused for good; the checker judges what came of it
            if time.monotonic() > deadline or self._stop.is_set():
                return node, False
            node = next(others)
            time.sleep(EAGER_RETRY_S if eager else backoff)
            backoff = min(backoff * 2, 0.5)

    def _churn(self, name: str) -> None:
        """Puts that make a churn queue and deletes of it, at random and through random nodes, so
        that names leave the catalog and come back placed anew (api/releaser.py) under every fault.
        What their puts stored is deleted, so they are not judged as puts: queue_in_one_group
        judges where the queues end up. The answers are counted (`churn` event)."""
        rng = random.Random(f"{self.seed}-{name}")
        caller = Caller(self.endpoints)
        answers = self.churn_answers
        try:
            while not self._stop.is_set():
                queue, node = rng.choice(self.churn), rng.choice(self.endpoints.ids)
                try:
                    if rng.random() < 0.5:
                        reply = caller.request(node, "POST", put_path(queue), {"body": {"churn": True}})
                        answer = f"put {reply.status}"
                    else:
                        answer = f"delete {caller.request(node, 'DELETE', f'/v1/queues/{queue}').status}"
                except (OSError, http.client.HTTPException) as exc:
                    answer = type(exc).__name__      # a fault on the way: the next goes elsewhere
                answers[answer] = answers.get(answer, 0) + 1
                self._stop.wait(CHURN_PACE_S)
        finally:
            caller.close()

    def _consume(self, name: str, queue: str, group: str) -> None:
        rng = random.Random(f"{self.seed}-{name}")
        caller = Caller(self.endpoints)
        node = rng.choice(self.endpoints.ids)
        others = itertools.cycle(self.endpoints.ids)
        request = {"group": group, "max": 5, "wait_ms": WAIT_MS, "lease_ms": self.lease_ms}
        try:
            while not self._stop.is_set():
                outcome, got = attempt(self.history, caller, name, "receive", {"queue": queue, **request},
                                       node, "POST", f"/v1/queues/{queue}/receive", request,
                                       timeout=TIMEOUT_S + WAIT_MS / 1000, result=receive_result)
                if outcome != "ok":
                    node = next(others)
                    self._stop.wait(0.05)
                    continue
                acks, nacks = [], []
                for m in got["messages"]:
                    draw = rng.random()
                    if draw < ACK_CHANCE:
                        acks.append(m["receipt"])
                    elif draw < ACK_CHANCE + NACK_CHANCE:
                        nacks.append(m["receipt"])
                if got["messages"]:
                    time.sleep(rng.uniform(0, 0.05))  # "processing"
                for f, receipts in (("ack", acks), ("nack", nacks)):
                    if receipts:
                        node = settle(self.history, caller, name, f, queue, group, receipts, node,
                                      self._stop, retry_for=self.lease_ms / 1000)
        finally:
            caller.close()


    def _read(self, name: str) -> None:
        rng = random.Random(f"{self.seed}-{name}")
        caller = Caller(self.endpoints)
        try:
            while not self._stop.is_set():
                read(self.history, caller, name, rng.choice(list(self.queues)),
                                  rng.choice(("stats", "browse")), rng.choice(READ_LEVELS),
                                  rng.choice(self.endpoints.ids))
                self._stop.wait(READER_PACE_S)
        finally:
            caller.close()


class Prober:
    """Failover measurements: put from every node until one acknowledges, in each Raft
    group that lost its leader; ask an isolated leader for writes, and for reads, until
    it refuses."""

    def __init__(self, history: History, endpoints: Endpoints, probe_queues: dict[int, str], read_queue: str):
        self.history = history
        self.endpoints = endpoints
        self.probe_queues = probe_queues  # Raft group -> the probe queue it holds
        self.read_queue = read_queue      # where the producers keep writing (through the new leader)
        self._ids = itertools.count(1)

    def _probe_put(self, caller: Caller, name: str, node: str, queue: str, *, follow: bool, timeout: float):
        n = next(self._ids)
        mid = f"{name}-{n}"
        body = put_body(mid, name, n)
        return attempt(self.history, caller, name, "put", {"queue": queue, "id": mid, "producer": name,
                                                           "body": body["messages"][0]["body"]},
                       node, "POST", put_path(queue), body, timeout=timeout, follow=follow, result=put_result)

    def until_acked(self, name: str, raft_groups=(0,), timeout: float = 30.0) -> float | None:
        """Seconds until a put to each of the Raft groups' probe queues was acknowledged
        (None: not every one ever was)."""
        started = time.monotonic()
        queues = [self.probe_queues[group] for group in raft_groups]
        done = {queue: threading.Event() for queue in queues}

        def probe(node: str, queue: str) -> None:
            caller = Caller(self.endpoints)
            try:
                while not done[queue].is_set() and time.monotonic() - started < timeout:
                    outcome, _ = self._probe_put(caller, f"{name}@{node}/{queue}", node, queue, follow=True,
                                                 timeout=PROBE_TIMEOUT_S)
                    if outcome == "ok":
                        done[queue].set()
                    else:
                        done[queue].wait(0.02)
            finally:
                caller.close()

        threads = [threading.Thread(target=probe, args=(node, queue), daemon=True)
                   for node in self.endpoints.ids for queue in queues]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return round(time.monotonic() - started, 3) if all(e.is_set() for e in done.values()) else None

    def reads_until_refused(self, node: str, name: str, timeout: float = 10.0) -> None:
        """Ask `node` (an isolated leader) for reads, directly, until it refuses
        one: what it answers meanwhile is judged by no_stale_reads."""
        caller = Caller(self.endpoints)
        deadline = time.monotonic() + timeout
        levels = itertools.cycle(READ_LEVELS)
        kinds = itertools.cycle(("stats", "stats", "browse"))
        try:
            while time.monotonic() < deadline:
                outcome, error = read(self.history, caller, name, self.read_queue, next(kinds), next(levels), node,
                                      timeout=STALE_PROBE_TIMEOUT_S, follow=False)
                if outcome != "ok" and error.get("status") in (307, 503):
                    return
                time.sleep(0.01)
        finally:
            caller.close()

    def until_refused(self, node: str, name: str, timeout: float = 10.0) -> None:
        caller = Caller(self.endpoints)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                outcome, error = self._probe_put(caller, name, node, self.probe_queues[0], follow=False,
                                                 timeout=STALE_PROBE_TIMEOUT_S)
                if outcome != "ok" and error.get("status") in (307, 503):
                    return
                time.sleep(0.02)
        finally:
            caller.close()


class Monitor:
    """Samples every node's indexes and role, and the leader's view of its followers."""

    def __init__(self, history: History, endpoints: Endpoints):
        self.history = history
        self.endpoints = endpoints
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.last_leader: str | None = None

    def start(self) -> None:
        for node in self.endpoints.ids:
            self._threads.append(threading.Thread(target=self._ready, args=(node,), daemon=True))
        self._threads.append(threading.Thread(target=self._cluster, daemon=True))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def _sample(self, caller: Caller, f: str, node: str, path: str) -> dict | None:
        op = self.history.invoke("monitor", f, None, node)
        try:
            reply = caller.request(node, "GET", path, timeout=MONITOR_TIMEOUT_S, follow=False)
        except (OSError, http.client.HTTPException) as exc:
            self.history.complete(op, "info", error={"exception": f"{type(exc).__name__}: {exc}"})
            return None
        if not isinstance(reply.body, dict) or reply.status not in (200, 503):
            self.history.complete(op, "info", error={"status": reply.status})
            return None
        self.history.complete(op, "ok", reply.body)   # a 503 from /health/ready still carries the indexes
        return reply.body

    def _ready(self, node: str) -> None:
        caller = Caller(self.endpoints, direct=True)
        while not self._stop.wait(MONITOR_PERIOD_S):
            view = self._sample(caller, "ready", node, READY_PATH)
            if view and view.get("role") == "leader":
                self.last_leader = node
        caller.close()

    def _cluster(self) -> None:
        caller = Caller(self.endpoints, direct=True)
        while not self._stop.wait(CLUSTER_PERIOD_S):
            if self.last_leader:
                self._sample(caller, "cluster", self.last_leader, "/v1/cluster")
        caller.close()


def drain(history: History, endpoints: Endpoints, queues: dict[str, list[str]], *,
          timeout: float = 120.0) -> bool:
    """Receive and ack everything left in every group; True once all are empty."""
    caller = Caller(endpoints)
    deadline = time.monotonic() + timeout
    nodes = itertools.cycle(endpoints.ids)
    node = next(nodes)
    request = {"max": 100, "wait_ms": 0, "lease_ms": 30_000}
    try:
        for queue, groups in queues.items():
            for group in groups:
                while True:
                    if time.monotonic() > deadline:
                        history.event("note", what="drain", complete=False, queue=queue, group=group)
                        return False
                    body = {**request, "group": group}
                    outcome, got = attempt(history, caller, "drain", "receive", {"queue": queue, **body}, node,
                                           "POST", f"/v1/queues/{queue}/receive", body, result=receive_result)
                    if outcome != "ok":
                        node = next(nodes)
                        time.sleep(0.2)
                        continue
                    if got["messages"]:
                        node = settle(history, caller, "drain", "ack", queue, group,
                                      [m["receipt"] for m in got["messages"]], node, None, retry_for=30)
                        continue
                    if _group_empty(caller, node, queue, group):
                        break
                    time.sleep(0.5)   # leases held by stopped consumers must run out first
    finally:
        caller.close()
    history.event("note", what="drain", complete=True)
    return True


def _group_empty(caller: Caller, node: str, queue: str, group: str) -> bool:
    try:
        reply = caller.request(node, "GET", f"/v1/queues/{queue}")
    except (OSError, http.client.HTTPException):
        return False
    if reply.status != 200:
        return False
    stats = reply.body["stats"]
    # (a message backing off is neither ready nor in flight: delayed, in the queue's count)
    return stats["groups"][group]["depth"] == 0 and stats["groups"][group]["in_flight"] == 0 and stats["delayed"] == 0


def churn_queues(raft_groups: int) -> list[str]:
    """The churn queues: CHURN_QUEUES_PER_GROUP for each Raft group, with several (with one there
    is no catalog for their names to leave)."""
    count = CHURN_QUEUES_PER_GROUP * raft_groups if raft_groups > 1 else 0
    return [f"{CHURN_QUEUE_PREFIX}{i}" for i in range(count)]


def placement(history: History, endpoints: Endpoints, node: str, queues: list[str], raft_groups: int,
              timeout: float = PLACEMENT_WAIT_S) -> None:
    """Where each churn queue is once the faults are over: the Raft groups whose lists hold it,
    and the group the catalog places its name in. Asked again until each is in the catalog's
    group alone, or in none with its name gone from the catalog (the releaser's last steps), or
    `timeout`; the last answer is recorded (`placement` event) for queue_in_one_group."""
    caller = Caller(endpoints, direct=True)
    deadline = time.monotonic() + timeout
    seen: dict = {}
    try:
        while True:
            try:
                seen = _placement(caller, node, queues, raft_groups)
            except (OSError, http.client.HTTPException, PlacementUnread) as exc:
                seen = {"unread": str(exc)}
            if (seen and "unread" not in seen and all(placed_alone(where) for where in seen.values())) \
                    or time.monotonic() > deadline:
                break
            time.sleep(1.0)
    finally:
        caller.close()
    history.event("placement", queues=seen)


class PlacementUnread(Exception):
    """A node did not answer a placement read with 200."""


def _placement(caller: Caller, node: str, queues: list[str], raft_groups: int) -> dict:
    held: dict[str, list[int]] = {queue: [] for queue in queues}
    for group in range(raft_groups):
        reply = caller.request(node, "GET", f"/v1/queues?group={group}")
        if reply.status != 200:
            raise PlacementUnread(f"GET /v1/queues?group={group}: {reply.status} {reply.body}")
        for queue in reply.body["queues"]:
            if queue["name"] in held:
                held[queue["name"]].append(group)
    path = "/v1/cluster/routing?" + "&".join(f"queue={queue}" for queue in queues)
    reply = caller.request(node, "GET", path)
    if reply.status != 200:
        raise PlacementUnread(f"GET {path}: {reply.status} {reply.body}")
    return {queue: {"groups": held[queue], "catalog": reply.body["queues"].get(queue)} for queue in queues}


def verify(history: History, endpoints: Endpoints, leader: str, attempts: int = 5) -> None:
    """Compare replica digests over HTTP and with `raftq cluster verify`, both recorded.

    Only an incomplete verify (a replica gave no digest in time: still catching up)
    is retried; digests that differ are a verdict, not a reason to ask again.
    """
    caller = Caller(endpoints, direct=True)
    try:
        for _ in range(attempts):
            outcome, result = attempt(history, caller, "checker", "verify", None, leader, "POST",
                                      "/v1/cluster/verify", timeout=30)
            if outcome == "ok" and result["verdict"] != "incomplete":
                break
            time.sleep(1)
    finally:
        caller.close()
    for _ in range(attempts):
        op = history.invoke("checker", "verify-cli", None, leader)
        env = {**os.environ, "RAFTQ_URL": endpoints.direct[leader]}
        if endpoints.token:
            env["RAFTQ_TOKEN"] = endpoints.token
        done = subprocess.run([sys.executable, "-m", "raftq", "cluster", "verify", "--json"], env=env,
                              capture_output=True, text=True, timeout=60)
        output = done.stdout + done.stderr
        history.complete(op, "ok", {"exit": done.returncode, "output": output[-2000:]})
        if done.returncode in (VERIFY_EXITS["agree"], VERIFY_EXITS["differ"]):
            return
        time.sleep(1)

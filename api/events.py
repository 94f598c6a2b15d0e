"""`GET /v1/events`: a Server-Sent Events stream of what the console shows, once a second.

Each event is ``event: snapshot`` with one JSON object: this node's view of
the cluster (as ``GET /v1/cluster``), every queue's config and stats as this
replica has applied them (like ``consistency=any``; ``applied_index`` says
how far), and the elections this node has seen.  Any node serves it, so a
console keeps its picture while the leader changes.

Elections are observed here, not in the log: every node keeps the last
changes of term and leader its engine reported, with its own wall-clock time.

It needs the ``metrics`` action (reading the cluster's state); the queues in it
are those its principal may ``browse``, and a principal that may change the
cluster (``cluster``) also gets the last credential changes (``audit``) and
the requests this node refused (``refusals``). Each event is made for the
principal as this node knows it then: one revoked (or given a new token) ends
its stream. A stream counts toward its principal's connections quota.
"""

import asyncio
import collections
import time

import orjson
from aiohttp import web

from raftq.statemachine.rules import BROWSE, CLUSTER, METRICS

from .cluster import view as cluster_view
from .codec import json_safe
from .connections import held_connection
from .errors import ApiError
from .leader import ENGINES, NODE
from .messages import QUERY_INT
from .principals import PRINCIPAL, PRINCIPALS

AUDIT_SHOWN = 20

ELECTIONS = web.AppKey("elections", collections.deque)
STOPPING = web.AppKey("events_stopping", asyncio.Event)
ELECTIONS_KEPT = 20
INTERVALS_MS = (250, 60_000)


async def watch_elections(app: web.Application) -> None:
    """Record each (term, leader) this node goes through."""
    node, seen = app[NODE], app[ELECTIONS]
    last = None
    view = node.view()
    while True:
        current = (view["term"], view["leader_id"])
        if current != last and current[1] is not None:
            seen.append({"term": current[0], "leader": current[1], "at_ms": int(time.time() * 1000)})
            last = current
        view = await node.next_view()


async def snapshot_queues(engines: dict) -> tuple[list, int]:
    """The info of every queue of this node's Raft groups (each with its group's id), and the
    applied index of group 0 (of the one group, before there were several)."""
    async def of_group(group: int) -> tuple[list, int]:
        node = engines[group]
        listing, applied_index = await node.read("list_queues")
        infos = await asyncio.gather(*(node.read("queue_info", q["name"]) for q in listing["queues"]))
        # a queue deleted between the two reads is left out
        return [{**info.result, "group": group} for info in infos if "error" not in info.result], applied_index
    groups = sorted(engines)
    answers = dict(zip(groups, await asyncio.gather(*(of_group(group) for group in groups))))
    return sorted((queue for queues, _ in answers.values() for queue in queues),
                  key=lambda queue: queue["name"]), answers[0][1]


async def stream(request: web.Request) -> web.StreamResponse:
    raw = request.query.get("interval_ms", "1000")
    low, high = INTERVALS_MS
    if not QUERY_INT.fullmatch(raw) or not low <= int(raw) <= high:   # isdigit() takes '²
        raise ApiError("bad_request", f"interval_ms must be an integer from {low} to {high}")
    interval = int(raw) / 1000
    async with held_connection(request.app, request.get(PRINCIPAL)):
        return await _stream(request, interval)


async def _stream(request: web.Request, interval: float) -> web.StreamResponse:
    node, stopping = request.app[NODE], request.app[STOPPING]
    principals, opened_by = request.app[PRINCIPALS], request.get(PRINCIPAL)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    while not stopping.is_set():
        started = time.monotonic()
        principal = opened_by and principals.current(opened_by)
        if opened_by is not None and (principal is None or not principal.allows(METRICS)):
            break                    # revoked, or no longer allowed: the console asks for a token again
        queues, applied_index = await snapshot_queues(request.app[ENGINES])
        snapshot = {"node": node.id, "at_ms": int(time.time() * 1000), "applied_index": applied_index,
                    "cluster": await cluster_view(request),
                    "queues": [q for q in queues if principal is None or principal.allows(BROWSE, q["name"])],
                    "elections": list(request.app[ELECTIONS])}
        if principal is None or principal.allows(CLUSTER):
            snapshot["audit"] = (await node.read("principal_events", AUDIT_SHOWN)).result["events"]
            snapshot["refusals"] = list(principals.denials)[-AUDIT_SHOWN:]
        try:
            await response.write(b"event: snapshot\ndata: " + orjson.dumps(json_safe(snapshot)) + b"\n\n")
        except (ConnectionResetError, RuntimeError):   # the console went away
            break
        try:
            await asyncio.wait_for(stopping.wait(), max(0.0, interval - (time.monotonic() - started)))
        except asyncio.TimeoutError:
            pass
    return response


def install(app: web.Application) -> None:
    """The election watcher, and the shutdown hook that ends open streams."""
    app[ELECTIONS] = collections.deque(maxlen=ELECTIONS_KEPT)
    app[STOPPING] = asyncio.Event()

    async def watcher(app: web.Application):
        task = asyncio.create_task(watch_elections(app))
        yield
        task.cancel()
    app.cleanup_ctx.append(watcher)

    async def stop_streams(app: web.Application) -> None:
        # A stream never ends by itself; shutting down must not wait for it.
        app[STOPPING].set()
    app.on_shutdown.append(stop_streams)

"""`GET /v1/events`: a Server-Sent Events stream of what the console shows, once a second.

Each event is ``event: snapshot`` with one JSON object: this node's view of
the cluster (as ``GET /v1/cluster``), every queue's config and stats as this
replica has applied them (like ``consistency=any``; ``applied_index`` says
how far), and the elections this node has seen.  Any node serves it, so a
console keeps its picture while the leader changes.

Elections are observed here, not in the log: every node samples its term and
leader and keeps the last changes it saw, with its own wall-clock time.
"""

import asyncio
import collections
import time

import orjson
from aiohttp import web

from .cluster import view as cluster_view
from .codec import json_safe
from .errors import ApiError
from .leader import NODE

ELECTIONS = web.AppKey("elections", collections.deque)
STOPPING = web.AppKey("events_stopping", asyncio.Event)
ELECTIONS_KEPT = 20
SAMPLE_PERIOD_S = 0.1     # elections take longer than this; two inside one sample show as one
INTERVALS_MS = (250, 60_000)


async def watch_elections(app: web.Application) -> None:
    """Record each (term, leader) this node goes through."""
    node, seen = app[NODE], app[ELECTIONS]
    last = None
    while True:
        current = (node.consensus.term(), node.consensus.leader_id())
        if current != last and current[1] is not None:
            seen.append({"term": current[0], "leader": current[1], "at_ms": int(time.time() * 1000)})
            last = current
        await asyncio.sleep(SAMPLE_PERIOD_S)


def snapshot_queues(node) -> list:
    listing = node.read("list_queues")["queues"]
    out = []
    for queue in listing:
        info = node.read("queue_info", queue["name"])
        if "error" not in info:      # deleted between the two reads
            out.append(info)
    return out


async def stream(request: web.Request) -> web.StreamResponse:
    raw = request.query.get("interval_ms", "1000")
    low, high = INTERVALS_MS
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ApiError("bad_request", f"interval_ms must be an integer from {low} to {high}")
    interval = int(raw) / 1000
    node, stopping = request.app[NODE], request.app[STOPPING]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    while not stopping.is_set():
        started = time.monotonic()
        snapshot = {"node": node.id, "at_ms": int(time.time() * 1000),
                    "applied_index": node.status()["applied_index"],
                    "cluster": await cluster_view(request), "queues": snapshot_queues(node),
                    "elections": list(request.app[ELECTIONS])}
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

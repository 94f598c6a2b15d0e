"""The aiohttp application: routes, auth, the error contract, metrics.

Handlers are thin: parse and validate, build a command, submit it through the
node, render the result.  Every failure leaves as {"error", "message"} with
its status (errors.py), including aiohttp's own (unknown route, body too
large) and bugs (500, logged).
"""

import asyncio
import hmac
import logging
import ssl
from dataclasses import dataclass

from aiohttp import ClientSession, TCPConnector, web

from raftq.buffer import PutBuffer

from . import buffering, cluster, console, events, messages, queues, stream
from .codec import respond
from .errors import ApiError
from .leader import HTTP, NODE, SETTINGS
from .metrics import Metrics

log = logging.getLogger("raftq.api")

MAX_REQUEST_BYTES = 16 << 20
AIOHTTP_ERRORS = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}


@dataclass(frozen=True)
class Settings:
    auth_token: str | None = None
    max_message_bytes: int = 1 << 20
    write_timeout_s: float = 10.0
    scheme: str = "http"
    tls_ca: str | None = None
    buffer_max_bytes: int = 256 << 20


def _error_middleware():
    @web.middleware
    async def errors(request: web.Request, handler):
        try:
            return await handler(request)
        except ApiError as exc:
            return respond(request, exc.body(), status=exc.status, headers=exc.headers)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            code = AIOHTTP_ERRORS.get(exc.status, "bad_request" if exc.status < 500 else "internal")
            return respond(request, {"error": code, "message": exc.reason}, status=exc.status)
        except Exception:
            log.exception("unhandled error serving %s %s", request.method, request.path)
            return respond(request, {"error": "internal", "message": "the node hit a bug; see its log"},
                           status=500)
    return errors


def _auth_middleware(token: str):
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def auth(request: web.Request, handler):
        if request.path != "/health/live" and not console.is_public(request.path):
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                raise ApiError("unauthorized", "a valid 'Authorization: Bearer <token>' header is required")
        return await handler(request)
    return auth


def make_app(node, settings: Settings) -> web.Application:
    metrics = Metrics(node)
    node.committer_observer(metrics.observe_entry)
    middlewares = [metrics.middleware(), _error_middleware()]
    if settings.auth_token:
        middlewares.append(_auth_middleware(settings.auth_token))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_REQUEST_BYTES)
    app[NODE] = node
    app[SETTINGS] = settings

    app[buffering.BUFFER] = PutBuffer(node.data_dir / "buffer", settings.buffer_max_bytes)

    async def background(app: web.Application):
        # Node-to-node HTTP (forwarding, peer health, verify) trusts the CA
        # the operator gave, so a private CA works without touching the system store.
        ssl_context = ssl.create_default_context(cafile=settings.tls_ca) if settings.tls_ca else None
        app[HTTP] = ClientSession(connector=TCPConnector(ssl=ssl_context) if ssl_context else None)
        replay = asyncio.create_task(buffering.replay(app))
        yield
        replay.cancel()
        await app[HTTP].close()
        app[buffering.BUFFER].close()
    app.cleanup_ctx.append(background)
    events.install(app)

    q = "/v1/queues/{queue}"
    app.router.add_routes([
        web.get("/health/live", cluster.live),
        web.get("/health/ready", cluster.ready),
        web.get("/metrics", metrics.handler),
        web.get("/v1/cluster", cluster.show),
        web.post("/v1/cluster/nodes", cluster.add_node),
        web.delete("/v1/cluster/nodes/{node}", cluster.remove_node),
        web.post("/v1/cluster/verify", cluster.verify),
        web.post("/v1/cluster/leader", cluster.transfer_leadership),
        web.get("/v1/cluster/checkpoints/{token}", cluster.checkpoint),
        web.get("/v1/queues", queues.list_all),
        web.put(q, queues.create),
        web.patch(q, queues.patch),
        web.get(q, queues.show),
        web.delete(q, queues.delete),
        web.post(q + "/messages", messages.put),
        web.get(q + "/messages", messages.browse),
        web.post(q + "/receive", messages.receive),
        web.post(q + "/ack", messages.ack),
        web.post(q + "/nack", messages.nack),
        web.post(q + "/extend", messages.extend),
        web.get(q + "/groups", queues.list_groups),
        web.put(q + "/groups/{group}", queues.add_group),
        web.get(q + "/groups/{group}", queues.show_group),
        web.delete(q + "/groups/{group}", queues.delete_group),
        web.post(q + "/groups/{group}/commit", messages.commit),
        web.post("/v1/tx", messages.transaction),
        web.get("/v1/stream", stream.stream),
        web.post(q + "/redrive", queues.redrive),
        web.get("/v1/events", events.stream),
        web.get("/ui", console.root),
        web.get("/ui/", console.asset),
        web.get("/ui/{name}", console.asset),
    ])
    return app

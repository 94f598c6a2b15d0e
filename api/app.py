"""The aiohttp application: routes, auth, the error contract, metrics.

Handlers are thin: parse and validate, build a command, submit it through the
node, render the result.  The routes and the action each needs are routes.ROUTES; who
calls, and what they may do, principals.py.  Every failure leaves as {"error", "message"} with
its status (errors.py), including aiohttp's own (unknown route, body too
large) and bugs (500, logged).
"""

import asyncio
import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import ClientSession, TCPConnector, web

from raftq.engine.config import ClusterKeys, Sqs, Tokens
from raftq.statemachine.rules import CLUSTER_ACTIONS
from raftq.engine.link.receipts import Receipts
from raftq.engine.outcome import CommitError
from raftq.engine.placement import Placement
from raftq.engine.storage.put_buffer import PutBuffer

from . import buffering, caps, events, forwarding, openapi
from .disk import DiskWatch
from .codec import respond
from .connections import CONNECTIONS, ClusterConnections
from .errors import ApiError, LeadLost, Rerouted, no_quorum
from .features import ADMISSION, Admission
from .groups import Groups
from .keys import DISK, ENGINES, GROUPS, PLACEMENT
from .leader import HTTP, NODE, SETTINGS, after_lead_lost
from .limits import Limits
from .metrics import Metrics
from .principals import PRINCIPAL, PRINCIPALS, Principals, forbidden
from .receipt_mode import MODE, ReceiptMode
from .receipts import RECEIPTS
from .routes import AUTHENTICATED, ROUTES, SIGV4

log = logging.getLogger(__name__)

AIOHTTP_ERRORS = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}


@dataclass(frozen=True)
class Settings:
    tokens: Tokens = field(default_factory=Tokens)
    sqs: Sqs = field(default_factory=Sqs)
    max_message_bytes: int = 1 << 20
    write_timeout_s: float = 10.0
    scheme: str = "http"
    tls_ca: str | None = None
    buffer_max_bytes: int = 256 << 20
    scrub_pass_hours: float = 24.0
    limits: Limits = field(default_factory=Limits)
    keys: ClusterKeys = field(default_factory=lambda: ClusterKeys.derive(None))
    # --disk-free-limit: the disk alarm's reserve (api/disk.py); None: its default, 0: no alarm
    disk_free_limit: int | None = None


def _error_middleware():
    @web.middleware
    async def errors(request: web.Request, handler):
        try:
            try:
                return await handler(request)
            except (LeadLost, Rerouted) as again:
                # Nothing of the request was written: served once more, the
                # route holding it through the election and sending it where
                # the lead went (or serving it here if this node won again),
                # or where the catalog places its queue now.
                log.info("%s %s served again: %s", request.method, request.path, again.message)
                if isinstance(again, LeadLost):
                    await after_lead_lost(again)
                return await handler(request)
        except ApiError as exc:
            return respond(request, exc.body(), status=exc.status, headers=exc.headers)
        except CommitError as exc:
            if exc.code != "engine_gone":
                return _internal(request)
            # an engine of this node stopped (on a storage failure its supervisor starts it again):
            # the node is not broken, and the request may be retried here or elsewhere
            gone = no_quorum("an engine of this node is being started again; retry")
            return respond(request, gone.body(), status=gone.status, headers=gone.headers)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            code = AIOHTTP_ERRORS.get(exc.status, "bad_request" if exc.status < 500 else "internal")
            return respond(request, {"error": code, "message": exc.reason}, status=exc.status)
        except Exception:
            return _internal(request)
    return errors


def _internal(request: web.Request) -> web.Response:
    log.exception("unhandled error serving %s %s", request.method, request.path)
    return respond(request, {"error": "internal", "message": "the node hit a bug; see its log"}, status=500)


def _auth_middleware(principals: Principals):
    routes = {(r.method, r.template): r for r in ROUTES}

    @web.middleware
    async def auth(request: web.Request, handler):
        resource = request.match_info.route.resource
        method = "GET" if request.method == "HEAD" else request.method
        # an unknown route is answered 404 only to a caller with a token
        route = routes.get((method, resource.canonical)) if resource is not None else None
        actions = route.actions if route is not None else (AUTHENTICATED,)
        if actions == (None,) or actions == (SIGV4,):   # open, or the SQS endpoint, which checks its signatures
            return await handler(request)
        # surrogateescape: aiohttp decodes non-UTF-8 header bytes that way
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        principal = await principals.authenticate(given)
        if principal is None:
            principals.refused(request, None, "|".join(actions), None)
            raise ApiError("unauthorized", "a valid 'Authorization: Bearer <token>' header is required")
        request[PRINCIPAL] = principal
        if actions != (AUTHENTICATED,):
            # the path's queue, else (a cluster action, or a route that names its queues in its
            # body or lists them) the action on some queue; the handler checks the rest
            queue = request.match_info.get("queue")
            if not any(principal.allows(action, None if action in CLUSTER_ACTIONS else queue) for action in actions):
                action = "|".join(actions)
                principals.refused(request, principal, action, queue)
                raise forbidden(principal, action, queue)
        return await handler(request)
    return auth


def make_app(engines: dict, placement: Placement, settings: Settings, buffer_dir: Path, *,
             first_front: bool = True) -> web.Application:
    """The application of one front, over the node's engines (group id ->
    ``engine.link.remote.RemoteNode``) and the cluster's `placement`; the node's
    first front logs what happens to the node as a whole (its disk alarm)."""
    node = engines[0]
    buffer = PutBuffer(buffer_dir, settings.buffer_max_bytes)
    groups = Groups(engines, placement)
    disk = DiskWatch(groups, settings.scheme, settings.disk_free_limit, logs=first_front)
    metrics = Metrics(engines, buffer, disk, settings.limits.max_stored_bytes,
                      None if groups.count == 1 else caps.catalog_names_limit(settings.limits, groups.count))
    app = web.Application(client_max_size=settings.limits.max_request_bytes)
    app[SETTINGS] = settings
    app[GROUPS] = groups
    app[PRINCIPALS] = principals = Principals(app, metrics.registry)
    app.middlewares.extend([metrics.middleware(), _error_middleware()])
    if settings.tokens.any():
        app.middlewares.append(_auth_middleware(principals))
    app[ENGINES] = engines
    app[PLACEMENT] = placement
    app[NODE] = node
    app[DISK] = disk

    app[RECEIPTS] = Receipts(settings.keys.receipts)
    app[MODE] = ReceiptMode(app)
    app[ADMISSION] = Admission(app)
    app[CONNECTIONS] = cluster_connections = ClusterConnections(app)
    app[buffering.BUFFER] = buffer
    app[buffering.BUFFERED] = asyncio.Event()

    async def background(app: web.Application):
        # Node-to-node HTTP (forwarding, peer health, verify) trusts the CA
        # the operator gave, so a private CA works without touching the system store. A node's own
        # calls have their pool; clients' calls it forwards have theirs (api/forwarding.py).
        ssl_context = ssl.create_default_context(cafile=settings.tls_ca) if settings.tls_ca else None
        app[HTTP] = ClientSession(connector=TCPConnector(ssl=ssl_context) if ssl_context else None)
        forwarding.sessions(app, ssl_context)
        replay = asyncio.create_task(buffering.replay(app))
        app[MODE].start()
        principals.start()
        cluster_connections.start()
        disk.start_with(app[HTTP])
        yield
        disk.stop()
        cluster_connections.stop()
        principals.stop()
        app[MODE].stop()
        replay.cancel()
        await forwarding.close(app)
        await app[HTTP].close()
        app[buffering.BUFFER].close()
    app.cleanup_ctx.append(background)

    async def release_held(app: web.Application):
        disk.release_held()      # held GET /health/disk answers, which shutdown would otherwise wait for
    app.on_shutdown.append(release_held)
    events.install(app)

    document = openapi.document(ROUTES, limits=settings.limits.as_dict())

    async def serve_document(request: web.Request) -> web.Response:
        return web.json_response(document)

    special = {"/v1/openapi.json": serve_document, "/metrics": metrics.handler}
    app.router.add_routes([web.route(r.method, r.path, r.handler or special[r.path]) for r in ROUTES])
    return app

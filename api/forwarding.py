"""A client's call that a node sends on to the node that serves it (the SQS door's forwarding,
and the native API's on ``X-Raftq-Forward: 1``), on connections no client can take from another.

Forwarded calls have pools of their own, apart from the node's own calls to its peers
(``HTTP``: catalog lookups, health, gathering): one for calls that wait for a message
(``LONG_POLLS``: a ReceiveMessage, a native receive), as many connections as the node takes
waiting receives (--max-long-polls), and one for every other call (``FORWARDS``). A call that
waits holds its connection for up to 20 s: sharing aiohttp's one pool of 100, 100 of them
made every other client's forwarded call wait that long or fail. A call that waits is
counted here by the client that made it, as the node counts its own long polls
(--max-long-polls, --max-long-polls-per-client): beyond either it is refused at once, 429
``too_many_waiters``, rather than queued for a connection.

The node it goes to counts a long poll by the client too, not by the forwarding node's
address (``client_of``): the forwarding node names the client in ``X-Raftq-Client``, with a
MAC under the cluster's forwarding key (``ClusterKeys.forwarding``) and the time, so that no
client can name another address than its own to pass its share.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import hmac
import time

from aiohttp import ClientSession, TCPConnector, web

from .errors import ApiError
from .keys import SETTINGS

FORWARDS = web.AppKey("forwards", ClientSession)
LONG_POLLS = web.AppKey("forwarded_long_polls", ClientSession)
WAITING = web.AppKey("forwarded_waiting", collections.Counter)
FORWARDS_PER_HOST = 100
CLIENT_HEADER = "X-Raftq-Client"
# How long a forwarded call's client header is taken: a forward is sent the moment it is made
CLIENT_HEADER_VALID_S = 60


def sessions(app: web.Application, ssl_context) -> None:
    """The forwarding pools, made in the application's loop (its cleanup closes them)."""
    limits = app[SETTINGS].limits
    app[FORWARDS] = ClientSession(connector=TCPConnector(ssl=ssl_context or True, limit=0,
                                                         limit_per_host=FORWARDS_PER_HOST))
    app[LONG_POLLS] = ClientSession(connector=TCPConnector(ssl=ssl_context or True, limit=limits.max_long_polls))
    app[WAITING] = collections.Counter()


async def close(app: web.Application) -> None:
    await app[FORWARDS].close()
    await app[LONG_POLLS].close()


def _mac(app: web.Application, client: str, stamp: str) -> str:
    return hmac.new(app[SETTINGS].keys.forwarding, f"{client};{stamp}".encode(), hashlib.sha256).hexdigest()[:32]


def client_header(request: web.Request) -> str:
    client = client_of(request)
    stamp = str(int(time.time()))
    return f"{client};{stamp};{_mac(request.app, client, stamp)}"


def client_of(request: web.Request) -> str:
    """The address of the client that made the call: the one another node forwarded it for (when
    that node's MAC holds), else the connection's."""
    given = request.headers.get(CLIENT_HEADER)
    if given:
        client, _, rest = given.partition(";")
        stamp, _, mac = rest.partition(";")
        if stamp.isascii() and stamp.isdigit() and abs(time.time() - int(stamp)) <= CLIENT_HEADER_VALID_S \
                and hmac.compare_digest(mac, _mac(request.app, client, stamp)):
            return client
    return request.remote or ""


@contextlib.contextmanager
def _waiting(request: web.Request):
    """A forwarded long poll's place, by client, within this node's caps."""
    limits = request.app[SETTINGS].limits
    waiting, client = request.app[WAITING], client_of(request)
    if sum(waiting.values()) >= limits.max_long_polls:
        raise ApiError("too_many_waiters", f"{limits.max_long_polls} receives are already waiting on this node "
                                           "(--max-long-polls); retry later or poll another way",
                       headers={"Retry-After": "1"})
    if waiting[client] >= limits.max_long_polls_per_client:
        raise ApiError("too_many_waiters", f"{limits.max_long_polls_per_client} receives of this client address "
                                           "are already waiting on this node (--max-long-polls-per-client); retry "
                                           "later", headers={"Retry-After": "1"})
    waiting[client] += 1
    try:
        yield
    finally:
        waiting[client] -= 1
        if not waiting[client]:
            del waiting[client]


async def forward(request: web.Request, url: str, *, body: bytes, headers, timeout, waits: bool,
                  relayed: tuple[str, ...]) -> web.Response:
    """The answer of the node at `url` to the call, sent on with `body` and `headers` (those
    `relayed` of its answer's kept); `waits`: it may wait for a message. Raises the pool's
    ApiError too_many_waiters, and aiohttp's ClientError or TimeoutError."""
    headers[CLIENT_HEADER] = client_header(request)
    with _waiting(request) if waits else contextlib.nullcontext():
        async with request.app[LONG_POLLS if waits else FORWARDS].request(
                request.method, url, data=body, headers=headers, allow_redirects=False,
                skip_auto_headers=("User-Agent",), timeout=timeout) as upstream:
            answer = await upstream.read()
            return web.Response(body=answer, status=upstream.status,
                                headers={h: upstream.headers[h] for h in relayed if h in upstream.headers},
                                content_type=upstream.content_type)


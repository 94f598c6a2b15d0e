"""A principal's connections quota counted for the cluster (docs/security.md, "Quotas"): each
streaming-wire connection or event stream of a principal with one is a lease that group 0's
leader holds (engine/quotas.py ``ConnectionLeases``), asked for before the connection is taken.

A front asks group 0's leader for a lease (its own engine when it leads, else through
``POST /v1/cluster/connections``, node to node, as api/group_calls.py calls a leader), releases
it when the connection closes, and renews all of its leases in one call every third of a lease
while any live: a node that dies, or is cut off, stops renewing, and its connections leave the
count within a lease. A refusal past the quota is 429; a group 0 that cannot answer (no leader,
or one new in its term and still relearning the connections open) is 503 with Retry-After: a
connection is refused rather than let past a quota nobody counts.

Every node must know the route and the engine's calls first (``FEATURE``, api/features.py):
until every node says so, a node counts the connections it holds itself, as before
(engine/quotas.py ``Holds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import secrets

from aiohttp import ClientError, ClientTimeout, web

from raftq.engine.background import Background
from raftq.engine.link.remote import CONNECTION_LEASE_S
from raftq.engine.outcome import CommitError
from raftq.statemachine.validation import is_int
from raftq.wire_format import is_name

from .codec import read_body, respond
from .errors import ApiError, no_quorum
from .features import AskedFeature
from .group_calls import NotYet, call_group_leader
from .keys import GROUPS
from .leader import route_to_leader
from .principals import Principal

log = logging.getLogger(__name__)

FEATURE = "cluster_connections"
PATH = "/v1/cluster/connections"
RENEW_EVERY_S = CONNECTION_LEASE_S / 3
# A connection waits this long at most for group 0's leader to count it; a renewal is due again
# within a third of a lease anyway.
ASK_TIMEOUT = ClientTimeout(total=5)
CONNECTIONS = web.AppKey("connections", object)
LEASE_ID = re.compile("[0-9a-f]{32}")
MAX_RENEWED = 100_000


class Refused(Exception):
    """Group 0's leader counts `limit` connections of the principal already."""


async def _answer_here(engine, body: dict) -> dict:
    """What group 0's leader, this node's `engine`, does with a front's call: a release, a renewal,
    a hold (any of them). CommitError not_leader when it does not lead."""
    if "release" in body:
        await engine.lease_release(body["release"]["principal"], body["release"]["lease"])
    if "renew" in body:
        await engine.lease_renew(body["renew"])
    if "hold" in body:
        hold = body["hold"]
        held = await engine.lease_hold(hold["principal"], hold["lease"], hold["limit"])
        return {"held": held} if isinstance(held, bool) else {"held": False, "relearning_s": held}
    return {}


async def leases(request: web.Request) -> web.Response:
    """On group 0's leader: a front's hold, renewal or release of its connections' leases."""
    elsewhere = await route_to_leader(request, group=0)
    if elsewhere is not None:
        return elsewhere
    body = _checked(await read_body(request))
    try:
        return respond(request, await _answer_here(request.app[GROUPS].catalog, body))
    except CommitError as exc:
        raise no_quorum(f"group 0's leader moved while counting connections ({exc.code})") from None


def _checked(body) -> dict:
    """400 unless `body` is a front's call as the route's schema says (the engine takes it as is)."""
    def lease(pair, *more) -> bool:
        return isinstance(pair, dict) and pair.keys() == {"principal", "lease", *more} and is_name(pair["principal"]) \
            and isinstance(pair["lease"], str) and LEASE_ID.fullmatch(pair["lease"]) is not None
    valid = isinstance(body, dict) and body.keys() <= {"hold", "renew", "release"}
    if valid and "hold" in body:
        valid = lease(body["hold"], "limit") and is_int(body["hold"]["limit"]) and body["hold"]["limit"] >= 0
    if valid and "renew" in body:
        renew = body["renew"]
        valid = isinstance(renew, list) and len(renew) <= MAX_RENEWED and all(
            isinstance(pair, list) and len(pair) == 2 and lease({"principal": pair[0], "lease": pair[1]})
            for pair in renew)
    if valid and "release" in body:
        valid = lease(body["release"])
    if not valid:
        raise ApiError("bad_request", "give hold {principal, lease, limit}, renew [[principal, lease], ...] or "
                                      "release {principal, lease}: a principal's name, a lease of 32 hex digits")
    return body


class ClusterConnections(Background):
    """This front's leases on group 0's leader: lease id -> principal; renewed while they live."""

    def __init__(self, app: web.Application):
        self._app = app
        self._feature = AskedFeature(app, FEATURE, "connections counted for the cluster")
        self._held: dict[str, str] = {}
        self._releasing: set[asyncio.Task] = set()

    async def for_the_cluster(self) -> bool:
        """Whether connections are counted by group 0's leader now; else each node counts its own,
        as an older release that runs somewhere does."""
        try:
            return await self._feature.everywhere()
        except (CommitError, ClientError, asyncio.TimeoutError):
            return False

    async def hold(self, principal: str, limit: int) -> str:
        """The lease of one more connection of `principal`; Refused past `limit`, ApiError 503
        when group 0 cannot count it now."""
        lease = secrets.token_hex(16)
        try:
            answer = await self._on_leader({"hold": {"principal": principal, "lease": lease, "limit": limit}})
        except (NotYet, ClientError, asyncio.TimeoutError) as exc:
            raise ApiError("no_quorum", f"group 0's leader, which counts principal {principal!r}'s connections, "
                                        f"did not answer ({exc}): retry later", headers={"Retry-After": "1"}) from None
        if "relearning_s" in answer:
            raise ApiError("no_quorum", f"group 0's leader is new and learns the connections open for "
                                        f"{answer['relearning_s']:.1f} s more before it counts a new one: retry then",
                           headers={"Retry-After": str(max(1, math.ceil(answer["relearning_s"])))})
        if not answer.get("held"):
            raise Refused()
        self._held[lease] = principal
        return lease

    def release(self, lease: str) -> None:
        """The connection closed: renewed no more, and released now (if that fails, it expires)."""
        principal = self._held.pop(lease, None)
        if principal is None:
            return
        task = asyncio.ensure_future(self._release(principal, lease))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release(self, principal: str, lease: str) -> None:
        try:
            await self._on_leader({"release": {"principal": principal, "lease": lease}})
        except (NotYet, ClientError, asyncio.TimeoutError) as exc:
            log.info("a connection's lease of %s is left to expire: %s", principal, exc)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(RENEW_EVERY_S)
            if not self._held:
                continue
            try:
                await self._on_leader({"renew": [[principal, lease] for lease, principal in self._held.items()]})
            except (NotYet, ClientError, asyncio.TimeoutError) as exc:
                log.info("renewing %d connections' leases on group 0's leader: %s; trying again",
                         len(self._held), exc)

    async def _on_leader(self, body: dict) -> dict:
        catalog = self._app[GROUPS].catalog
        if catalog.view()["role"] == "leader":
            try:
                return await _answer_here(catalog, body)
            except CommitError:
                pass          # it stepped down just now: the leader's front knows where it went
        return await call_group_leader(self._app, "POST", PATH, body, timeout=ASK_TIMEOUT) or {}


@contextlib.asynccontextmanager
async def held_connection(app: web.Application, principal: Principal | None):
    """A long-lived connection of `principal` (the streaming wire, an event stream), counted while
    it lasts; 429 quota_exceeded when it holds its connections quota already."""
    limit = None if principal is None else principal.quotas.get("connections")
    if limit is None:
        yield
        return
    cluster = app[CONNECTIONS]
    if await cluster.for_the_cluster():
        try:
            lease = await cluster.hold(principal.name, limit)
        except Refused:
            raise _over(principal, limit, "") from None
        try:
            yield
        finally:
            cluster.release(lease)
        return
    node = app[GROUPS].catalog
    if not await node.hold(principal.name, limit):
        raise _over(principal, limit, " on this node")
    try:
        yield
    finally:
        node.release(principal.name)


def _over(principal: Principal, limit: int, where: str) -> ApiError:
    return ApiError("quota_exceeded", f"principal {principal.name!r} holds {limit} connections{where} already "
                                      "(its connections quota): close one first",
                    principal=principal.name, quota="connections", limit=limit, headers={"Retry-After": "1"})

"""Who calls, and whether they may: the principals a front takes, and the checks every door makes
(docs/security.md, "Principals").

A caller is a principal: one of cluster.toml's bootstrap tokens (``admin``, ``data``,
``metrics``, acting as their role's rules: statemachine/rules.py), one of its ``[sqs]`` keys
(its role's), or a principal group 0 keeps (statemachine/principals.py), by its bearer token or
its SQS key. ``Principals`` holds what this front takes: the bootstrap ones, and the kept ones
as its replica of group 0 has applied them: read all again whenever their version changes in
the view group 0's engine pushes (at once after it applied a change), at least every
BACKSTOP_S, and, at most every MIN_REFRESH_GAP_S, when a call brings a token or key it does not
know, so that a principal made, changed or removed anywhere takes effect on every node within a
second, without a restart (it was a poll of the version every 0.2 s: most of what an idle front
did besides its disk alarm).

A kept principal's token is known here only by its hash: HMAC-SHA256 under a key derived from
the cluster secret (``ClusterKeys.principal_tokens``). A token is 256 random bits, so no
dictionary or brute force finds one from its hash, however fast the hash: a slow, salted hash
(bcrypt, Argon2) protects guessable passwords and would cost milliseconds on every call; the
key makes a copied log or snapshot useless for checking guesses without the cluster secret, and
the hash is the table's key, so finding the principal compares nothing byte by byte.

``authorize`` is the one check: the action a request needs on each queue it names; refused, it
is 403 ``forbidden`` naming the principal, the action and the queue, counted in
``raftq_auth_denied_total{principal,action}`` and kept among this front's recent denials
(``GET /v1/principals/events``), and nothing has changed. Every door calls it before it writes
or places anything: the route table's action on the path's queue (the auth middleware), then
each queue a request names beyond its path (a transaction's, a redrive's source, a dead-letter
target, a stage's queue), each frame of the streaming wire, each SQS action.

What a principal's commands carry for the state machine's quotas (``acting``), its puts' rate
(``charge``) and its long polls (``long_poll_cap``) are here too (its connections:
api/connections.py). A command carries its principal only once a principal was made through
``/v1/principals`` (``Principals.in_use``), which every node had to run a release that knows
principals for (``FEATURE``): an older replica would apply such a command without its quotas.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import hmac
import logging
import time
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import Counter

from raftq.engine.background import Background
from raftq.engine.config import SqsKey
from raftq.engine.outcome import CommitError
from raftq.statemachine.quotas import share
from raftq.statemachine.rules import CLUSTER_ACTIONS, PUT, REDRIVE, ROLE_RULES, allows, normalized, patterns

from .errors import ApiError
from .keys import GROUPS, SETTINGS
from .sqs.sealing import unseal

log = logging.getLogger(__name__)

FEATURE = "principals"       # api/features.py
PRINCIPALS = web.AppKey("principals", object)
PRINCIPAL = "raftq_principal"         # a request's key: who it is (the auth middleware, the SQS door)
BACKSTOP_S = 5.0
MIN_REFRESH_GAP_S = 0.2
# A put refused for its principal's put_rate is answered this much later (with Retry-After 0: the
# wait is served): a flood's connections then send a request a second each, and the front, which
# serves its connections in turn, spends its time on the other tenants' requests. A client within
# its rate never waits; one past it would wait as long for Retry-After anyway.
RATE_REFUSAL_HELD_S = 1.0
DENIALS_KEPT = 200
# What a store or a write is charged: the messages it brings into the log.
CHARGED = {"put": lambda c: len(c["messages"]), "tx": lambda c: sum(len(p["messages"]) for p in c.get("put", [])),
           "stage": lambda c: len(c["messages"])}
# The commands whose queues (or bytes) the state machine holds to the principal's quotas.
ACTING = frozenset({"put", "tx", "stage_commit", "create_queue", "patch_queue", "assign"})


@dataclass(frozen=True, eq=False)
class Principal:
    name: str
    rules: tuple
    quotas: dict = field(default_factory=dict)
    kept: bool = True          # kept by the cluster (else cluster.toml's)
    token_hash: bytes | None = field(default=None, repr=False)

    def allows(self, action: str, queue: str | None = None) -> bool:
        """Whether it may `action` on `queue` (a cluster action, or no queue: on some queue)."""
        return allows(self.rules, action, queue)


def of_role(name: str, role: str) -> Principal:
    return Principal(name, tuple(normalized(ROLE_RULES[role])), kept=False)


def token_hash(app: web.Application, token: str) -> bytes:
    return hmac.new(app[SETTINGS].keys.principal_tokens, token.encode(), hashlib.sha256).digest()


class Principals(Background):
    """This front's principals: the bootstrap ones and the kept ones, found by token or SQS key."""

    def __init__(self, app: web.Application, registry):
        self._app = app
        settings = app[SETTINGS]
        self._bootstrap = [(f"Bearer {token}".encode(), of_role(role, role))
                           for role in ("admin", "data", "metrics") if (token := getattr(settings.tokens, role))]
        self.configured_keys = {key.access_key: (key, of_role(key.access_key, key.role)) for key in settings.sqs.keys}
        self._by_hash: dict[bytes, Principal] = {}
        self._by_name: dict[str, Principal] = {}
        self.kept_keys: dict[str, tuple[SqsKey, Principal]] = {}
        self._seals: dict[str, bytes] = {}
        self.version = -1
        self._read_at = float("-inf")
        self._reading: asyncio.Task | None = None
        self._changed: asyncio.Future | None = None      # resolved, and replaced, at every change
        # a principal was made through /v1/principals: every node runs a release that knows them
        self.in_use = False
        self.denied = Counter("raftq_auth_denied", "Requests refused 403: a principal's rules did not allow the "
                              "action on a queue it named (principal - : no valid credentials, 401)",
                              ["principal", "action"], registry=registry)
        self.denials: collections.deque = collections.deque(maxlen=DENIALS_KEPT)

    # ---- finding the caller ----------------------------------------------------------------------
    async def authenticate(self, authorization: bytes) -> Principal | None:
        """The principal of an Authorization header's bytes, or None."""
        found = None
        for expected, principal in self._bootstrap:    # every comparison runs: no timing hint
            if hmac.compare_digest(authorization, expected):
                found = principal
        if found is not None or not authorization.startswith(b"Bearer "):
            return found
        try:
            token = authorization[7:].decode("ascii")
        except UnicodeDecodeError:
            return None
        hashed = token_hash(self._app, token)
        principal = self._by_hash.get(hashed)
        if principal is None and self._may_refresh():
            await self.refresh()
            principal = self._by_hash.get(hashed)
        return principal

    async def sqs_key(self, access_key: str) -> tuple[SqsKey, Principal] | None:
        """The SQS key of `access_key` and its principal (cluster.toml's, or one the cluster keeps)."""
        found = self.configured_keys.get(access_key) or self.kept_keys.get(access_key)
        if found is None and self._may_refresh():
            await self.refresh()
            found = self.kept_keys.get(access_key)
        return found

    def any_sqs_keys(self) -> bool:
        return bool(self.configured_keys or self.kept_keys)

    def current(self, principal: Principal) -> Principal | None:
        """`principal` as this front knows it now, for a connection it opened: cluster.toml's as it
        was, a kept one by its token as last read (None: revoked, or its token replaced)."""
        if not principal.kept or principal.token_hash is None:
            return principal if not principal.kept else self._by_name.get(principal.name)
        return self._by_hash.get(principal.token_hash)

    def _may_refresh(self) -> bool:
        return time.monotonic() - self._read_at >= MIN_REFRESH_GAP_S

    # ---- reading group 0's replica ---------------------------------------------------------------
    async def refresh(self) -> None:
        """Read the principals again if they changed; concurrent callers share one read."""
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._read())
        await asyncio.shield(self._reading)

    async def _read(self) -> None:
        self._read_at = time.monotonic()
        catalog = self._app[GROUPS].catalog
        try:
            version, _ = await catalog.read("principals_version")
            if version == self.version:
                return
            listing, _ = await catalog.read("list_principals")
        except CommitError:
            return
        by_hash, by_name, keys, seals = {}, {}, {}, {}
        for kept in listing["principals"]:
            principal = Principal(kept["name"], tuple(kept["rules"]), kept["quotas"], token_hash=kept["token_hash"])
            by_name[principal.name] = principal
            if kept["token_hash"] is not None:
                by_hash[kept["token_hash"]] = principal
            for access_key, sealed in kept["sqs_keys"].items():
                old = self.kept_keys.get(access_key)
                key = old[0] if old is not None and self._seals.get(access_key) == sealed else \
                    unseal(self._app, access_key, kept["role"], sealed)
                if key is None:
                    log.error("SQS key %s is kept sealed under another cluster secret; it is not taken", access_key)
                    continue
                keys[access_key], seals[access_key] = (key, principal), sealed
        if by_name.keys() != self._by_name.keys():
            log.info("principals: %d kept by the cluster", len(by_name))
        self._by_hash, self._by_name, self.kept_keys, self._seals = by_hash, by_name, keys, seals
        self.in_use = any(kept["role"] is None for kept in listing["principals"])
        self.version = listing["version"]
        if self._changed is not None:
            changed, self._changed = self._changed, None
            changed.set_result(None)

    async def next_change(self) -> None:
        """Return once the principals this front takes changed."""
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._changed)

    async def _run(self) -> None:
        catalog = self._app[GROUPS].catalog
        while True:
            if catalog.view().get("principals_version") != self.version:
                await self.refresh()
                if catalog.view().get("principals_version") != self.version:
                    await asyncio.sleep(MIN_REFRESH_GAP_S)   # not read (the engine busy or away): again soon
                    continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(catalog.next_view(), BACKSTOP_S)

    # ---- refusals ---------------------------------------------------------------------------------
    def refused(self, request: web.Request | None, principal: Principal | None, action: str,
                queue: str | None) -> None:
        """Count and keep one refusal (None: a caller without valid credentials)."""
        name = principal.name if principal is not None else "-"
        self.denied.labels(name, action).inc()
        self.denials.append({"at_ms": int(time.time() * 1000), "principal": name, "action": action, "queue": queue,
                             "client": request.remote if request is not None else None})


def forbidden(principal: Principal, action: str, queue: str | None) -> ApiError:
    where = f" on queue {queue!r}" if queue is not None else ("" if action in CLUSTER_ACTIONS else " on any queue")
    return ApiError("forbidden", f"principal {principal.name!r} may not {action}{where}: no rule of it allows it",
                    principal=principal.name, action=action, **({"queue": queue} if queue is not None else {}))


def denial(app: web.Application, request: web.Request | None, principal: Principal, action: str,
           queues) -> tuple[str, str | None] | None:
    """The first (action, queue) of `queues` (a queue None: the action on some queue, or a cluster
    action) `principal` may not do, counted and kept as a refusal; None when it may do them all."""
    for queue in queues:
        if not principal.allows(action, queue):
            app[PRINCIPALS].refused(request, principal, action, queue)
            return action, queue
    return None


def authorize(request: web.Request, action: str, queues) -> None:
    """403 forbidden unless the request's principal may `action` on every one of `queues` (a node
    without tokens, --insecure-no-auth, has no principals: everything is allowed)."""
    principal = request.get(PRINCIPAL)
    if principal is None:
        return
    refused = denial(request.app, request, principal, action, queues)
    if refused is not None:
        raise forbidden(principal, *refused)


def may_touch(principal: Principal | None, queue: str) -> bool:
    """Whether any queue action of the principal's rules names `queue`: what lists show it (no
    principal: a node without tokens shows everything)."""
    return principal is None or any(principal.allows(action, queue) for rule in principal.rules
                                    for action in rule["actions"] if action not in CLUSTER_ACTIONS)


# ---- what commands carry ---------------------------------------------------------------------------

def acting(app: web.Application, principal: Principal | None, command: dict) -> None:
    """Put into `command` what the state machine holds a principal's command to: its name and
    quotas, and the queues it may touch that only the state names (a redrive's sources, a stage
    commit's stages). Nothing until a principal was made (``Principals.in_use``)."""
    if principal is None or not app[PRINCIPALS].in_use:
        return
    op = command["op"]
    if op in ACTING:
        command["principal"] = principal.name
        command["quotas"] = dict(principal.quotas)
    if op == "redrive":
        command["allowed_queues"] = patterns(principal.rules, REDRIVE)
    elif op == "stage_commit":
        command["principal"] = principal.name
        command["allowed_queues"] = patterns(principal.rules, PUT)


def charge(app: web.Application, principal: Principal | None, group: int, command: dict) -> list | None:
    """What `command` costs of its principal's put_rate in `group` (engine/quotas.py ``PutRates``):
    [principal, messages, this group's share of the rate], or None."""
    rate = None if principal is None else principal.quotas.get("put_rate")
    count = CHARGED.get(command["op"])
    if rate is None or count is None:
        return None
    groups = app[GROUPS].count
    return [principal.name, count(command), rate / groups]


def long_poll_cap(app: web.Application, principal: Principal | None, group: int) -> list | None:
    """[principal, the waiting receives it may hold in `group`'s leader], or None."""
    limit = None if principal is None else principal.quotas.get("long_polls")
    if limit is None:
        return None
    return [principal.name, share(limit, app[GROUPS].count, group)]


def quota_refusal(principal: Principal | None, code: str, group: int, app: web.Application) -> ApiError:
    """The 429 of a quota the engine holds, from its CommitError code."""
    name = principal.name if principal is not None else "?"
    if code == "rate_limited":
        rate = principal.quotas.get("put_rate") if principal is not None else None
        return ApiError("quota_exceeded", f"principal {name!r} puts more than its put_rate quota of {rate} messages "
                                          "a second: retry later", principal=name, quota="put_rate", limit=rate,
                        headers={"Retry-After": "0"})
    limit = principal.quotas.get("long_polls") if principal is not None else None
    held = share(limit, app[GROUPS].count, group) if limit is not None else None
    return ApiError("quota_exceeded", f"principal {name!r} has {held} receives waiting already (its long_polls quota "
                                      f"is {limit}" + ("" if app[GROUPS].count == 1 else
                                                       f", {held} of them in Raft group {group}") + "): retry later",
                    principal=name, quota="long_polls", limit=limit, headers={"Retry-After": "1"})


QUOTA_CODES = frozenset({"rate_limited", "too_many_principal_waiters"})

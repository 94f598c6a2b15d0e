"""The SQS API's keys: those of cluster.toml's ``[sqs]``, and those the cluster keeps in group 0's
log (statemachine/credentials.py), which ``raftq sqs key add|list|remove`` and ``raftq up --sqs``
make and remove through ``/v1/sqs/keys`` without editing a file or restarting a node.

A kept key's secret is sealed here before it enters the log (AES-256-GCM under
``ClusterKeys.sqs_secrets``, derived from the cluster secret, with the access key id and role as
associated data), and opened by each front that reads it: SigV4 needs the secret itself, and the
log, the snapshots and their backups then hold none. A node makes a new key's id and secret (of
AWS's shape: ``AKIA`` and 16 base-32 characters; 40 base-64 characters), answers them once to
the admin who asked, and logs neither.

Each front holds the keys it takes (``SqsKeys``): cluster.toml's, and group 0's as its local
replica has applied them, read again every REFRESH_S and, at most every MIN_REFRESH_GAP_S,
when a call names a key it does not know yet, so that a key just added works at once.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import secrets
import time

from aiohttp import web
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from raftq.engine.background import Background
from raftq.engine.config import SQS_ROLES, SqsKey
from raftq.engine.outcome import CommitError

from .. import commands
from ..codec import read_body, respond
from ..errors import ApiError
from ..features import features_of
from ..keys import GROUPS, SETTINGS
from ..leader import route_to_leader

log = logging.getLogger(__name__)

FEATURE = "sqs_keys"        # api/features.py
KEYS = web.AppKey("sqs_keys", object)
REFRESH_S = 1.0
MIN_REFRESH_GAP_S = 0.2
NONCE_BYTES = 12
ACCESS_KEY_PREFIX = "AKIA"
BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
SECRET_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def new_key(role: str) -> SqsKey:
    access_key = ACCESS_KEY_PREFIX + "".join(secrets.choice(BASE32) for _ in range(16))
    return SqsKey(access_key, "".join(secrets.choice(SECRET_ALPHABET) for _ in range(40)), role)


def _associated(access_key: str, role: str) -> bytes:
    return f"raftq sqs key\n{access_key}\n{role}".encode()


def seal(app: web.Application, key: SqsKey) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    aead = AESGCM(app[SETTINGS].keys.sqs_secrets)
    return nonce + aead.encrypt(nonce, key.secret_key.encode(), _associated(key.access_key, key.role))


def unseal(app: web.Application, access_key: str, role: str, sealed: bytes) -> SqsKey | None:
    """The key, or None when its seal does not open with this cluster's secret."""
    aead = AESGCM(app[SETTINGS].keys.sqs_secrets)
    try:
        secret = aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], _associated(access_key, role))
    except (InvalidTag, ValueError):
        return None
    return SqsKey(access_key, secret.decode(), role)


class SqsKeys(Background):
    def __init__(self, app: web.Application):
        self._app = app
        self.configured = {key.access_key: key for key in app[SETTINGS].sqs.keys}
        self.kept: dict[str, SqsKey] = {}
        self._seals: dict[str, bytes] = {}
        self._read_at = float("-inf")
        self._reading: asyncio.Task | None = None

    def any(self) -> bool:
        return bool(self.configured or self.kept)

    async def find(self, access_key: str) -> SqsKey | None:
        key = self.configured.get(access_key) or self.kept.get(access_key)
        if key is None and time.monotonic() - self._read_at >= MIN_REFRESH_GAP_S:
            await self.refresh()
            key = self.kept.get(access_key)
        return key

    async def refresh(self) -> None:
        """Read the kept keys again; concurrent callers share one read."""
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._read())
        await asyncio.shield(self._reading)

    async def _read(self) -> None:
        self._read_at = time.monotonic()
        try:
            result, _ = await self._app[GROUPS].catalog.read("sqs_keys")
        except CommitError:
            return
        kept, seals = {}, {}
        for entry in result["keys"]:
            access_key, sealed = entry["access_key"], entry["sealed"]
            key = self.kept.get(access_key) if self._seals.get(access_key) == sealed else None
            if key is None:
                key = unseal(self._app, access_key, entry["role"], sealed)
            if key is None:
                log.error("SQS key %s is kept sealed under another cluster secret; it is not taken", access_key)
                continue
            kept[access_key], seals[access_key] = key, sealed
        if kept.keys() != self.kept.keys():
            log.info("SQS API: %d keys (%d kept by the cluster, %d in cluster.toml)",
                     len(kept) + len(self.configured), len(kept), len(self.configured))
        self.kept, self._seals = kept, seals

    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(REFRESH_S)


# ---- /v1/sqs/keys ----------------------------------------------------------------------------

def _listed(request: web.Request, kept: list) -> dict:
    configured = request.app[KEYS].configured
    return {"account": request.app[SETTINGS].sqs.account,
            "keys": [{"access_key": k["access_key"], "role": k["role"], "kept_by": "cluster"} for k in kept]
            + [{"access_key": k.access_key, "role": k.role, "kept_by": "cluster.toml"} for k in configured.values()]}


async def list_keys(request: web.Request) -> web.Response:
    """Every key's id and role, never a secret (?consistency=any: this node's replica)."""
    level = commands.consistency(request)
    elsewhere = await route_to_leader(request, group=0, leader=level != "any")
    if elsewhere is not None:
        return elsewhere
    result, _ = await commands.read_here(request, 0, "sqs_keys")
    return respond(request, _listed(request, result["keys"]))


async def _every_node_keeps_keys(request: web.Request) -> None:
    """409 unless every voter runs a release whose state machine keeps SQS keys: an older
    replica would refuse the command the others apply."""
    catalog = request.app[GROUPS].catalog
    for voter in await catalog.members():
        if voter["id"] == catalog.id:
            continue
        features = await features_of(request.app, voter["http_addr"]) if voter["http_addr"] else None
        if features is None or FEATURE not in features:
            raise ApiError("conflict", f"node {voter['id']} " + ("does not answer" if features is None else
                                                                 "runs a release that keeps no SQS keys")
                           + ": every node must run one before the cluster keeps a key (docs/operations.md, "
                             "\"Upgrading\")")


async def add_key(request: web.Request) -> web.Response:
    """A new key of `role`, made here: its id and secret are in this answer and nowhere else."""
    body = await read_body(request)
    if not isinstance(body, dict) or set(body) != {"role"} or body["role"] not in SQS_ROLES:
        raise ApiError("bad_request", "the body must be {\"role\": \"admin\"} or {\"role\": \"data\"}")
    elsewhere = await route_to_leader(request, group=0)
    if elsewhere is not None:
        return elsewhere
    await _every_node_keeps_keys(request)
    key = new_key(body["role"])
    await commands.write(request, {"op": "sqs_key_add", "access_key": key.access_key, "role": key.role,
                                   "sealed": seal(request.app, key)})
    await request.app[KEYS].refresh()
    return respond(request, {"access_key": key.access_key, "secret_key": key.secret_key, "role": key.role,
                             "account": request.app[SETTINGS].sqs.account}, status=201)


async def remove_key(request: web.Request) -> web.Response:
    access_key = request.match_info["access_key"]
    if access_key in request.app[KEYS].configured:
        raise ApiError("conflict", f"SQS key {access_key} is in cluster.toml: remove it there and restart the nodes")
    elsewhere = await route_to_leader(request, group=0)
    if elsewhere is not None:
        return elsewhere
    await commands.write(request, {"op": "sqs_key_remove", "access_key": access_key})
    await request.app[KEYS].refresh()
    return respond(request, {"removed": access_key})

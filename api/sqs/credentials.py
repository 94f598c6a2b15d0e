"""The SQS API's keys through ``/v1/sqs/keys``: those of cluster.toml's ``[sqs]``, and those the
cluster keeps in group 0's log, each a principal's (statemachine/principals.py), which ``raftq sqs
key add|list|remove`` and ``raftq up --sqs`` make and remove without editing a file or
restarting a node.

A key made here is a principal of its own, named after its access key and acting as its role
(``sqs_key_add``, the op of the release before principals, so that a cluster mixed with it keeps
keys alike); a principal made through ``/v1/principals`` may hold SQS keys too, under its own
rules (api/principal_routes.py). Each front takes the keys with the principals
(api/principals.py): a key just added works on every node at once, a removed one stops within a
second. The secret is sealed before it enters the log (sealing.py) and is in the answer to the
admin who asked, and nowhere else.
"""

from __future__ import annotations

from aiohttp import web

from raftq.engine.config import SQS_ROLES

from .. import commands
from ..codec import read_body, respond
from ..errors import ApiError
from ..features import features_of
from ..keys import GROUPS, SETTINGS
from ..leader import route_to_leader
from ..principals import PRINCIPAL, PRINCIPALS
from .sealing import new_key, seal

FEATURE = "sqs_keys"        # api/features.py


def _listed(request: web.Request, principals: list) -> dict:
    configured = request.app[PRINCIPALS].configured_keys
    kept = [{"access_key": access_key, "role": p["role"], "principal": p["name"], "kept_by": "cluster"}
            for p in principals for access_key in p["sqs_keys"]]
    return {"account": request.app[SETTINGS].sqs.account,
            "keys": kept + [{"access_key": key.access_key, "role": key.role, "principal": key.access_key,
                             "kept_by": "cluster.toml"} for key, _ in configured.values()]}


async def list_keys(request: web.Request) -> web.Response:
    """Every key's id, role (none: its principal's rules) and principal, never a secret
    (?consistency=any: this node's replica)."""
    level = commands.consistency(request)
    elsewhere = await route_to_leader(request, group=0, leader=level != "any")
    if elsewhere is not None:
        return elsewhere
    result, _ = await commands.read_here(request, 0, "list_principals")
    return respond(request, _listed(request, result["principals"]))


async def every_node_knows(request: web.Request, feature: str, what: str) -> None:
    """409 unless every voter runs a release that knows `feature` (`what` it is): an older replica
    would refuse the command the others apply."""
    catalog = request.app[GROUPS].catalog
    for voter in await catalog.members():
        if voter["id"] == catalog.id:
            continue
        features = await features_of(request.app, voter["http_addr"]) if voter["http_addr"] else None
        if features is None or feature not in features:
            raise ApiError("conflict", f"node {voter['id']} " + ("does not answer" if features is None else
                                                                 f"runs a release without {what}")
                           + ": every node must run one first (docs/operations.md, \"Upgrading\")")


async def add_key(request: web.Request) -> web.Response:
    """A new key of `role`, made here: its id and secret are in this answer and nowhere else."""
    body = await read_body(request)
    if not isinstance(body, dict) or set(body) != {"role"} or body["role"] not in SQS_ROLES:
        raise ApiError("bad_request", "the body must be {\"role\": \"admin\"} or {\"role\": \"data\"}")
    elsewhere = await route_to_leader(request, group=0)
    if elsewhere is not None:
        return elsewhere
    await every_node_knows(request, FEATURE, "SQS keys kept by the cluster")
    key = new_key(body["role"])
    await commands.write(request, {"op": "sqs_key_add", "access_key": key.access_key, "role": key.role,
                                   "sealed": seal(request.app, key), "by": request[PRINCIPAL].name})
    await request.app[PRINCIPALS].refresh()
    return respond(request, {"access_key": key.access_key, "secret_key": key.secret_key, "role": key.role,
                             "account": request.app[SETTINGS].sqs.account}, status=201)


async def remove_key(request: web.Request) -> web.Response:
    access_key = request.match_info["access_key"]
    if access_key in request.app[PRINCIPALS].configured_keys:
        raise ApiError("conflict", f"SQS key {access_key} is in cluster.toml: remove it there and restart the nodes")
    elsewhere = await route_to_leader(request, group=0)
    if elsewhere is not None:
        return elsewhere
    await commands.write(request, {"op": "sqs_key_remove", "access_key": access_key, "by": request[PRINCIPAL].name})
    await request.app[PRINCIPALS].refresh()
    return respond(request, {"removed": access_key})

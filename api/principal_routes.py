"""``/v1/principals``, ``/v1/audit`` and ``/v1/whoami``: principals made, changed and revoked while
the cluster runs (docs/api.md, "Principals"; the rules in statemachine/principals.py).

A principal's token (256 random bits, in hex like cluster.toml's) and SQS key are made by the
node that serves the call and are in its answer only: group 0's log gets the token's keyed hash
and the key's sealed secret (api/principals.py, api/sqs/sealing.py), and nothing logs either.
Every change is written through group 0's log once every node runs a release that knows
principals (409 otherwise), and is kept as an event with who made it.
"""

from __future__ import annotations

import secrets

from aiohttp import web

from . import commands
from .codec import read_body, respond
from .errors import ApiError
from .keys import NODE, SETTINGS
from .leader import route_to_leader
from .principals import FEATURE, PRINCIPAL, PRINCIPALS, token_hash
from .routing import checked_name
from .sqs.credentials import every_node_knows
from .sqs.sealing import new_key, seal

MAX_AUDIT = 500


def _public(kept: dict) -> dict:
    """A principal as the API shows it: never a hash or a seal."""
    return {"name": kept["name"], "rules": kept["rules"], "quotas": kept["quotas"], "role": kept["role"],
            "token": kept["token_hash"] is not None, "sqs_keys": sorted(kept["sqs_keys"]),
            "created_ms": kept["created_ms"], "changed_ms": kept["changed_ms"]}


def _name(request: web.Request) -> str:
    return checked_name(request.match_info["name"], "principal name")


async def list_all(request: web.Request) -> web.StreamResponse:
    return await _answer_kept(request, lambda kept: {"principals": [_public(p) for p in kept]})


async def show(request: web.Request) -> web.StreamResponse:
    name = _name(request)

    def one(kept: list) -> dict:
        found = next((p for p in kept if p["name"] == name), None)
        if found is None:
            raise ApiError("not_found", f"principal {name!r} does not exist")
        return _public(found)
    return await _answer_kept(request, one)


async def _answer_kept(request: web.Request, answer) -> web.StreamResponse:
    """`answer` of the principals group 0 keeps, read at the request's consistency."""
    level = commands.consistency(request)
    elsewhere = await route_to_leader(request, group=0, leader=level != "any")
    if elsewhere is not None:
        return elsewhere
    result, _ = await commands.read_here(request, 0, "list_principals")
    return respond(request, answer(result["principals"]))


def _sqs_answer(request: web.Request, key) -> dict:
    return {"access_key": key.access_key, "secret_key": key.secret_key, "account": request.app[SETTINGS].sqs.account}


async def _write(request: web.Request, command: dict) -> None:
    """`command` (validated) through group 0's log, once every node knows principals."""
    await every_node_knows(request, FEATURE, "principals")
    await commands.write(request, command)
    await request.app[PRINCIPALS].refresh()


async def create(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    if not isinstance(body, dict) or not {"name", "rules"} <= set(body) <= {"name", "rules", "quotas", "sqs"} \
            or body.get("sqs") not in (None, True, False):
        raise ApiError("bad_request", "the body is {\"name\", \"rules\": [{\"actions\", \"queues\"}], optional "
                                      "\"quotas\" and \"sqs\": true for an SQS key}")
    token = secrets.token_hex(32)
    key = new_key(None) if body.get("sqs") else None
    command = {"op": "principal_add", "name": body["name"], "rules": body["rules"], "quotas": body.get("quotas", {}),
               "token_hash": token_hash(request.app, token), "by": request[PRINCIPAL].name}
    if key is not None:
        command["sqs_key"] = {"access_key": key.access_key, "sealed": seal(request.app, key)}
    commands.validate(command)
    elsewhere = await route_to_leader(request, group=0)
    if elsewhere is not None:
        return elsewhere
    await _write(request, command)
    answer = {"name": body["name"], "token": token, "rules": body["rules"], "quotas": command["quotas"]}
    if key is not None:
        answer["sqs"] = _sqs_answer(request, key)
    return respond(request, answer, status=201)


async def change(request: web.Request) -> web.StreamResponse:
    name = _name(request)
    body = await read_body(request)
    fields = {"rules", "quotas", "new_token", "new_sqs_key"}
    if not isinstance(body, dict) or not body or not set(body) <= fields \
            or body.get("new_token") not in (None, True) or body.get("new_sqs_key") not in (None, True):
        raise ApiError("bad_request", "a change names rules, quotas, \"new_token\": true or \"new_sqs_key\": true")
    command = {"op": "principal_update", "name": name, "by": request[PRINCIPAL].name,
               **{field: body[field] for field in ("rules", "quotas") if field in body}}
    token = secrets.token_hex(32) if body.get("new_token") else None
    key = new_key(None) if body.get("new_sqs_key") else None
    if token is not None:
        command["token_hash"] = token_hash(request.app, token)
    if key is not None:
        command["sqs_key"] = {"access_key": key.access_key, "sealed": seal(request.app, key)}
    commands.validate(command)
    elsewhere = await route_to_leader(request, group=0)
    if elsewhere is not None:
        return elsewhere
    await _write(request, command)
    answer = {"name": name, **{field: body[field] for field in ("rules", "quotas") if field in body}}
    if token is not None:
        answer["token"] = token
    if key is not None:
        answer["sqs"] = _sqs_answer(request, key)
    return respond(request, answer)


async def remove(request: web.Request) -> web.StreamResponse:
    command = {"op": "principal_remove", "name": _name(request), "by": request[PRINCIPAL].name}
    commands.validate(command)
    elsewhere = await route_to_leader(request, group=0)
    if elsewhere is not None:
        return elsewhere
    await _write(request, command)
    return web.Response(status=204)


async def audit(request: web.Request) -> web.StreamResponse:
    """The last credential changes as this node's replica of group 0 applied them, and what this
    node refused lately (each node keeps its own: ask each)."""
    raw = request.query.get("limit", "100")
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_AUDIT:
        raise ApiError("bad_request", f"limit must be an integer from 1 to {MAX_AUDIT}")
    changes, _ = await request.app[NODE].read("principal_events", int(raw))
    refusals = list(request.app[PRINCIPALS].denials)[-int(raw):]
    return respond(request, {"changes": changes["events"], "node": request.app[NODE].id, "refusals": refusals})


async def whoami(request: web.Request) -> web.StreamResponse:
    principal = request[PRINCIPAL]
    return respond(request, {"name": principal.name, "rules": list(principal.rules), "quotas": principal.quotas,
                             "kept_by": "cluster" if principal.kept else "cluster.toml"})

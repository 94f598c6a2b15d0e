"""Staged writes for exactly-once producers (the Spark sink): stage, commit, abort.

The rules live in statemachine/staging.py; these handlers only parse, build
the command and answer.  All of them are served by the leader.
"""

from aiohttp import web

from .codec import read_body, respond
from .errors import ApiError
from .leader import NODE, leader_read, read, write
from .messages import _messages as parse_messages
from .routing import checked_name, leader_only


def producer_id(request: web.Request) -> str:
    return checked_name(request.match_info["producer"], "producer id")


async def _object(request: web.Request, fields: set, required: set) -> dict:
    body = await read_body(request)
    if not isinstance(body, dict):
        raise ApiError("bad_request", f"the body must be an object with {', '.join(sorted(required))}")
    unknown = set(body) - fields
    if unknown:
        raise ApiError("bad_request", f"unknown field(s): {', '.join(sorted(map(str, unknown)))}")
    missing = required - set(body)
    if missing:
        raise ApiError("bad_request", f"missing field(s): {', '.join(sorted(missing))}")
    return body


@leader_only
async def stage(request: web.Request) -> web.Response:
    body = await _object(request, {"token", "chunk", "queue", "messages", "ttl_ms"},
                         {"token", "chunk", "queue", "messages"})
    command = {"op": "stage", "producer": producer_id(request), "token": body["token"],
               "chunk": body["chunk"], "queue": body["queue"],
               "messages": parse_messages(request, {"messages": body["messages"]}),
               "auto_create": request.app[NODE].auto_create}
    if body.get("ttl_ms") is not None:
        command["ttl_ms"] = body["ttl_ms"]
    return respond(request, (await write(request, command)).result, status=201)


@leader_only
async def commit(request: web.Request) -> web.Response:
    body = await _object(request, {"batch", "parts", "retain_ms"}, {"batch", "parts"})
    command = {"op": "stage_commit", "producer": producer_id(request), "batch": body["batch"],
               "parts": body["parts"], "auto_create": request.app[NODE].auto_create}
    if body.get("retain_ms") is not None:
        command["retain_ms"] = body["retain_ms"]
    committed = await write(request, command)
    return respond(request, {**committed.result, "commit_index": committed.index})


@leader_only
async def abort(request: web.Request) -> web.Response:
    body = await _object(request, {"tokens"}, {"tokens"})
    return respond(request, (await write(request, {"op": "stage_abort", "producer": producer_id(request),
                                                   "tokens": body["tokens"]})).result)


async def list_all(request: web.Request) -> web.Response:
    return await read(request, "list_producers")


@leader_only
async def show(request: web.Request) -> web.Response:
    # auto_create tells a writer at start whether a missing queue is an error.
    info = await leader_read(request.app, "producer_info", producer_id(request))
    return respond(request, {**info, "auto_create": request.app[NODE].auto_create})


@leader_only
async def delete(request: web.Request) -> web.Response:
    await write(request, {"op": "drop_producer", "producer": producer_id(request)})
    return web.Response(status=204)

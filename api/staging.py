"""Staged writes for exactly-once producers (the Spark sink): stage, commit, abort.

The rules live in statemachine/staging.py; these handlers only parse, build
the command and answer.  All of them are served by the leader of the Raft
group of the queue written to (issue 24): a stage names its queue; a
commit, an abort or a producer's page names it with `queue` (in the body, or
the query for GET and DELETE), which a cluster of one group does not need;
the list of producers gathers every group's. Each needs the ``producers`` action on the queue
it names (a stage and a commit also ``put``; a commit's stages' queues, which only the state
knows, are held to the principal's ``put`` patterns by the state machine).
"""

import functools

from aiohttp import web

from raftq.statemachine.rules import PRODUCERS, PUT

from .codec import read_body, respond
from .errors import ApiError
from .gather import group_param, per_group
from .commands import consistency, leader_read, read_here, validate, write
from .keys import GROUP, GROUPS, NODE
from .leader import route_to_leader
from .messages import _messages as parse_messages
from .principals import authorize
from .routing import checked_name


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


async def _route(request: web.Request, queue, *, creating: bool = False, writes: bool = False
                 ) -> web.StreamResponse | None:
    """Route to the leader of `queue`'s group (`creating`: as route_to_leader's); with one
    group, `queue` may be None. The caller needs producers on it (`writes`: and put)."""
    if queue is None and request.app[GROUPS].count > 1:
        raise ApiError("bad_request", "this cluster has several Raft groups: name the queue the producer "
                                      "writes to (queue)")
    names = [] if queue is None else [checked_name(queue, "queue")]
    authorize(request, PRODUCERS, names)
    if writes:
        authorize(request, PUT, names)
    return await route_to_leader(request, names, creating=creating)


async def stage(request: web.Request) -> web.Response:
    body = await _object(request, {"token", "chunk", "queue", "messages", "ttl_ms"},
                         {"token", "chunk", "queue", "messages"})
    command = {"op": "stage", "producer": producer_id(request), "token": body["token"],
               "chunk": body["chunk"], "queue": body["queue"],
               "messages": parse_messages(request, {"messages": body["messages"]}),
               "auto_create": request.app[NODE].auto_create}
    if body.get("ttl_ms") is not None:
        command["ttl_ms"] = body["ttl_ms"]
    validate(command)
    elsewhere = await _route(request, body["queue"], creating=request.app[NODE].auto_create, writes=True)
    if elsewhere is not None:
        return elsewhere
    return respond(request, (await write(request, command)).result, status=201)


async def commit(request: web.Request) -> web.Response:
    body = await _object(request, {"batch", "parts", "retain_ms", "queue"}, {"batch", "parts"})
    command = {"op": "stage_commit", "producer": producer_id(request), "batch": body["batch"],
               "parts": body["parts"], "auto_create": request.app[NODE].auto_create}
    if body.get("retain_ms") is not None:
        command["retain_ms"] = body["retain_ms"]
    validate(command)
    elsewhere = await _route(request, body.get("queue"), creating=request.app[NODE].auto_create, writes=True)
    if elsewhere is not None:
        return elsewhere
    committed = await write(request, command)
    return respond(request, {**committed.result, "commit_index": committed.index})


async def abort(request: web.Request) -> web.Response:
    body = await _object(request, {"tokens", "queue"}, {"tokens"})
    command = {"op": "stage_abort", "producer": producer_id(request), "tokens": body["tokens"]}
    validate(command)
    elsewhere = await _route(request, body.get("queue"))
    if elsewhere is not None:
        return elsewhere
    return respond(request, (await write(request, command)).result)


async def list_all(request: web.Request) -> web.Response:
    """The producers of one group (``?group=``), or of every group, gathered (gather.py). Each
    entry names its ``raft_group``: a producer writing to queues of several groups is one
    producer in each."""
    group = group_param(request)
    if group is None and request.app[GROUPS].count > 1:
        answers = await per_group(request, functools.partial(_producers_of, request))
        return respond(request, {"producers": sorted((entry for answer in answers.values()
                                                      for entry in answer["producers"]),
                                                     key=lambda entry: (entry["producer"], entry["raft_group"]))})
    elsewhere = await route_to_leader(request, group=group or 0, leader=consistency(request) != "any")
    if elsewhere is not None:
        return elsewhere
    return respond(request, await _producers_of(request, request[GROUP]))


async def _producers_of(request: web.Request, group: int) -> dict:
    """By producer id, as the gathered list is (the state machine lists them as they came)."""
    producers = (await read_here(request, group, "list_producers"))[0]["producers"]
    return {"producers": sorted(({**entry, "raft_group": group} for entry in producers),
                                key=lambda entry: entry["producer"])}


async def show(request: web.Request) -> web.Response:
    # creating: a writer asks before its queue exists whether a put would create it
    elsewhere = await _route(request, request.query.get("queue"), creating=request.app[NODE].auto_create)
    if elsewhere is not None:
        return elsewhere
    # auto_create tells a writer at start whether a missing queue is an error.
    info = await leader_read(request.app, request[GROUP], "producer_info", producer_id(request))
    return respond(request, {**info, "auto_create": request.app[NODE].auto_create})


async def delete(request: web.Request) -> web.Response:
    elsewhere = await _route(request, request.query.get("queue"))
    if elsewhere is not None:
        return elsewhere
    await write(request, {"op": "drop_producer", "producer": producer_id(request)})
    return web.Response(status=204)

"""Queues and their consumer groups."""

from aiohttp import web

from raftq.statemachine.rules import ADMIN, REDRIVE

from .codec import read_body, read_optional_body, respond
from .errors import ApiError
from .gather import group_param, per_group
from .commands import consistency, read_here, validate, write
from .keys import GROUP, GROUPS
from .leader import read, route_to_leader
from .principals import PRINCIPAL, authorize, may_touch
from .routing import group_name, leader_only, queue_name


async def _route_config(request: web.Request, config, *, new_queue: bool) -> web.StreamResponse | None:
    """Route a queue's config change: to the queue's group, which a dead-letter queue it names
    joins (409 cross_group when that one lives in another group already). Unless `new_queue`,
    the queue must exist already: 404 places no name, not even its dead-letter queue's."""
    if not new_queue:
        elsewhere = await route_to_leader(request)
        if elsewhere is not None:
            return elsewhere
    dead_letter = config.get("dead_letter") if isinstance(config, dict) else None
    names = [queue_name(request)] + ([dead_letter] if isinstance(dead_letter, str) else [])
    authorize(request, ADMIN, names[1:])     # the queue's own was the route's
    return await route_to_leader(request, names, creating=True)


async def create(request: web.Request) -> web.Response:
    config = await read_optional_body(request)
    command = {"op": "create_queue", "queue": queue_name(request), "config": config}
    validate(command)
    elsewhere = await _route_config(request, config, new_queue=True)
    if elsewhere is not None:
        return elsewhere
    result = (await write(request, command)).result
    return respond(request, {"name": queue_name(request), "config": result["config"]},
                   status=201 if result["created"] else 200)


async def patch(request: web.Request) -> web.Response:
    config = await read_body(request)
    command = {"op": "patch_queue", "queue": queue_name(request), "config": config}
    validate(command)
    elsewhere = await _route_config(request, config, new_queue=False)
    if elsewhere is not None:
        return elsewhere
    result = (await write(request, command)).result
    return respond(request, {"name": queue_name(request), "config": result["config"]})


@leader_only
async def delete(request: web.Request) -> web.Response:
    await write(request, {"op": "delete_queue", "queue": queue_name(request)})
    return web.Response(status=204)


async def list_all(request: web.Request) -> web.StreamResponse:
    """The queues of one group (``?group=``), or of every group, gathered (gather.py): those the
    caller's principal has an action on."""
    group = group_param(request)
    principal = request.get(PRINCIPAL)
    if group is not None or request.app[GROUPS].count == 1:
        elsewhere = await route_to_leader(request, group=group or 0, leader=consistency(request) != "any")
        if elsewhere is not None:
            return elsewhere
        result, applied_index = await read_here(request, request[GROUP], "list_queues")
        headers = {} if applied_index is None else {"X-Raftq-Applied-Index": str(applied_index)}
        return respond(request, {"queues": [q for q in result["queues"] if may_touch(principal, q["name"])]},
                       headers=headers)

    async def here(group: int) -> dict:
        return (await read_here(request, group, "list_queues"))[0]
    answers = await per_group(request, here)
    return respond(request, {"queues": sorted((queue for answer in answers.values() for queue in answer["queues"]
                                               if may_touch(principal, queue["name"])),
                                              key=lambda queue: queue["name"])})


async def show(request: web.Request) -> web.Response:
    return await read(request, "queue_info", queue_name(request))


async def add_group(request: web.Request) -> web.Response:
    body = await read_optional_body(request)
    if not isinstance(body, dict) or set(body) - {"start"}:
        raise ApiError("bad_request", "the body must be an object like {\"start\": \"earliest\"} (or latest, "
                                      "{\"seq\": n}, {\"time_ms\": t})")
    command = {"op": "add_group", "queue": queue_name(request), "group": group_name(request.match_info["group"]),
               "start": body.get("start", "earliest")}
    validate(command)
    elsewhere = await route_to_leader(request)
    if elsewhere is not None:
        return elsewhere
    result = (await write(request, command)).result
    created = result.pop("created")
    return respond(request, result, status=201 if created else 200)


async def list_groups(request: web.Request) -> web.Response:
    return await read(request, "list_groups", queue_name(request))


async def show_group(request: web.Request) -> web.Response:
    return await read(request, "group_info", queue_name(request), group_name(request.match_info["group"]))


async def _group_write(request: web.Request, command: dict) -> web.Response:
    validate(command)
    elsewhere = await route_to_leader(request)
    if elsewhere is not None:
        return elsewhere
    return respond(request, (await write(request, command)).result)


async def seek_group(request: web.Request) -> web.Response:
    """Move a group to a position: it replays the stored messages from there (retention)."""
    body = await read_body(request)
    if not isinstance(body, dict) or set(body) != {"to"}:
        raise ApiError("bad_request", "the body must be an object like {\"to\": \"earliest\"} (or latest, "
                                      "{\"seq\": n}, {\"time_ms\": t})")
    return await _group_write(request, {"op": "seek_group", "queue": queue_name(request),
                                        "group": group_name(request.match_info["group"]), "to": body["to"]})


PATCH_GROUP_FIELDS = {"paused", "until_ms", "for_ms", "rate_limit"}


async def patch_group(request: web.Request) -> web.Response:
    """Pause (until a log time, for a while, or until resumed) or resume a group, or limit its rate."""
    body = await read_body(request)
    if not isinstance(body, dict) or set(body) - PATCH_GROUP_FIELDS:
        raise ApiError("bad_request", f"the body is an object of {', '.join(sorted(PATCH_GROUP_FIELDS))}")
    return await _group_write(request, {"op": "patch_group", "queue": queue_name(request),
                                        "group": group_name(request.match_info["group"]), **body})


@leader_only
async def delete_group(request: web.Request) -> web.Response:
    await write(request, {"op": "delete_group", "queue": queue_name(request),
                          "group": group_name(request.match_info["group"])})
    return web.Response(status=204)


REDRIVE_FIELDS = {"from_queue", "max", "id"}


async def redrive(request: web.Request) -> web.Response:
    body = await read_optional_body(request)
    if not isinstance(body, dict) or set(body) - REDRIVE_FIELDS:
        raise ApiError("bad_request", "the body is an object with optional from_queue, max and id")
    command = {"op": "redrive", "queue": queue_name(request),
               **{k: v for k, v in body.items() if v is not None}}
    validate(command)
    authorize(request, REDRIVE, [command["from_queue"]] if "from_queue" in command else [])
    elsewhere = await route_to_leader(request)
    if elsewhere is not None:
        return elsewhere
    return respond(request, (await write(request, command)).result)

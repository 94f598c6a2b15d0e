"""Small guards shared by the handlers: names from the path, leader-only writes."""

import functools

from aiohttp import web

from raftq.wire_format import NAME_PATTERN, is_name

from .errors import ApiError
from .leader import route_to_leader


def checked_name(value, what: str) -> str:
    """`value` if it follows the naming rule; else 400 bad_request naming `what`."""
    if not is_name(value):
        raise ApiError("bad_request", f"{what} must match {NAME_PATTERN}")
    return value


def queue_name(request: web.Request) -> str:
    return checked_name(request.match_info["queue"], "queue name")


def group_name(value) -> str:
    if not isinstance(value, str):
        raise ApiError("bad_request", "group name must be a string")
    return checked_name(value, "group name")


def leader_only(handler):
    """Serve on the leader; redirect or forward from a follower."""
    @functools.wraps(handler)
    async def serve(request: web.Request) -> web.StreamResponse:
        elsewhere = await route_to_leader(request)
        if elsewhere is not None:
            return elsewhere
        return await handler(request)
    return serve

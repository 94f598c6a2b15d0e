"""What spans the Raft groups (issue 24): a list of queues, verification.

With G > 1 no node leads every group. A request that covers them all is
answered group by group: by this node for a group it serves at the
request's consistency, else by the node that does, asked the same request
for that group alone (``?group=<id>``, with the caller's credentials).
"""

import asyncio
from typing import Awaitable, Callable

from aiohttp import ClientError, ClientTimeout, web

from .errors import ApiError
from .keys import GROUPS, HTTP
from .leader import Elsewhere, consistency, no_quorum, serve_here

ASK_TIMEOUT = ClientTimeout(total=15)


def group_param(request: web.Request) -> int | None:
    """The `group` query parameter: the request covers that Raft group alone (None: every group)."""
    raw = request.query.get("group")
    if raw is None:
        return None
    count = request.app[GROUPS].count
    if not raw.isascii() or not raw.isdigit() or not int(raw) < count:
        raise ApiError("bad_request", f"group must be a group id from 0 to {count - 1}")
    return int(raw)


async def per_group(request: web.Request, here: Callable[[int], Awaitable[dict]], *,
                    leader: bool | None = None) -> dict[int, dict]:
    """Each group's answer to this request: `here(group)` where this node serves the group
    (`leader`: only where its engine of the group leads; by default, for a read at
    consistency ``any`` any engine of the group will do), else the answer of the node that does."""
    if leader is None:
        leader = request.method != "GET" or consistency(request) != "any"

    async def answer(group: int) -> dict:
        try:
            await serve_here(request.app, group, leader=leader)
        except Elsewhere as there:
            return await _ask(request, there.address, group)
        return await here(group)

    count = request.app[GROUPS].count
    return dict(zip(range(count), await asyncio.gather(*(answer(group) for group in range(count)))))


async def _ask(request: web.Request, address: str, group: int) -> dict:
    url = f"{request.scheme}://{address}{request.path}"
    headers = {"Accept": "application/json"}
    if "Authorization" in request.headers:
        headers["Authorization"] = request.headers["Authorization"]
    try:
        async with request.app[HTTP].request(request.method, url, params={**request.query, "group": str(group)},
                                             headers=headers, timeout=ASK_TIMEOUT) as reply:
            body = await reply.json()
            if reply.status != 200:
                raise ApiError(body.get("error", "internal"), f"group {group}: {body.get('message')}")
            return body
    except (ClientError, asyncio.TimeoutError, ValueError) as exc:
        raise no_quorum(f"group {group} did not answer through {address}: {exc}") from None

"""What spans the Raft groups (issue 24): a list of queues, verification.

With G > 1 no node leads every group. A request that covers them all is
answered group by group: by this node for a group it serves at the
request's consistency, else by the node that does, asked the same request
for that group alone (``?group=<id>``, with the caller's credentials).
"""

import asyncio
import functools
from typing import Awaitable, Callable

from aiohttp import ClientError, ClientTimeout, web

from .commands import consistency
from .errors import ApiError, no_quorum
from .keys import GROUPS, HTTP
from .leader import Elsewhere, serve_here

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
                    leader: bool | None = None,
                    there: Callable[[str, int], Awaitable[dict]] | None = None) -> dict[int, dict]:
    """Each group's answer to this request: `here(group)` where this node serves the group
    (`leader`: only where its engine of the group leads; by default, for a read at
    consistency ``any`` any engine of the group will do), else `there(address, group)`: the
    answer of the node at `address`, which does (by default, to this request asked again for
    that group alone)."""
    if leader is None:
        leader = request.method != "GET" or consistency(request) != "any"
    if there is None:
        there = functools.partial(_ask_again, request)

    async def answer(group: int) -> dict:
        try:
            await serve_here(request.app, group, leader=leader)
        except Elsewhere as elsewhere:
            return await there(elsewhere.address, group)
        return await here(group)

    count = request.app[GROUPS].count
    return dict(zip(range(count), await asyncio.gather(*(answer(group) for group in range(count)))))


async def _ask_again(request: web.Request, address: str, group: int) -> dict:
    return await ask(request.app, request.method, f"{request.scheme}://{address}{request.path}",
                     {**request.query, "group": str(group)}, request.headers.get("Authorization"), group)


async def ask(app: web.Application, method: str, url: str, params: dict, authorization: str | None,
              group: int) -> dict:
    """The JSON answer of another node to a call for `group`; its refusal as an ApiError. A node
    that no longer serves the group (a move took it away since this node last heard) forwards the
    call to one that does: a followed redirect to another node would lose the credentials."""
    headers = {"Accept": "application/json", "X-Raftq-Forward": "1"}
    if authorization is not None:
        headers["Authorization"] = authorization
    try:
        async with app[HTTP].request(method, url, params=params, headers=headers, timeout=ASK_TIMEOUT,
                                     allow_redirects=False) as reply:
            body = await reply.json()
            if reply.status != 200:
                raise ApiError(body.get("error", "internal"), f"group {group}: {body.get('message')}")
            return body
    except (ClientError, asyncio.TimeoutError, ValueError) as exc:
        raise no_quorum(f"group {group} did not answer through {url}: {exc}") from None

"""A front's own admin calls to another Raft group's leader, wherever it runs: what the
replica mover and the name releaser do in groups whose leader is on another node, and the
connections' leases on group 0's leader (api/connections.py)."""

from __future__ import annotations

import logging

from aiohttp import ClientError, ClientTimeout, web

from .keys import GROUPS, HTTP, SETTINGS

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = ClientTimeout(total=30)
MAX_REDIRECTS = 3


class NotYet(Exception):
    """A step that cannot be taken now (no leader, a refusal, a node not answering); the
    caller tries again at its next step."""


async def call_group_leader(app: web.Application, method: str, path: str, body: dict | None = None, *,
                            group: int = 0, timeout: ClientTimeout = REQUEST_TIMEOUT) -> dict | None:
    """An admin request to the leader of `group`, through the front of one of its recorded
    members that answers (which forwards it; not a target's, whose engine knows no leader
    until it is added), following the redirects of fronts that know a later leader.

    A member that answers but knows no leader is passed over like one that does not
    answer: a source whose removal was committed before the mover that asked for it died
    is still a recorded member, and its engine, out of the group, never learns a leader."""
    groups = app[GROUPS]
    refusals = []
    for node_id in [groups.catalog.id] if group == 0 else groups.members(group):
        address = groups.http_addr(node_id)
        if address is None:
            continue
        try:
            return await _follow(app, method, f"{app[SETTINGS].scheme}://{address}{path}", body, timeout)
        except (NotYet, ClientError, TimeoutError) as exc:
            log.info("%s %s through %s: %s", method, path, node_id, exc)
            refusals.append(f"{node_id}: {exc}")
    raise NotYet(f"{method} {path}: no member of group {group} served it ({'; '.join(refusals) or 'none known'})")


async def _follow(app: web.Application, method: str, url: str, body: dict | None,
                  timeout: ClientTimeout) -> dict | None:
    headers = {"Accept": "application/json", "X-Raftq-Forward": "1"}
    token = app[SETTINGS].tokens.admin
    if token:
        headers["Authorization"] = f"Bearer {token}"
    for _ in range(MAX_REDIRECTS):
        async with app[HTTP].request(method, url, json=body, headers=headers, allow_redirects=False,
                                     timeout=timeout) as reply:
            if reply.status == 307 and "Location" in reply.headers:
                url = reply.headers["Location"]
                continue
            if reply.status >= 300:
                raise NotYet(f"{method} {url}: {reply.status} {(await reply.text())[:200]}")
            return await reply.json() if reply.status != 204 else None
    raise NotYet(f"{method} {url}: redirected {MAX_REDIRECTS} times")

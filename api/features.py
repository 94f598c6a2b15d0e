"""What this release adds that every node of the cluster must know before any uses it, and
asking a node which it knows (``GET /health/live``'s ``features``).

- ``name_release``, ``release_in_turn``: the name releaser's commands (api/releaser.py);
- ``sealed_receipts``: receipts with a MAC, which an older release refuses at its edge
  (api/receipt_mode.py);
- ``sqs_keys``: SQS keys kept in group 0's log, whose commands an older replica refuses
  (api/sqs/credentials.py).
"""

from __future__ import annotations

import asyncio

from aiohttp import ClientError, ClientTimeout, web

from .keys import HTTP, SETTINGS

FEATURES = ("name_release", "release_in_turn", "sealed_receipts", "sqs_keys")
PEER_TIMEOUT = ClientTimeout(total=2)


async def features_of(app: web.Application, address: str) -> list | None:
    """The features the node at HTTP `address` lists; None when it does not answer."""
    url = f"{app[SETTINGS].scheme}://{address}/health/live"
    try:
        async with app[HTTP].get(url, timeout=PEER_TIMEOUT) as reply:
            features = (await reply.json()).get("features", [])
            return features if isinstance(features, list) else []
    except (ClientError, asyncio.TimeoutError, ValueError):
        return None

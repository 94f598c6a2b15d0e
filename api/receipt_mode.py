"""Whether this front seals the receipts it hands out, and takes unsealed ones, while the
cluster may be mixed with a release before sealed receipts (engine/link/receipts.py).

An older release refuses a sealed receipt at its edge (400 ``invalid_receipt``,
``ReceiptHandleIsInvalid``), and issues unsealed ones: while any voter of group 0 runs one, a
front issues unsealed receipts and takes unsealed ones as they are, so that a receipt works on
whichever node its ack reaches, as before the upgrade. It starts sealed and strict (a front of
a cluster that is not mixed never takes an unsealed receipt), turns mixed as soon as a voter
answers ``GET /health/live`` without ``sealed_receipts`` in its ``features``, and back once a
majority of the voters answered and each lists it; then it asks again only when the voters
change. A voter that does not answer counts neither way: a node left down through an upgrade
must be upgraded before it is started again (docs/operations.md, "Upgrading").
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import ClientError, web

from raftq.engine.background import Background
from raftq.engine.outcome import CommitError

from .features import features_of
from .keys import GROUPS

log = logging.getLogger(__name__)

FEATURE = "sealed_receipts"     # api/features.py
ASK_EVERY_S = 2.0
MODE = web.AppKey("receipt_mode", object)


class ReceiptMode(Background):
    def __init__(self, app: web.Application):
        self._app = app
        self.mixed = False
        self._all_sealed: frozenset | None = None    # the voters' addresses once each listed the feature

    async def _run(self) -> None:
        while True:
            try:
                await self.check()
            except (CommitError, ClientError, asyncio.TimeoutError) as exc:
                log.info("receipt mode: %s; asking again", exc)
            await asyncio.sleep(ASK_EVERY_S)

    async def check(self) -> None:
        catalog = self._app[GROUPS].catalog
        voters = await catalog.members()
        others = frozenset(v["http_addr"] for v in voters if v["id"] != catalog.id and v["http_addr"])
        if self._all_sealed is not None and others <= self._all_sealed:
            return
        answers = await asyncio.gather(*(features_of(self._app, address) for address in others))
        older = sorted(address for address, features in zip(others, answers)
                       if features is not None and FEATURE not in features)
        answered = 1 + sum(features is not None for features in answers)
        if older:
            if not self.mixed:
                log.warning("receipts: %s run a release before sealed receipts; issuing unsealed receipts and "
                            "taking unsealed ones until every node is upgraded", ", ".join(older))
            self.mixed = True
        elif answered * 2 > len(voters):
            if self.mixed:
                log.warning("receipts: every node runs a release with sealed receipts; unsealed ones are refused "
                            "from now on")
            self.mixed = False
            self._all_sealed = others

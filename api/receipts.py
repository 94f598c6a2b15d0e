"""Receipts coming back from clients: the shape checked at the edge, the MAC where the command is
written (engine/link/receipts.py says what a receipt is and why it is sealed).

Every door that takes receipts (an ack, nack or extend of the HTTP API or the streaming wire, a
transaction's acks, SQS's DeleteMessage and ChangeMessageVisibility) calls ``opened`` on the
node that writes the command: the command carries the state machine's receipts, and a receipt
whose MAC does not hold is replaced by a stand-in that names no lease, so the state machine
reports it stale exactly as it reports a receipt whose lease ended; ``Opened.given`` turns the
stale receipts of its answer back into the client's own.
"""

from __future__ import annotations

from aiohttp import web

from raftq.engine.link.receipts import Receipts, receipt_inside
from raftq.wire_format import is_name

from .errors import ApiError
from .receipt_mode import MODE

RECEIPTS = web.AppKey("receipts", Receipts)


def well_formed(given) -> bool:
    """Whether raftq could have issued `given`, whatever lease it names now and whether or not
    its MAC holds: a malformed receipt (a typo, a truncated paste) is the client's mistake, 400."""
    inside = receipt_inside(given) if isinstance(given, str) else None
    return inside is not None and is_name(inside.split(":")[1])


class Opened:
    """The receipts of a command as the state machine takes them (``open``, queue by queue), and
    the way back to what the client sent (``given``). Receipts of different queues never share
    a name: each queue incarnation's receipts start with its own number."""

    def __init__(self, app: web.Application):
        self._receipts = app[RECEIPTS]
        self._unsealed_too = app[MODE].mixed
        self._back: dict[str, str] = {}
        self._stand_ins: dict[tuple[str, str], str] = {}

    def open(self, queue: str, given: list[str]) -> list[str]:
        out = []
        for receipt in given:
            inside = self._receipts.open(queue, receipt, unsealed_too=self._unsealed_too)
            if inside is None:
                # no lease has this name: the state machine's receipts start with a digit
                inside = self._stand_ins.setdefault((queue, receipt), f"~{len(self._stand_ins)}")
            self._back.setdefault(inside, receipt)
            out.append(inside)
        return out

    def given(self, receipts: list[str]) -> list[str]:
        return [self._back.get(r, r) for r in receipts]

    def given_in(self, exc: ApiError) -> ApiError:
        """`exc` with the stale receipts it lists as the client sent them."""
        if isinstance(exc.details.get("stale"), list):
            exc.details["stale"] = self.given(exc.details["stale"])
        return exc

"""Receipts no client can guess: the state machine's receipt with a MAC over it and its queue.

The state machine names a lease ``incarnation:group:seq:token`` (statemachine/queue.py): all
counters, so anyone who can receive from one queue could name another consumer's lease and
ack it, hide it or end it without having received it.  The state machine stays deterministic
and keyless; the MAC is added where a receipt leaves the engine (``EngineService``'s receive:
the streaming wire's messages are encoded there) and checked where one comes back, at the
front that writes the ack, nack, extend or transaction:

    <incarnation>:<group>:<seq>:<token>:<MAC>

``MAC`` is the first 128 bits of HMAC-SHA256 under the cluster's receipt key
(``ClusterKeys.receipts``, from the cluster secret: every node issues and checks alike, so a
receipt works across a failover) over the queue's name and the state machine's receipt, in
unpadded base64url.  A receipt whose MAC does not hold, of another queue or forged, is taken as
naming no lease: the command carries a stand-in that no lease matches, and it is reported
stale as a receipt whose lease ended is.  A receipt without a MAC (an older release issued it)
is taken as it is only while the cluster is mixed (api/receipt_mode.py).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

MAC_BYTES = 16
# what the state machine writes (statemachine/queue.py's RECEIPT_RE), then the MAC
SEALED = re.compile(r"(\d+:[^:]*:\d+:\d+):([A-Za-z0-9_-]{22})", re.ASCII)
PLAIN = re.compile(r"\d+:[^:]*:\d+:\d+", re.ASCII)


class Receipts:
    def __init__(self, key: bytes):
        self._key = key

    def _mac(self, queue: str, receipt: str) -> str:
        digest = hmac.new(self._key, f"{queue}\n{receipt}".encode(), hashlib.sha256).digest()[:MAC_BYTES]
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def seal(self, queue: str, receipt: str) -> str:
        return f"{receipt}:{self._mac(queue, receipt)}"

    def open(self, queue: str, given: str, *, unsealed_too: bool) -> str | None:
        """The state machine's receipt that `given` carries for `queue`, or None when it names no
        lease this node will act on (its MAC does not hold, or it has none and not
        `unsealed_too`)."""
        sealed = SEALED.fullmatch(given)
        if sealed is not None:
            receipt, mac = sealed.groups()
            return receipt if hmac.compare_digest(mac, self._mac(queue, receipt)) else None
        if unsealed_too and PLAIN.fullmatch(given):
            return given
        return None


def receipt_inside(given: str) -> str | None:
    """The state machine's receipt a receipt from a client holds, sealed or not (None: it has
    not the shape of one), whether or not its MAC holds: what tells a malformed receipt (a
    typo, a truncated paste; refused at the edge) from one that names no lease."""
    sealed = SEALED.fullmatch(given)
    if sealed is not None:
        return sealed.group(1)
    return given if PLAIN.fullmatch(given) else None

"""What every raftq client shares: which node to try next and for how long,
how bodies are encoded and decoded, and the errors a call can raise."""

import base64
import json
import ssl
from urllib.parse import urlsplit

import cbor2

CBOR = "application/cbor"
# An election takes 0.15-0.35 s: retry soon and often enough to find the new
# leader within a few tens of ms of it winning, without hammering the nodes.
BACKOFF_FIRST_S, BACKOFF_GROWTH, BACKOFF_MAX_S = 0.01, 1.5, 0.15


def backoff_delays():
    delay = BACKOFF_FIRST_S
    while True:
        yield delay
        delay = min(delay * BACKOFF_GROWTH, BACKOFF_MAX_S)


class RaftqError(Exception):
    def __init__(self, status: int, code: str, message: str, body: dict | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.body = status, code, message, body or {}


class DurabilityNotReached(RaftqError):
    """A put with ``durability=all`` was stored on a majority (201), but some
    connected voter did not hold it within the write timeout. ``body`` is the
    whole answer (messages, seqs, ``durability: "quorum"``); putting again with
    the same ids stores nothing new and waits for every voter once more."""


def from_wire(value):
    if isinstance(value, dict):
        if "body_b64" in value:
            value = dict(value)
            value["body"] = base64.b64decode(value.pop("body_b64"))
        return {k: from_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_wire(v) for v in value]
    return value


class Failover:
    """Which node to try next, and for how long to keep trying; how bodies are encoded."""

    def __init__(self, urls, token, retry_for: float, timeout: float, cafile: str | None,
                 cbor: bool = False):
        if isinstance(urls, str):
            urls = [urls]
        self.urls = [u.rstrip("/") for u in urls]
        self.current = 0
        self.cbor = cbor
        media = CBOR if cbor else "application/json"
        self.headers = {"Content-Type": media, "Accept": media}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.retry_for = retry_for
        self.timeout = timeout
        self.ssl_context = ssl.create_default_context(cafile=cafile) if cafile else None

    @property
    def base(self) -> str:
        return self.urls[self.current]

    def follow(self, location: str) -> None:
        parts = urlsplit(location)
        base = f"{parts.scheme}://{parts.netloc}"
        if base not in self.urls:
            self.urls.append(base)
        self.current = self.urls.index(base)

    def next_node(self) -> None:
        self.current = (self.current + 1) % len(self.urls)

    def encode(self, body) -> bytes | None:
        if body is None:
            return None
        return cbor2.dumps(body) if self.cbor else json.dumps(body).encode()

    @staticmethod
    def decode(status: int, raw: bytes, accept_status, text: bool = False, content_type: str | None = None,
               applied_index: str | None = None):
        if text and status == 200:
            return raw.decode()
        if not raw:
            payload = {}
        elif (content_type or "").startswith(CBOR):
            payload = cbor2.loads(raw)
        else:
            payload = json.loads(raw)
        if isinstance(payload, dict) and "durability_not_reached" in payload:
            shortfall = payload["durability_not_reached"]
            raise DurabilityNotReached(status, "durability_not_reached", shortfall["message"], from_wire(payload))
        if 200 <= status < 300 or status in accept_status:
            result = from_wire(payload)
            if applied_index is not None and isinstance(result, dict):
                result["applied_index"] = int(applied_index)
            return result
        raise RaftqError(status, payload.get("error", "http_error"), payload.get("message", raw[:200]), payload)

"""Raw HTTP for tests that check statuses, headers and bodies byte for byte.

Nodes take a bearer token by default: ``call`` sends the admin token of the
cluster a URL belongs to, as registered by ``register`` (conftest's
``start_cluster`` does it), unless the caller sets Authorization itself.
"""

import http.client
import json
from urllib.parse import urlsplit

import cbor2

TOKENS: dict[str, str] = {}   # host:port -> admin token of the cluster serving there


def register(cluster) -> None:
    for url in cluster.urls:
        TOKENS[urlsplit(url).netloc] = cluster.token


def token_for(url: str) -> str | None:
    return TOKENS.get(urlsplit(url).netloc)


class Reply:
    def __init__(self, status: int, headers, raw: bytes):
        self.status, self.headers, self.raw = status, headers, raw

    @property
    def body(self):
        if not self.raw:
            return None
        if self.headers.get("Content-Type", "").startswith("application/cbor"):
            return cbor2.loads(self.raw)
        return json.loads(self.raw)

    def __repr__(self):
        return f"<Reply {self.status} {self.raw[:300]!r}>"


def call(method: str, url: str, body=None, *, headers=None, raw: bytes | None = None,
         cbor: bool = False, timeout: float = 30) -> Reply:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=timeout)
    sent = dict(headers or {})
    if "Authorization" not in sent and token_for(url):
        sent["Authorization"] = f"Bearer {token_for(url)}"
    if raw is None and body is not None:
        if cbor:
            raw = cbor2.dumps(body)
            sent.setdefault("Content-Type", "application/cbor")
        else:
            raw = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
    if cbor:
        sent.setdefault("Accept", "application/cbor")
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=raw, headers=sent)
        reply = conn.getresponse()
        return Reply(reply.status, reply.headers, reply.read())
    finally:
        conn.close()

"""Raw HTTP for tests that check statuses, headers and bodies byte for byte.

Nodes take a bearer token by default: ``call`` sends the admin token of the
cluster a URL belongs to, as registered by ``register`` (conftest's
``start_cluster`` does it), unless the caller sets Authorization itself.

A cluster of several Raft groups has no one leader: each group's leader
serves its queues, and any other node answers 307 to it. ``call`` follows
those redirects for such a cluster, as every client of one must (unless
``follow=False``), so the contract's tests hold for it unchanged; for a
cluster of one group it answers exactly what the node answered.
"""

import http.client
import json
from urllib.parse import urlsplit

import cbor2

TOKENS: dict[str, str] = {}   # host:port -> admin token of the cluster serving there
GROUPED: set[str] = set()     # host:port of nodes of clusters of several Raft groups
MAX_REDIRECTS = 8


def register(cluster) -> None:
    for url in cluster.urls:
        TOKENS[urlsplit(url).netloc] = cluster.token
        if cluster.cfg.groups > 1:
            GROUPED.add(urlsplit(url).netloc)


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
         cbor: bool = False, timeout: float = 30, follow: bool | None = None) -> Reply:
    """One request; `follow` (default: for a cluster of several groups) follows its 307s."""
    if follow is None:
        follow = urlsplit(url).netloc in GROUPED
    for _ in range(MAX_REDIRECTS):
        reply = _call_once(method, url, body, headers=headers, raw=raw, cbor=cbor, timeout=timeout)
        if not (follow and reply.status == 307):
            return reply
        url = reply.headers["Location"]
    return reply


def _call_once(method: str, url: str, body, *, headers, raw: bytes | None, cbor: bool, timeout: float) -> Reply:
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

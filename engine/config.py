"""cluster.toml: who the voters are and how to reach them.

```toml
[cluster]
secret = "..."          # encrypts and authenticates node-to-node traffic

[auth]                  # bearer tokens of the HTTP API (docs/security.md)
admin = "..."           # everything: queue config, membership, verify, data, metrics
data = "..."            # optional: queues' messages and consumer groups
metrics = "..."         # optional: GET /metrics

[[nodes]]
id = "n1"
raft = "10.0.0.1:7001"  # the address peers know this node by
http = "10.0.0.1:8001"
dial = "127.0.0.1:17001"  # optional, default off: where every peer connects to
                          # reach n1 instead of `raft`

[[links]]                 # optional, default off: one dialing direction of one pair
from = "n3"               # the node that opens the connection ...
to = "n1"                 # ... to this node ...
dial = "127.0.0.1:17101"  # ... connects here instead (overrides n1's `dial`)
```

Dialing never changes identity: a peer is always known and announced by its
`raft` address, only the TCP destination moves. `dial` per node cannot put a
separate fault-injection proxy on each pair of nodes, which partitions need
(cut n1-n2 but keep n1-n3); `[[links]]` can. pysyncobj opens one connection
per pair, dialed by the node whose `raft` string sorts higher, so a chaos
setup needs one link per pair, from that node (chaos/runner.py builds them).

A config holding a secret or a token must be readable by its owner only:
``load`` refuses it otherwise, naming the ``chmod`` to run, and
``write_private`` creates such a file with mode 0600 from its first byte.
"""

import json
import os
import secrets
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .consensus import Peer


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class NodeSpec:
    id: str
    raft: str
    http: str
    dial: str | None = None

    def peer(self) -> Peer:
        return Peer(id=self.id, raft_addr=self.raft, dial_addr=self.dial)


@dataclass(frozen=True)
class Link:
    """Where node `source` connects to reach node `target`."""
    source: str
    target: str
    dial: str


ROLES = ("admin", "data", "metrics")


@dataclass(frozen=True)
class Tokens:
    """Bearer tokens per role; admin implies data and metrics."""
    admin: str | None = None
    data: str | None = None
    metrics: str | None = None

    def any(self) -> bool:
        return any(getattr(self, role) for role in ROLES)

    @classmethod
    def generate(cls) -> "Tokens":
        return cls(**{role: secrets.token_urlsafe(32) for role in ROLES})


@dataclass(frozen=True)
class ClusterConfig:
    nodes: tuple[NodeSpec, ...]
    secret: str | None = None
    links: tuple[Link, ...] = ()
    tokens: Tokens = field(default_factory=Tokens)

    def node(self, node_id: str) -> NodeSpec:
        for spec in self.nodes:
            if spec.id == node_id:
                return spec
        raise ConfigError(f"node {node_id!r} is not in the cluster config "
                          f"(nodes: {', '.join(n.id for n in self.nodes)})")

    def dial_addr(self, source: str, target: str) -> str | None:
        """Where `source` connects to reach `target`; None means its raft address."""
        for link in self.links:
            if (link.source, link.target) == (source, target):
                return link.dial
        return self.node(target).dial

    def peers_for(self, node_id: str) -> list[Peer]:
        """The other voters as `node_id` dials them."""
        return [Peer(id=n.id, raft_addr=n.raft, dial_addr=self.dial_addr(node_id, n.id))
                for n in self.nodes if n.id != node_id]

    def to_toml(self) -> str:
        lines = []
        if self.secret is not None:
            lines += ["[cluster]", f"secret = {json.dumps(self.secret)}", ""]
        if self.tokens.any():
            lines += ["[auth]"] + [f"{role} = {json.dumps(getattr(self.tokens, role))}"
                                   for role in ROLES if getattr(self.tokens, role)] + [""]
        for spec in self.nodes:
            lines += ["[[nodes]]", f'id = "{spec.id}"', f'raft = "{spec.raft}"', f'http = "{spec.http}"']
            if spec.dial:
                lines.append(f'dial = "{spec.dial}"')
            lines.append("")
        for link in self.links:
            lines += ["[[links]]", f'from = "{link.source}"', f'to = "{link.target}"',
                      f'dial = "{link.dial}"', ""]
        return "\n".join(lines)


def _check_addr(value, what: str) -> str:
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} must be host:port, got {value!r}")
    return value


def write_private(path: str | Path, text: str) -> None:
    """Replace `path` atomically with a file only its owner can read (0600 from the start)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_private(path: str | Path, what: str) -> None:
    """Refuse a file holding a secret that others than its owner may read."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        raise ConfigError(f"{path} holds {what} but is readable by others (mode {mode:o}); "
                          f"run: chmod 600 {path}")


def load(path: str | Path) -> ClusterConfig:
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read cluster config {path}: {exc}") from exc
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ConfigError("cluster config needs at least one [[nodes]] table")
    nodes = []
    for raw in raw_nodes:
        if not isinstance(raw, dict) or not {"id", "raft", "http"} <= set(raw):
            raise ConfigError("each [[nodes]] table needs id, raft and http")
        nodes.append(NodeSpec(id=str(raw["id"]), raft=_check_addr(raw["raft"], "raft"),
                              http=_check_addr(raw["http"], "http"),
                              dial=_check_addr(raw["dial"], "dial") if raw.get("dial") else None))
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ConfigError("node ids must be unique")
    secret = (data.get("cluster") or {}).get("secret")
    tokens = _load_tokens(data.get("auth", {}))
    if secret or tokens.any():
        check_private(path, "the cluster secret" if secret else "API tokens")
    return ClusterConfig(nodes=tuple(nodes), secret=str(secret) if secret else None,
                         links=_load_links(data.get("links", []), set(ids)), tokens=tokens)


def _load_tokens(raw) -> Tokens:
    if not isinstance(raw, dict) or set(raw) - set(ROLES):
        raise ConfigError(f"[auth] may only set {', '.join(ROLES)}")
    for role, token in raw.items():
        if not isinstance(token, str) or len(token) < 16:
            raise ConfigError(f"[auth] {role} must be a string of at least 16 characters")
    if raw and "admin" not in raw:
        raise ConfigError("[auth] needs an admin token")
    return Tokens(**raw)


def _load_links(raw_links, ids: set[str]) -> tuple[Link, ...]:
    if not isinstance(raw_links, list):
        raise ConfigError("links must be [[links]] tables")
    links, pairs = [], set()
    for raw in raw_links:
        if not isinstance(raw, dict) or not {"from", "to", "dial"} <= set(raw):
            raise ConfigError("each [[links]] table needs from, to and dial")
        source, target = str(raw["from"]), str(raw["to"])
        if source not in ids or target not in ids or source == target:
            raise ConfigError(f"link {source!r} -> {target!r} must join two different nodes of the config")
        if (source, target) in pairs:
            raise ConfigError(f"link {source!r} -> {target!r} is given twice")
        pairs.add((source, target))
        links.append(Link(source=source, target=target, dial=_check_addr(raw["dial"], "dial")))
    return tuple(links)


def new_secret() -> str:
    return secrets.token_urlsafe(32)

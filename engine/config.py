"""cluster.toml: who the voters are and how to reach them.

```toml
[cluster]
secret = "..."          # encrypts and authenticates node-to-node traffic
groups = 4              # optional: Raft groups (default 1); fixed when the cluster is made
replicas = 3            # optional: members of each group but group 0 (default 3, at most the nodes)

[auth]                  # bearer tokens of the HTTP API (docs/security.md)
admin = "..."           # everything: queue config, membership, verify, data, metrics
data = "..."            # optional: queues' messages and consumer groups
metrics = "..."         # optional: GET /metrics

[sqs]                   # optional: the SQS API (docs/sqs.md); without keys every SQS call is refused
account = "123456789012"  # the account id in queue URLs and ARNs
hosts = ["sqs.example.com"]  # optional: names clients sign calls for, besides the nodes' http
[[sqs.keys]]
access_key = "AKIA..."
secret_key = "..."
role = "data"             # the raftq role the key acts as: admin or data

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



class ConfigError(ValueError):
    pass


DEFAULT_REPLICAS = 3
MAX_GROUPS = 64


def default_groups(cores: int) -> int:
    """The groups of a new cluster: half the cores, at least 1. Each busy
    group's leader takes a core; the fronts and the followers take the rest."""
    return max(1, min(MAX_GROUPS, cores // 2))


@dataclass(frozen=True)
class Peer:
    """A voter as Raft knows it: its id, the address peers know it by, and
    where this node connects to reach it (None: that address)."""
    id: str
    raft_addr: str
    dial_addr: str | None = None


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
        # Hex, not URL-safe base64: a token that began with '-' would be taken for an option
        # by `raftq ... --token TOKEN` (argparse), one cluster in 32.
        return cls(**{role: secrets.token_hex(32) for role in ROLES})


SQS_ROLES = ("admin", "data")
DEFAULT_SQS_ACCOUNT = "000000000000"


@dataclass(frozen=True)
class SqsKey:
    """An access key of the SQS API: its id, the secret it signs with, the raftq role it acts as."""
    access_key: str
    secret_key: str
    role: str


@dataclass(frozen=True)
class Sqs:
    account: str = DEFAULT_SQS_ACCOUNT
    keys: tuple[SqsKey, ...] = ()
    # names clients may sign calls for besides the nodes' HTTP addresses (a load balancer's, a DNS
    # name): host:port, or a host for any port; lower case
    hosts: frozenset = frozenset()

    def key(self, access_key: str) -> SqsKey | None:
        for key in self.keys:
            if key.access_key == access_key:
                return key
        return None


@dataclass(frozen=True)
class ClusterConfig:
    nodes: tuple[NodeSpec, ...]
    secret: str | None = None
    links: tuple[Link, ...] = ()
    tokens: Tokens = field(default_factory=Tokens)
    sqs: Sqs = field(default_factory=Sqs)
    groups: int = 1
    # None: DEFAULT_REPLICAS, capped at the nodes (`replicas_per_group`)
    replicas: int | None = None

    @property
    def replicas_per_group(self) -> int:
        """How many members each group but group 0 (which has every node) has."""
        return self.replicas if self.replicas is not None else min(DEFAULT_REPLICAS, len(self.nodes))

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
        cluster = ([f"secret = {json.dumps(self.secret)}"] if self.secret is not None else []) \
            + ([f"groups = {self.groups}"] if self.groups != 1 else []) \
            + ([f"replicas = {self.replicas}"] if self.replicas is not None else [])
        if cluster:
            lines += ["[cluster]", *cluster, ""]
        if self.tokens.any():
            lines += ["[auth]"] + [f"{role} = {json.dumps(getattr(self.tokens, role))}"
                                   for role in ROLES if getattr(self.tokens, role)] + [""]
        if self.sqs.keys or self.sqs.account != DEFAULT_SQS_ACCOUNT or self.sqs.hosts:
            lines += ["[sqs]", f"account = {json.dumps(self.sqs.account)}"]
            if self.sqs.hosts:
                lines.append(f"hosts = {json.dumps(sorted(self.sqs.hosts))}")
            lines.append("")
            for key in self.sqs.keys:
                lines += ["[[sqs.keys]]", f"access_key = {json.dumps(key.access_key)}",
                          f"secret_key = {json.dumps(key.secret_key)}", f"role = {json.dumps(key.role)}", ""]
        for spec in self.nodes:
            lines += ["[[nodes]]", f'id = "{spec.id}"', f'raft = "{spec.raft}"', f'http = "{spec.http}"']
            if spec.dial:
                lines.append(f'dial = "{spec.dial}"')
            lines.append("")
        for link in self.links:
            lines += ["[[links]]", f'from = "{link.source}"', f'to = "{link.target}"',
                      f'dial = "{link.dial}"', ""]
        return "\n".join(lines)


# the longest DNS name; an IPv6 literal in brackets is shorter
MAX_HOST_CHARS = 253


def check_addr(value, what: str) -> str:
    """`value` if it is host:port (port 1-65535), else ConfigError naming `what`."""
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or len(host) > MAX_HOST_CHARS or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} must be host:port, got {str(value)[:80]!r}")
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
        nodes.append(NodeSpec(id=str(raw["id"]), raft=check_addr(raw["raft"], "raft"),
                              http=check_addr(raw["http"], "http"),
                              dial=check_addr(raw["dial"], "dial") if raw.get("dial") else None))
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ConfigError("node ids must be unique")
    cluster = data.get("cluster") or {}
    if not isinstance(cluster, dict) or set(cluster) - {"secret", "groups", "replicas"}:
        raise ConfigError("[cluster] may only set secret, groups and replicas")
    secret = cluster.get("secret")
    groups = _count(cluster.get("groups", 1), "groups", MAX_GROUPS)
    replicas = _count(cluster["replicas"], "replicas", len(nodes)) if "replicas" in cluster else None
    tokens = _load_tokens(data.get("auth", {}))
    sqs = _load_sqs(data.get("sqs", {}))
    if secret or tokens.any() or sqs.keys:
        check_private(path, "the cluster secret" if secret else "API tokens" if tokens.any() else "SQS keys")
    return ClusterConfig(nodes=tuple(nodes), secret=str(secret) if secret else None,
                         links=_load_links(data.get("links", []), set(ids)), tokens=tokens, sqs=sqs,
                         groups=groups, replicas=replicas)


def _count(value, what: str, most: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
        raise ConfigError(f"[cluster] {what} must be a whole number from 1 to {most}, got {value!r}")
    return value


def _load_tokens(raw) -> Tokens:
    if not isinstance(raw, dict) or set(raw) - set(ROLES):
        raise ConfigError(f"[auth] may only set {', '.join(ROLES)}")
    for role, token in raw.items():
        if not isinstance(token, str) or len(token) < 16:
            raise ConfigError(f"[auth] {role} must be a string of at least 16 characters")
    if raw and "admin" not in raw:
        raise ConfigError("[auth] needs an admin token")
    return Tokens(**raw)


def _load_sqs(raw) -> Sqs:
    if not isinstance(raw, dict) or set(raw) - {"account", "keys", "hosts"}:
        raise ConfigError("[sqs] may only set account, hosts and [[sqs.keys]]")
    hosts = raw.get("hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) and 0 < len(h) <= MAX_HOST_CHARS + 6
                                              and h.isascii() and not set(h) & set(" /@") for h in hosts):
        raise ConfigError("[sqs] hosts must be a list of host or host:port names (those clients sign calls for)")
    account = raw.get("account", DEFAULT_SQS_ACCOUNT)
    if not isinstance(account, str) or not (len(account) == 12 and account.isascii() and account.isdigit()):
        raise ConfigError("[sqs] account must be a string of 12 digits, like an AWS account id")
    raw_keys = raw.get("keys", [])
    if not isinstance(raw_keys, list):
        raise ConfigError("[sqs] keys must be [[sqs.keys]] tables")
    keys = []
    for entry in raw_keys:
        if not isinstance(entry, dict) or set(entry) != {"access_key", "secret_key", "role"}:
            raise ConfigError("each [[sqs.keys]] table needs access_key, secret_key and role, and nothing else")
        access_key, secret_key, role = entry["access_key"], entry["secret_key"], entry["role"]
        if not isinstance(access_key, str) or not 16 <= len(access_key) <= 128 or not access_key.isalnum():
            raise ConfigError("an [[sqs.keys]] access_key must be 16 to 128 letters and digits")
        if not isinstance(secret_key, str) or len(secret_key) < 16:
            raise ConfigError(f"the secret_key of SQS key {access_key} must be a string of at least 16 characters")
        if role not in SQS_ROLES:
            raise ConfigError(f"the role of SQS key {access_key} must be admin or data")
        keys.append(SqsKey(access_key, secret_key, role))
    if len({k.access_key for k in keys}) != len(keys):
        raise ConfigError("each [[sqs.keys]] access_key may be given once")
    return Sqs(account=account, keys=tuple(keys), hosts=frozenset(h.lower() for h in hosts))


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
        links.append(Link(source=source, target=target, dial=check_addr(raw["dial"], "dial")))
    return tuple(links)


def new_secret() -> str:
    return secrets.token_urlsafe(32)


# Stretched as the Raft port's sealer stretches the secret (engine/raft/sealer.py), under a salt of
# its own: what the keys below let anyone observe (a receipt's MAC) is no cheaper a way to guess
# a weak secret than the Raft port.
KEYS_SALT = b"raftq cluster keys v1"
KEYS_ITERATIONS = 200_000


@dataclass(frozen=True)
class ClusterKeys:
    """Keys every node derives alike from the cluster secret, one per purpose, so that what
    one node makes another checks: a receipt's MAC (engine/link/receipts.py), the seal of an SQS
    secret kept in group 0's log (api/sqs/credentials.py), the client address a node
    forwards a call for (api/forwarding.py), and the hash of a principal's token kept in group
    0's log (api/principals.py). A cluster without a secret (--insecure-no-secret)
    derives them from nothing: anyone can compute them."""
    receipts: bytes
    sqs_secrets: bytes
    forwarding: bytes
    principal_tokens: bytes

    @classmethod
    def derive(cls, secret: str | None) -> "ClusterKeys":
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
        from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

        stretched = b"" if secret is None else PBKDF2HMAC(
            algorithm=hashes.SHA256(), length=32, salt=KEYS_SALT, iterations=KEYS_ITERATIONS).derive(secret.encode())

        def key(purpose: bytes) -> bytes:
            return HKDF(algorithm=hashes.SHA256(), length=32, salt=KEYS_SALT, info=purpose).derive(stretched)
        return cls(receipts=key(b"receipts"), sqs_secrets=key(b"sqs secrets"), forwarding=key(b"forwarding"),
                   principal_tokens=key(b"principal tokens"))

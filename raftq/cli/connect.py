"""Which cluster a client command talks to, with which credentials, and how it prints.

The nodes are, first found wins: ``--url`` (repeatable, or comma-separated),
``RAFTQ_URL`` (comma-separated), the local cluster that ``raftq up`` wrote to
``.raftq/cluster.toml`` (``--cluster-dir``/``RAFTQ_CLUSTER_DIR`` name another
directory), and last ``http://127.0.0.1:8001``.  Every node of the list is
tried in turn, so a command works while any of them answers.  The bearer
token is ``--token``, ``RAFTQ_TOKEN``, or the local cluster's own (its admin
token, whichever way the nodes were named); the CA bundle for https:// is
``--ca`` or ``RAFTQ_CA``.  The SQS account and keys, too, are the local
cluster's (its ``[sqs]``), whichever way the nodes were named.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

from raftq.engine.config import Sqs

from ..client import Client

DEFAULT_URL = "http://127.0.0.1:8001"
DEFAULT_CLUSTER_DIR = ".raftq"


@dataclass(frozen=True)
class Target:
    urls: list[str]
    token: str | None
    cafile: str | None
    source: str           # where the URLs came from, for error messages
    config_path: Path | None = None     # the local cluster.toml read, if any
    sqs: Sqs = Sqs()                    # its [sqs] account and keys (for `raftq bench --wire sqs`)
    token_from: str | None = None       # where the token came from, for error messages
    looked_for: Path | None = None      # the local cluster.toml looked for (absolute), found or not

    def client(self, *, retry_for: float = 5.0, timeout: float = 15.0) -> Client:
        return Client(self.urls, token=self.token, cafile=self.cafile, retry_for=retry_for, timeout=timeout)

    def describe(self) -> str:
        return f"{', '.join(self.urls)} (from {self.source})"


def _split(values) -> list[str]:
    return [u.strip().rstrip("/") for v in values for u in v.split(",") if u.strip()]


def target(args) -> Target:
    token = getattr(args, "token", None) or os.environ.get("RAFTQ_TOKEN")
    token_from = None if token is None else "--token" if getattr(args, "token", None) else "RAFTQ_TOKEN"
    cafile = getattr(args, "ca", None) or os.environ.get("RAFTQ_CA")
    root = Path(getattr(args, "cluster_dir", None) or os.environ.get("RAFTQ_CLUSTER_DIR") or DEFAULT_CLUSTER_DIR)
    local = None
    if (root / "cluster.toml").exists():
        from ..local import LocalCluster
        local = LocalCluster.open(root)
        token_from = token_from or (str(local.config_path) if local.token else None)
        token, cafile = token or local.token, cafile or local.cafile
    config = {"token_from": token_from, "looked_for": (root / "cluster.toml").absolute()}
    if local is not None:
        config.update(config_path=local.config_path, sqs=local.cfg.sqs)
    if getattr(args, "url", None):
        return Target(_split(args.url), token, cafile, "--url", **config)
    if os.environ.get("RAFTQ_URL"):
        return Target(_split([os.environ["RAFTQ_URL"]]), token, cafile, "RAFTQ_URL", **config)
    if local is not None:
        return Target(local.urls, token, cafile, str(root / "cluster.toml"), **config)
    return Target([DEFAULT_URL], token, cafile, "the default", **config)


def where_it_looked(where: Target, answer: Exception) -> str | None:
    """What a command without a cluster or a token found, and where it looked: said after an
    answer that needed a token (401), or after no node answered at the default address."""
    unauthorized = getattr(answer, "status", None) == 401
    if unauthorized and where.token_from is not None:
        return f"the token from {where.token_from} was refused by {', '.join(where.urls)} (from {where.source})"
    if not unauthorized and where.source != "the default":
        return None
    if where.config_path is not None:
        found = f"{where.config_path} holds no token"
    else:
        found = f"there is no {where.looked_for}"
    return ("no token was sent: none was given (--token, RAFTQ_TOKEN), and " if unauthorized
            else "no cluster was named (--url, RAFTQ_URL), and ") + found + (
        ".\n  `raftq up` keeps its cluster's cluster.toml in .raftq/ where it ran; from another directory, "
        "--cluster-dir DIR\n  (or RAFTQ_CLUSTER_DIR=DIR) names that directory, "
        + ("or give a token: RAFTQ_TOKEN=..." if unauthorized else "or name a node: --url URL (or RAFTQ_URL)"))


def emit(args, value, text: str | None = None) -> None:
    """--json: one line of JSON; else the text form (or indented JSON where there is none)."""
    if getattr(args, "json", False) or text is None:
        print(json.dumps(value, indent=None if getattr(args, "json", False) else 2, default=str))
    else:
        print(text)


def table(columns: tuple, rows: list) -> str:
    cells = [tuple(columns)] + [tuple("-" if c is None else str(c) for c in row) for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)

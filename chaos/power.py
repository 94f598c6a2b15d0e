"""A LocalCluster whose kill -9 is a power cut (chaos/sync_ledger.py)."""

from __future__ import annotations

import os
from pathlib import Path

from chaos.sync_ledger import cut, segment_sizes
from raftq.local import LocalCluster

NODE_SITE = Path(__file__).resolve().parent / "node_site"
# The sitecustomize imports chaos/, which is not installed (it drives the product from the
# checkout): the checkout goes on the path after it and after any tree a caller put there (an
# older release's), since `-m`'s own directory is put on the path only after sitecustomize ran.
CHECKOUT = NODE_SITE.parent.parent


def node_site_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose Python processes load chaos/node_site/sitecustomize.py."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, **(extra or {}),
            "PYTHONPATH": os.pathsep.join([str(NODE_SITE)] + ([path] if path else []) + [str(CHECKOUT)])}


class PowerCutCluster(LocalCluster):
    """kill() is a power cut: the node's unsynced writes are lost with it.

    Every node records its syncs in a ledger (in the cluster directory); after
    a kill -9 each of its journal segments is cut back to what was synced.
    `node_env(nid)` may add to a node's environment (a fake clock).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._baselines: dict[str, dict[str, int]] = {}
        self.dropped: dict[str, dict[str, int]] = {}   # what the last cut of each node took

    def ledger(self, node_id: str) -> Path:
        return self.root / f"{node_id}.sync-ledger"

    def node_env(self, node_id: str) -> dict[str, str]:
        return {}

    def start(self, node_id: str | None = None, extra_args: tuple[str, ...] = ()) -> None:
        for nid in [node_id] if node_id else self.ids:
            if self.running(nid):
                continue
            self._baselines[nid] = segment_sizes(self.root / nid)
            self.ledger(nid).unlink(missing_ok=True)
            # LocalCluster takes one environment for all nodes; choose it per start.
            self.env = node_site_env({"RAFTQ_SYNC_LEDGER": str(self.ledger(nid)), **self.node_env(nid)})
            super().start(nid, extra_args)

    def kill(self, node_id: str) -> None:
        started = node_id in self.procs    # maybe dead already: a SIGKILL sent by the caller
        super().kill(node_id)
        if started:
            self.dropped[node_id] = cut(self.root / node_id, self.ledger(node_id),
                                        self._baselines.get(node_id, {}))

"""Several Raft groups per cluster, against real node processes: a
supervisor per node, one engine process per group it is a member of, one
Raft port whose connections name their group; placement of replicas and
leader balancing (engine/placement.py, engine/balance.py)."""

import os
import time

import pytest

from engine.placement import for_cluster
from tests.conftest import start_cluster
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def group_views(cluster) -> dict[str, dict]:
    """Each running node's groups as its fronts see them: group -> role, leader, term."""
    views = {}
    for node_id in cluster.ids:
        if cluster.running(node_id):
            view = cluster.ready_view(node_id)
            if view is not None:
                views[node_id] = view["groups"]
    return views


def leaders(cluster) -> dict[int, str] | None:
    """Each group's leader, when every running member of it agrees on one that says it leads; else None."""
    views = group_views(cluster)
    if len(views) != sum(cluster.running(n) for n in cluster.ids):
        return None
    placement = for_cluster(cluster.cfg)
    found = {}
    for group in range(cluster.cfg.groups):
        seen = {views[n][str(group)]["leader"] for n in placement.members(group) if n in views}
        if len(seen) != 1 or None in seen:
            return None
        leader = seen.pop()
        if leader not in views or views[leader][str(group)]["role"] != "leader":
            return None
        found[group] = leader
    return found


def leads_per_node(cluster, found: dict[int, str]) -> dict[str, int]:
    counts = {n: 0 for n in cluster.ids if cluster.running(n)}
    for leader in found.values():
        counts[leader] += 1
    return counts


def balanced(cluster) -> dict[int, str] | None:
    """The leaders, once they spread within one over the running nodes."""
    found = leaders(cluster)
    if found is None:
        return None
    counts = leads_per_node(cluster, found)
    return found if max(counts.values()) - min(counts.values()) <= 1 else None


def node_processes(pid: int) -> list[int]:
    """The node's processes: its supervisor and every process in its process group."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pid:
                    found.append(int(entry))
            except ProcessLookupError:
                pass
    return found


def children_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


@pytest.fixture(scope="module")
def groups4(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("groups4"), 3, groups=4)
    yield cluster
    cluster.close()


def test_every_group_elects_one_leader_and_every_front_holds_every_engine(groups4):
    found = wait_until(lambda: leaders(groups4), timeout=60)
    assert sorted(found) == [0, 1, 2, 3]
    for node_id, groups in group_views(groups4).items():
        assert sorted(groups) == ["0", "1", "2", "3"], node_id   # 3 nodes, 3 replicas: every node holds every group
    # each group's engine is a process of its own under the node's supervisor
    for node_id in groups4.ids:
        assert len(children_of(groups4.pid(node_id))) >= 4 + 1   # 4 engines, and at least one front
    with groups4.client() as client:
        client.put("still-one-group-of-queues", "hello")
        got = client.receive("still-one-group-of-queues", max=1)["messages"]
        assert [m["body"] for m in got] == ["hello"]

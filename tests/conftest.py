"""Shared fixtures: real node processes on 127.0.0.1, stopped by PID whatever happens."""

import time

import pytest


def start_cluster(root, nodes: int = 3, **kwargs):
    # Imported here so that the pure tests (state machine, proxies) need none of the node.
    from raftq.local import LocalCluster
    from tests.wire import register

    cluster = LocalCluster.create(root, nodes, **kwargs)
    register(cluster)
    try:
        cluster.start()
        if cluster.wait_for_leader(60) is None or not cluster.wait_all_ready(60):
            logs = "\n".join(f"--- {nid}\n{cluster.log_path(nid).read_text()[-3000:]}" for nid in cluster.ids)
            raise RuntimeError(f"the cluster did not come up\n{logs}")
    except BaseException:
        cluster.close()
        raise
    return cluster


# How long every group's leader and term must hold still before a cluster counts as settled: a
# cluster of 4 groups is 18 processes starting on 2 cores, and an engine starved in its first
# second may lose the lead it was just handed (CheckQuorum) once the wait had seen it.
STEADY_S = 1.5


def wait_for_preferred_leaders(cluster, timeout: float = 60) -> None:
    """Until every Raft group is led by its first preference, as each member reports it, and has
    been for STEADY_S in the same term: where leader balancing leaves a cluster of several groups
    once every node runs."""
    from engine.placement import for_cluster
    from tests.waiting import wait_until

    placement = for_cluster(cluster.cfg)
    steady = {"terms": None, "since": 0.0}

    def settled() -> bool:
        views = {node_id: cluster.ready_view(node_id, groups=True) for node_id in cluster.ids}
        if any(view is None for view in views.values()):
            return False
        terms = []
        for group in range(cluster.cfg.groups):
            preferred = placement.members(group)[0]
            states = [views[member]["raft_groups"].get(str(group), {}) for member in placement.members(group)]
            if any(state.get("leader") != preferred for state in states) \
                    or views[preferred]["raft_groups"][str(group)]["role"] != "leader":
                steady["terms"] = None
                return False
            terms.append(views[preferred]["raft_groups"][str(group)]["term"])
        if terms != steady["terms"]:
            steady.update(terms=terms, since=time.monotonic())
        return time.monotonic() - steady["since"] >= STEADY_S
    wait_until(settled, timeout, "every group's leader to be its first preference")


def clusters_of_one_and_four_groups(request, tmp_path_factory):
    """A 3-node cluster of `request.param` Raft groups (1 or 4: issue 24's contract holds for
    both), its leaders settled where balancing puts them; stopped at the end."""
    cluster = start_cluster(tmp_path_factory.mktemp(f"cluster3-g{request.param}"), groups=request.param)
    try:
        if request.param > 1:
            wait_for_preferred_leaders(cluster)
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("cluster3"))
    yield cluster
    cluster.close()


@pytest.fixture
def fresh_cluster(tmp_path):
    """A factory for clusters a test may break; all of them are killed at the end."""
    made = []

    def make(nodes: int = 3, **kwargs):
        cluster = start_cluster(tmp_path / f"c{len(made)}", nodes, **kwargs)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()

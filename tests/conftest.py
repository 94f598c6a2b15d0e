"""Shared fixtures: real node processes on 127.0.0.1, stopped by PID whatever happens."""

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

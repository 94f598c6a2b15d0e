"""Shared fixtures: real node processes on 127.0.0.1, stopped by PID whatever happens (and
whatever a test leaves, when the run ends or is stopped: tests/stopping.py)."""

import time
import weakref

import pytest

from tests import stopping
from tests.sparkutil import stop_spark_jvm

# Every cluster a test started, so that a failed test's report ends with what its nodes logged.
STARTED_CLUSTERS = weakref.WeakSet()
LOG_SEARCHED_BYTES = 8 << 20    # of each log, read back for its warnings
LOG_WARNINGS = 30
LOG_TAIL_BYTES = 6_000


def start_cluster(root, nodes: int = 3, **kwargs):
    # Imported here so that the pure tests (state machine, proxies) need none of the node.
    from raftq.local import LocalCluster
    from tests.wire import register

    cluster = LocalCluster.create(root, nodes, **kwargs)
    register(cluster)
    STARTED_CLUSTERS.add(cluster)
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


def wait_for_settled_leaders(cluster, timeout: float = 60) -> None:
    """Until every Raft group is led by the node each of its members names -- with several
    groups, its first preference, where leader balancing leaves them once every node runs --
    and has been for STEADY_S in the same term: a test that puts and then receives is not
    undone by the elections of a cluster still starting (a receive whose lead is lost may be
    written with nobody told, its messages leased until the lease ends)."""
    from raftq.engine.placement import for_cluster
    from tests.waiting import wait_until

    placement = for_cluster(cluster.cfg)
    steady = {"terms": None, "since": 0.0}

    def settled() -> bool:
        views = {node_id: cluster.ready_view(node_id, groups=True) for node_id in cluster.ids}
        if any(view is None for view in views.values()):
            return False
        terms = []
        for group in range(cluster.cfg.groups):
            states = [views[member]["raft_groups"].get(str(group), {}) for member in placement.members(group)]
            leader = placement.members(group)[0] if cluster.cfg.groups > 1 else states[0].get("leader")
            if leader is None or any(state.get("leader") != leader for state in states) \
                    or views[leader]["raft_groups"][str(group)]["role"] != "leader":
                steady["terms"] = None
                return False
            terms.append(views[leader]["raft_groups"][str(group)]["term"])
        if terms != steady["terms"]:
            steady.update(terms=terms, since=time.monotonic())
        return time.monotonic() - steady["since"] >= STEADY_S
    wait_until(settled, timeout, "every group's leader to hold still where it belongs")


def clusters_of_one_and_four_groups(request, tmp_path_factory):
    """A 3-node cluster of `request.param` Raft groups (1 or 4: issue 24's contract holds for
    both), its leaders settled (where balancing puts them); stopped at the end."""
    cluster = start_cluster(tmp_path_factory.mktemp(f"cluster3-g{request.param}"), groups=request.param)
    try:
        wait_for_settled_leaders(cluster)
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


def pytest_configure(config):
    stopping.stop_on_signals()


def pytest_unconfigure(config):
    stop_spark_jvm()
    stopping.kill_what_is_left()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report holds each running node's last warnings and the tail of its log:
    a flake in CI is explained by its elections and errors, which are gone once the run ends
    (and which a burst of routine lines would push out of the tail alone)."""
    report = (yield).get_result()
    if report.failed and report.when == "call":
        for cluster in list(STARTED_CLUSTERS):
            for node_id, proc in cluster.procs.items():
                if proc.poll() is None:
                    with open(cluster.log_path(node_id), "rb") as log:
                        log.seek(0, 2)
                        log.seek(max(0, log.tell() - LOG_SEARCHED_BYTES))
                        lines = log.read().decode(errors="replace").splitlines(keepends=True)
                    warnings = [line for line in lines if '"level":"warning"' in line or '"level":"error"' in line]
                    tail = "".join(lines)[-LOG_TAIL_BYTES:]
                    report.sections.append((f"{cluster.root.name} {node_id}'s log, its last warnings and errors",
                                            "".join(warnings[-LOG_WARNINGS:])))
                    report.sections.append((f"{cluster.root.name} {node_id}'s log, its tail", tail))

"""Disk faults injected into real node processes through the write seam (chaos/disk_faults.py).

Each node loads the fault injector (chaos/node_site/sitecustomize.py); a test arms a fault
in the one control file of its cluster, naming the node by its data directory.
"""

import http.client
import threading
import time
from pathlib import Path

import pytest

from chaos import disk_faults
from chaos.power import node_site_env
from raftq.client import RaftqError
from raftq.local import LocalCluster
from tests.conftest import STARTED_CLUSTERS
from tests.waiting import wait_until
from tests.wire import register

pytestmark = pytest.mark.integration


def start_faulty_cluster(root: Path, nodes: int = 3, **kwargs):
    """A cluster whose nodes watch `root`/disk-faults.json for faults to inject."""
    control = root / "disk-faults.json"
    cluster = LocalCluster.create(root / "c", nodes, env=node_site_env({"RAFTQ_DISK_FAULTS": str(control)}),
                                  **kwargs)
    register(cluster)
    STARTED_CLUSTERS.add(cluster)
    try:
        cluster.start()
        assert cluster.wait_for_leader(60) and cluster.wait_all_ready(60)
    except BaseException:
        cluster.close()
        raise
    return cluster, control


def engine_pid(cluster, node_id: str, group: int = 0) -> int | None:
    """The pid of the node's engine of `group` (a child of its supervisor named raftq-group-<g>)."""
    supervisor = cluster.pid(node_id)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text()
        except OSError:
            continue
        comm, rest = fields[fields.index("(") + 1:fields.rindex(")")], fields[fields.rindex(")") + 2:].split()
        if int(rest[1]) == supervisor and comm == f"raftq-group-{group}":
            return int(stat.parent.name)
    return None


class Producer(threading.Thread):
    """Puts numbered messages, each with an id, recording which were acknowledged."""

    def __init__(self, cluster, queue: str):
        super().__init__(daemon=True)
        self.cluster, self.queue = cluster, queue
        self.acked: list[int] = []
        self.stop = threading.Event()

    def run(self):
        with self.cluster.client(retry_for=10, timeout=5) as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                try:
                    client.put(self.queue, n, id=f"{self.queue}-{n}")
                    self.acked.append(n)
                except (OSError, RaftqError):
                    pass


class Watcher(threading.Thread):
    """Asks a node for GET `path` every few milliseconds, keeping each answer's status."""

    def __init__(self, cluster, node_id: str, path: str):
        super().__init__(daemon=True)
        self.addr, self.path, self.token = cluster.cfg.node(node_id).http, path, cluster.token
        self.statuses: list[int] = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.02):
            conn = http.client.HTTPConnection(self.addr, timeout=5)
            try:
                conn.request("GET", self.path, headers={"Authorization": f"Bearer {self.token}"})
                reply = conn.getresponse()
                reply.read()
                self.statuses.append(reply.status)
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()


def stored(client, queue: str) -> list:
    bodies, seq = [], 0
    while page := client.browse(queue, from_seq=seq, limit=1000)["messages"]:
        bodies += [m["body"] for m in page]
        seq = page[-1]["seq"] + 1
    return bodies


def test_an_engine_whose_fsync_fails_is_started_again_and_loses_nothing_acknowledged(tmp_path):
    """After EIO from fsync the kernel may have dropped the pages it could not write, and a second
    fsync would succeed (fsyncgate): the engine stops at once, without a sync on the way out, and
    its supervisor starts it again, from what is on disk and from its peers."""
    cluster, control = start_faulty_cluster(tmp_path)
    try:
        producer = Producer(cluster, "jobs")
        producer.start()
        wait_until(lambda: len(producer.acked) >= 20, 60, "puts acknowledged before the fault")
        leader = cluster.wait_for_leader(30)
        before = engine_pid(cluster, leader)
        # the node's view of the cluster, asked all along: while the engine is started again it
        # answers 503 (retry), never 500 (a broken node)
        watcher = Watcher(cluster, leader, "/v1/cluster")
        watcher.start()
        disk_faults.arm(control, {"kind": "sync_eio", "path": f"/{leader}/raft/", "count": 1})
        wait_until(lambda: disk_faults.hits(control) == 1, 30, "the leader's next sync to fail")
        wait_until(lambda: engine_pid(cluster, leader) not in (None, before), 30, "the engine to be started again")
        assert cluster.running(leader)             # the node itself never stopped
        wait_until(lambda: (cluster.ready_view(leader) or {}).get("ready"), 60, "the node to serve again")
        wait_until(lambda: watcher.statuses[-1:] == [200], 30, "the node's view of the cluster again")
        watcher.stop.set()
        watcher.join()
        assert 500 not in watcher.statuses and 503 in watcher.statuses, watcher.statuses
        acked = len(producer.acked)
        wait_until(lambda: len(producer.acked) >= acked + 20, 60, "puts acknowledged after the fault")
        producer.stop.set()
        producer.join(timeout=30)
        log = cluster.log_path(leader).read_text()
        assert "fsync" in log and "Input/output error" in log and "starting it again" in log
        with cluster.client(retry_for=30) as client:
            bodies = stored(client, "jobs")
        assert set(producer.acked) <= set(bodies)
        assert len(bodies) == len(set(bodies))     # each id stored once, however often it was retried
    finally:
        cluster.close()


def test_with_several_groups_each_engine_whose_fsync_fails_is_started_again_alone(tmp_path):
    """Group 2's engine, then group 0's (which reports to the supervisor the groups the node
    should hold, over a socket of its own): each is started again while the node's other
    engines and its fronts run on, and the node still runs every group it held. While group 0's
    engine is started again, the node serves the queues of the other groups from the catalog's
    view it last had (never a 500)."""
    from tests.test_groups import leaders
    from tests.test_routing import queues_in_groups

    cluster, control = start_faulty_cluster(tmp_path, groups=4)
    try:
        wait_until(lambda: leaders(cluster), 90, "every group led")
        queues = queues_in_groups(cluster)
        node = "n2"
        held = {group: engine_pid(cluster, node, group) for group in range(4)}
        held = {group: pid for group, pid in held.items() if pid is not None}
        assert {0, 2} <= set(held)
        for n, group in enumerate((2, 0)):
            where = f"/{node}/group-{group}/" if group else f"/{node}/raft/"
            # a queue of another group, asked of this node all along (a replica's answer, or a redirect)
            watcher = Watcher(cluster, node, f"/v1/queues/{queues[1 if group == 0 else 0]}?consistency=any")
            watcher.start()
            disk_faults.arm(control, {"kind": "sync_eio", "path": where, "count": 1, "id": str(group)})
            with cluster.client(retry_for=30) as client:
                for queue in queues.values():      # writes to every group, so the one armed syncs
                    client.put(queue, f"round {n}")
            wait_until(lambda: disk_faults.hits(control, str(group)) == 1, 30, f"group {group}'s sync to fail")
            wait_until(lambda: engine_pid(cluster, node, group) not in (None, held[group]), 30,
                       f"group {group}'s engine to be started again")
            held[group] = engine_pid(cluster, node, group)
            assert {g: engine_pid(cluster, node, g) for g in held} == held   # the others ran on
            wait_until(lambda: leaders(cluster), 90, "every group led again")
            watcher.stop.set()
            watcher.join()
            assert 500 not in watcher.statuses and watcher.statuses, watcher.statuses
        assert cluster.running(node)
        with cluster.client(retry_for=30) as client:
            for queue in queues.values():
                assert [m["body"] for m in client.browse(queue)["messages"]] == ["round 0", "round 1"]
    finally:
        cluster.close()

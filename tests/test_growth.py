"""Growing and shrinking a cluster of several Raft groups under load (issue 24, "Growing the
cluster"): `raftq cluster add` of two nodes, then `raftq cluster remove` of both, while a
producer puts with ids; the replica mover (api/mover.py) moves one replica at a time, the
node running it is killed in the middle of a move and another finishes it, one node is
removed after it died, and every acknowledged message is stored exactly once, with every
group's replicas agreeing."""

import dataclasses
import shutil
import threading
from collections import Counter

import pytest

from raftq.engine.config import NodeSpec
from raftq.cli.cluster import voters_disagreeing
from raftq.client import Client
from raftq.failover import RaftqError
from raftq.local import free_ports
from tests.conftest import start_cluster
from tests.test_routing import queues_in_groups
from tests.test_stream_groups import stored_bodies
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def record(client: Client) -> dict:
    """Group 0's record as the routing shows it. While a move ends, a node whose view of the
    record lags may ask a group's former member, which sends it on to a member it knows."""
    routing = client.routing()
    return {"move": routing["move"], "members": {g["id"]: g["members"] for g in routing["groups"][1:]}}


def join(cluster, client: Client, node_id: str) -> None:
    """A new node on free ports: in cluster.toml, added to group 0 (`raftq cluster add`), started
    to join; the replica mover then moves replicas onto it."""
    raft_port, http_port = free_ports(2)
    spec = NodeSpec(id=node_id, raft=f"127.0.0.1:{raft_port}", http=f"127.0.0.1:{http_port}")
    cluster.cfg = dataclasses.replace(cluster.cfg, nodes=cluster.cfg.nodes + (spec,))
    cluster.write_config()
    client.add_node(spec.id, spec.raft, spec.http)
    cluster.start(node_id, extra_args=("--join",))


def spread_over(client: Client, nodes: list[str]) -> dict | None:
    """Group 0's record if it shows no move in progress and groups 1..G-1 on `nodes` alone,
    within one replica per node; else None. Only the last record of a growth shows both, but
    two reads may ask two nodes, one of which lags: a test keeps the members of the read that
    judged them spread."""
    now = record(client)
    held = Counter(member for members in now["members"].values() for member in members)
    counts = [held.get(node_id, 0) for node_id in nodes]
    spread = now["move"] is None and set(held) <= set(nodes) and max(counts) - min(counts) <= 1
    return now if spread else None


def spread_once_applied(client: Client, nodes: list[str]) -> None:
    """Wait until the record the client reads shows the replicas spread over `nodes`. A node
    counts the voters its log holds (Raft's rule), but its record is what it has applied: a
    node that has the removal of a leaving node in its log may not yet have applied the
    record of the last replica moved away from it, written before that removal."""
    wait_until(lambda: spread_over(client, nodes), 60, f"every replica recorded on {', '.join(nodes)}")


def replicas_agree(client: Client, groups: int) -> None:
    """`verify` of every group: no two replicas' digests at one checkpoint differ, at once; and
    every replica gives its digest, in time. A replica that gave none (still applying up to the
    checkpoint after a move, on a loaded machine) is asked again at a new checkpoint."""
    def every_replica_answered() -> bool:
        verified = client.verify()
        assert len(verified["groups"]) == groups, verified
        assert verified["verdict"] != "differ", verified
        return verified["verdict"] == "agree"
    wait_until(every_replica_answered, 60, "every replica's digest at one checkpoint")


def voters(cluster) -> list[str]:
    """Group 0's voters as the nodes that stay see them (a node removed is told nothing more)."""
    with Client([cluster.url(node_id) for node_id in ("n1", "n2", "n3")], token=cluster.token) as client:
        return [node["id"] for node in client.cluster()["nodes"]]


def test_a_loaded_cluster_of_four_groups_grows_to_five_nodes_and_shrinks_back_losing_nothing(tmp_path):
    cluster = start_cluster(tmp_path / "c", 3, groups=4, replicas=3)
    try:
        queues = list(queues_in_groups(cluster).values())
        acknowledged, stop = [], threading.Event()

        def produce() -> None:
            with cluster.client() as client:
                sent = 0
                while not stop.is_set():
                    body = f"m{sent}"
                    while True:       # the same id until it is acknowledged: stored once however often sent
                        try:
                            client.put(queues[sent % len(queues)], body, id=body)
                            break
                        except (RaftqError, OSError):
                            if stop.is_set():
                                return
                    acknowledged.append(body)
                    sent += 1
        producer = threading.Thread(target=produce)
        producer.start()
        client = cluster.client()
        try:
            for node_id in ("n4", "n5"):
                join(cluster, client, node_id)
            # kill -9 of the node whose front moves replicas, in the middle of a move: the next
            # leader of group 0 finishes it from the record
            wait_until(lambda: record(client)["move"] is not None, 60, "a move to begin")
            mover = client.cluster()["leader"]
            cluster.kill(mover)
            cluster.start(mover)
            grown = wait_until(lambda: spread_over(client, cluster.ids), 240,
                               "the replicas to spread over five nodes")["members"]
            assert {"n4", "n5"} <= {m for members in grown.values() for m in members}
            assert len(acknowledged) > 0
            # n5 dies first (a dead node replaced): its replicas leave it before others join them
            cluster.kill("n5")
            for node_id in ("n5", "n4"):
                client.remove_node(node_id)
                wait_until(lambda: node_id not in voters(cluster), 240, f"{node_id} to leave once its replicas moved away")
                cluster.stop(node_id)
            spread_once_applied(client, ["n1", "n2", "n3"])
        finally:
            stop.set()
            producer.join(60)
        stored = Counter()
        for queue in queues:
            stored.update(stored_bodies(client, queue))
        assert set(stored) >= set(acknowledged) and max(stored.values()) == 1
        replicas_agree(client, 4)
        client.close()
    finally:
        cluster.close()


def test_a_node_removed_while_a_move_to_it_is_in_progress_leaves_with_its_replicas_moved_away(tmp_path):
    """`raftq cluster remove` of the node a replica is being moved to: the move ends (the node
    holds that replica until it is moved away again), then every replica leaves it, then it
    leaves group 0; nothing stored is lost and the replicas agree."""
    cluster = start_cluster(tmp_path / "c", 3, groups=4, replicas=3)
    try:
        queues = list(queues_in_groups(cluster).values())
        with cluster.client() as client:
            for n in range(40):
                client.put(queues[n % len(queues)], f"m{n}", id=f"m{n}")
            join(cluster, client, "n4")
            wait_until(lambda: (record(client)["move"] or {}).get("target") == "n4", 60, "a move to n4 to begin")
            client.remove_node("n4")
            wait_until(lambda: "n4" not in voters(cluster), 240, "n4 to leave once its replicas moved away")
            cluster.stop("n4")
            spread_once_applied(client, ["n1", "n2", "n3"])
            stored = Counter()
            for queue in queues:
                stored.update(stored_bodies(client, queue))
            assert stored == Counter(f"m{n}" for n in range(40))
            replicas_agree(client, 4)
    finally:
        cluster.close()


def test_a_grown_cluster_restarted_with_the_cluster_toml_written_before_it_grew(tmp_path):
    """`raftq cluster add` changes the membership in Raft, not in cluster.toml. A cluster grown
    to four nodes and then stopped, its first three started again with the cluster.toml they
    were first given: every replica of every group counts the voters its log says (group 0's
    four, each other group's record), before and after a leader is elected, and every message
    is there once."""
    cluster = start_cluster(tmp_path / "c", 3, groups=4, replicas=3)
    try:
        written_before = tmp_path / "cluster-before-it-grew.toml"
        shutil.copy2(cluster.config_path, written_before)     # mode 0600: it holds the secret
        queues = list(queues_in_groups(cluster).values())
        with cluster.client() as client:
            for n in range(40):
                client.put(queues[n % len(queues)], f"m{n}", id=f"m{n}")
            join(cluster, client, "n4")
            # the members of the read that judged them spread: a second read may ask a node that lags
            members = wait_until(lambda: spread_over(client, cluster.ids), 240,
                                 "the replicas to spread over four nodes")["members"]
        grown = cluster.config_path
        cluster.stop()
        cluster.config_path = written_before
        for node_id in ("n1", "n2", "n3"):
            cluster.start(node_id)
        cluster.config_path = grown
        cluster.start("n4")
        wanted = {"0": cluster.ids, **{str(group): held for group, held in members.items()}}

        def voters_as_logged() -> bool:
            """Whether exactly the replicas the record names run, once their engines answer; a
            replica the record names that counts other voters than the log says fails at once.
            (A replica moved away just before the stop may run until its node has read group
            0's record again: its engine is then stopped and its data removed.)"""
            running = set()
            for node_id in cluster.ids:
                view = cluster.ready_view(node_id, groups=True) or {}
                for group, state in view.get("raft_groups", {}).items():
                    if state["voters"] is None:
                        continue
                    running.add((group, node_id))
                    if node_id in wanted[group]:
                        assert state["voters"] == sorted(wanted[group]), (node_id, group, state)
            return running == {(group, node_id) for group, held in wanted.items() for node_id in held}
        wait_until(voters_as_logged, 60, "every replica of every group to report its voters")
        assert cluster.wait_all_ready(60)
        wait_until(voters_as_logged, 10, "the voters to hold once leaders are elected")
        with cluster.client() as client:
            for n in range(40, 80):
                client.put(queues[n % len(queues)], f"m{n}", id=f"m{n}")
            stored = Counter()
            for queue in queues:
                stored.update(stored_bodies(client, queue))
            assert stored == Counter(f"m{n}" for n in range(80))
            assert record(client)["members"] == members
            groups = client.cluster()["groups"]
            assert all(replica["voters"] for group in groups for replica in group["replicas"].values())
            assert not voters_disagreeing(groups)
            replicas_agree(client, 4)
    finally:
        cluster.close()

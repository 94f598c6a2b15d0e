"""Several Raft groups per cluster, against real node processes: a
supervisor per node, one engine process per group it is a member of, one
Raft port whose connections name their group; placement of replicas and
leader balancing (engine/placement.py, engine/balance.py)."""

import asyncio
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from raftq.engine.placement import for_cluster
from raftq.engine.raft.wire import FRAME, HANDSHAKE_DEADLINE_S
from tests.conftest import start_cluster, wait_for_settled_leaders
from tests.test_security_raft import still_open_after
from tests.wire import call
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def group_views(cluster) -> dict[str, dict]:
    """Each running node's groups as its fronts see them: group -> role, leader, term."""
    views = {}
    for node_id in cluster.ids:
        if cluster.running(node_id):
            view = cluster.ready_view(node_id, groups=True)
            if view is not None:
                views[node_id] = view["raft_groups"]
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


def test_every_group_logs_plain_entries_and_its_replicas_apply_them_alike(groups4):
    """engine/raft/node.py, item 19, with several Raft groups: each node's first front tells every
    engine it holds, so every replica of every group logs without pickle; puts through HTTP and
    the streaming wire to queues placed in every group are served, and every group's replicas
    agree."""
    from raftq.client import Producer

    def all_plain():
        views = group_views(groups4)
        return len(views) == 3 and all(state.get("plain_entries") is True
                                       for groups in views.values() for state in groups.values())
    wait_until(all_plain, 30, "every engine of every node to log plain entries")
    queues = [f"plain-{n}" for n in range(12)]
    with groups4.client() as client:
        for queue in queues:
            client.put(queue, {"door": "http"})

    async def stream():
        async with Producer(groups4.urls, token=groups4.token) as producer:
            for queue in queues:
                await (await producer.send(queue, {"door": "stream"}))
    asyncio.run(stream())
    with groups4.client() as client:
        placed = {group for queue, group in client.routing()["queues"].items() if queue in queues}
        assert placed == {0, 1, 2, 3}, placed
        for queue in queues:
            got = client.receive(queue, max=2)["messages"]
            assert sorted(m["body"]["door"] for m in got) == ["http", "stream"], queue
        verdict = client.verify()
        assert verdict["agree"] and len(verdict["groups"]) == 4, verdict


def test_leaders_spread_after_start_and_again_after_a_node_dies_and_returns(groups4):
    before = wait_until(lambda: balanced(groups4), timeout=60, what="leaders spread within one")
    assert set(leads_per_node(groups4, before).values()) <= {1, 2}
    victim = max(groups4.ids, key=lambda n: list(before.values()).count(n))
    led = [group for group, leader in before.items() if leader == victim]
    groups4.kill(victim)
    after = wait_until(lambda: balanced(groups4), timeout=60, what="leaders after the kill")
    assert all(after[group] != victim for group in led)
    groups4.start(victim)
    assert groups4.wait_all_ready(60)
    back = wait_until(lambda: (found := balanced(groups4)) and victim in found.values() and found,
                      timeout=60, what="leaders spread again over all three")
    counts = leads_per_node(groups4, back)
    assert max(counts.values()) - min(counts.values()) <= 1, counts


def raft_addr(cluster, node_id: str) -> tuple[str, int]:
    host, port = cluster.cfg.node(node_id).raft.rsplit(":", 1)
    return host, int(port)


@pytest.mark.parametrize("sent", [b"RAFTQ-GROUP x\n", b"RAFTQ-GROUP 0\n", b"RAFTQ-GROUP 9\n",
                                  b"RAFTQ-GROUP " + b"1" * 40],
                         ids=["not-a-number", "group-0-named", "a-group-not-held", "too-long"])
def test_a_connection_with_a_bad_preamble_is_closed_at_once(groups4, sent):
    with socket.create_connection(raft_addr(groups4, "n1"), timeout=10) as sock:
        sock.sendall(sent)
        started = time.monotonic()
        assert still_open_after([sock], HANDSHAKE_DEADLINE_S - 0.5) == []
        assert time.monotonic() - started < HANDSHAKE_DEADLINE_S - 0.5


def test_an_unterminated_preamble_is_closed_at_the_handshake_deadline(groups4):
    with socket.create_connection(raft_addr(groups4, "n1"), timeout=10) as sock:
        sock.sendall(b"RAFTQ-GROUP 1")
        assert still_open_after([sock], HANDSHAKE_DEADLINE_S + 10) == []


def test_a_stranger_naming_a_group_but_without_the_secret_is_refused_and_costs_no_election(groups4):
    found = wait_until(lambda: balanced(groups4), timeout=60, what="leaders spread")
    leader = found[1]
    term = group_views(groups4)[leader]["1"]["term"]
    garbage = pickle.dumps("readonly")
    socks = []
    try:
        for _ in range(20):
            sock = socket.create_connection(raft_addr(groups4, leader), timeout=10)
            sock.sendall(b"RAFTQ-GROUP 1\n" + FRAME.pack(len(garbage)) + garbage)
            socks.append(sock)
        assert still_open_after(socks, HANDSHAKE_DEADLINE_S + 10) == []
    finally:
        for sock in socks:
            sock.close()
    time.sleep(1.0)   # an election the connections caused would have started by now
    view = group_views(groups4)[leader]["1"]
    assert view["role"] == "leader" and view["term"] == term, view


def engine_pids(cluster, node_id: str) -> dict[int, int]:
    """group -> the pid of the node's engine process for it, from the node's log."""
    pids = {}
    for line in cluster.log_path(node_id).read_text().splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry["logger"] == "raftq.engine_process" and "Raft on" in entry["msg"]:
                pids[entry["group"]] = entry["pid"]
    return {group: pid for group, pid in pids.items() if pid in children_of(cluster.pid(node_id))}


def test_sigterm_hands_each_led_group_over_and_stops_the_node_cleanly(groups4):
    found = wait_until(lambda: balanced(groups4), timeout=60, what="leaders spread")
    node_id = found[1]
    led = sorted(group for group, leader in found.items() if leader == node_id)
    proc = groups4.procs[node_id]
    lines_before = len(groups4.log_path(node_id).read_text().splitlines())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    groups4.procs.pop(node_id)
    assert node_processes(proc.pid) == []
    entries = [json.loads(line) for line in groups4.log_path(node_id).read_text().splitlines()[lines_before:]
               if line.startswith("{")]
    handed = sorted(e["group"] for e in entries if e["msg"] == "leadership handed over before shutdown")
    assert handed == led, entries[-20:]
    others = wait_until(lambda: leaders(groups4), timeout=30, what="new leaders")
    assert node_id not in others.values()
    groups4.start(node_id)
    assert groups4.wait_all_ready(60)


def test_kill_9_of_one_engine_process_stops_its_node_whole(groups4):
    node_id = "n3"
    assert groups4.wait_all_ready(60)
    pids = wait_until(lambda: len(engine_pids(groups4, node_id)) == 4 and engine_pids(groups4, node_id),
                      timeout=30, what="n3's engines")
    proc = groups4.procs[node_id]
    everyone = node_processes(proc.pid)
    assert set(pids.values()) < set(everyone)
    os.kill(pids[2], signal.SIGKILL)
    assert proc.wait(60) == 1
    groups4.procs.pop(node_id)
    wait_until(lambda: not [p for p in everyone if os.path.exists(f"/proc/{p}")], timeout=30,
               what="every process of the node gone")
    lines = [json.loads(line)["msg"] for line in groups4.log_path(node_id).read_text().splitlines()
             if line.startswith("{")]
    assert f"group 2's engine (pid {pids[2]}) ended (killed by SIGKILL); stopping the node" in lines
    groups4.start(node_id)
    assert groups4.wait_all_ready(60)
    wait_until(lambda: leaders(groups4), timeout=60, what="every group led again")


def test_five_nodes_place_three_replicas_of_each_group_as_placement_says(tmp_path):
    from tests.test_routing import queues_in_groups    # which imports this module

    cluster = start_cluster(tmp_path / "five", 5, groups=4, replicas=3)
    try:
        wait_until(lambda: leaders(cluster), timeout=60, what="every group led")
        placement = for_cluster(cluster.cfg)
        views = group_views(cluster)
        for node_id in cluster.ids:
            holds = placement.groups_of(node_id)
            assert sorted(int(g) for g in views[node_id]) == holds, node_id
            on_disk = sorted(int(p.name.split("-")[1]) for p in (cluster.root / node_id).glob("group-*"))
            assert on_disk == [g for g in holds if g > 0], node_id
            assert (cluster.root / node_id / "raft" / "journal").is_dir()   # group 0, where it always was
        with cluster.client() as client:
            client.put("five-nodes", "hello")
        # a node asked about a group it holds no engine of sends the caller on to a member, and
        # forwards for a node that asks it to (a gathered request: a followed redirect to another
        # node would lose the caller's token)
        for node_id in cluster.ids:
            url = cluster.url(node_id)
            for group in sorted(set(range(4)) - set(placement.groups_of(node_id))):
                sent_on = call("GET", f"{url}/v1/cluster/routing?group={group}", follow=False)
                members = list(placement.groups[group])
                assert sent_on.status == 307 and sent_on.headers["X-Raftq-Leader"] in members, (node_id, sent_on)
                forwarded = call("GET", f"{url}/v1/cluster/routing?group={group}", headers={"X-Raftq-Forward": "1"})
                assert forwarded.status == 200 and forwarded.body["groups"][0]["members"] == members, forwarded
            gathered = call("GET", f"{url}/v1/cluster/routing", follow=False)
            assert [g["members"] for g in gathered.body["groups"][1:]] == [list(placement.groups[g]) for g in (1, 2, 3)]
        # group 0's leader checks a release of a group it holds no replica of with one of its members
        wait_for_settled_leaders(cluster)
        catalog_leader = placement.members(0)[0]
        group = next(g for g in (1, 2, 3) if catalog_leader not in placement.members(g))
        q = queues_in_groups(cluster)[group]
        url = cluster.url(catalog_leader)
        forged = call("POST", f"{url}/v1/cluster/catalog/release", {"group": group, "names": [q], "fence": 0})
        assert forged.status == 409 and f"group {group} has not retired {q!r}" in forged.body["message"], forged
        asked = call("POST", f"{url}/v1/cluster/catalog/retiring?group={group}", {"names": [q], "fence": 0},
                     headers={"X-Raftq-Forward": "1"})
        assert asked.status == 200 and asked.body == {"names": [], "fence": 0}, asked
        # and releases the name once the group retired it: its releaser runs on the group's leader
        assert call("DELETE", f"{url}/v1/queues/{q}").status == 204
        wait_until(lambda: call("GET", f"{url}/v1/cluster/routing?queue={q}").body["queues"] == {q: None}, 30,
                   f"{q}'s name released from group {group}")
    finally:
        cluster.close()


def test_raftq_up_makes_a_cluster_of_the_groups_asked_and_keeps_them(tmp_path):
    from raftq.engine import config as cluster_config
    from tests.test_cli import start_up, stop_everything

    data_dir = tmp_path / "up"
    proc, output = start_up(data_dir, "--groups", "3", "--replicas", "2")
    try:
        assert "3 Raft groups of 2 replicas" in output, output
        cfg = cluster_config.load(data_dir / "cluster.toml")
        assert (cfg.groups, cfg.replicas) == (3, 2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        again = subprocess.run([sys.executable, "-m", "raftq", "up", "--nodes", "3", "--data-dir", str(data_dir),
                                "--groups", "4"], capture_output=True, text=True, timeout=60)
        assert again.returncode == 2 and "groups 3, fixed when it was made" in again.stderr, again.stderr
        assert cluster_config.load(data_dir / "cluster.toml").groups == 3
    finally:
        stop_everything(proc, data_dir)


BEFORE_GROUPS = "3684357"   # main as it was when nodes got a supervisor and groups


def test_a_cluster_written_before_groups_restarts_unchanged_as_group_0(tmp_path, monkeypatch):
    """Group 0 keeps the paths of the one group a node had, and its connections
    carry no preamble: a cluster written by the release before restarts on
    this one with everything it held."""
    from raftq.local import LocalCluster
    from tests.test_operations import REPO, contents, exported, load
    from tests.wire import register

    old_tree = exported(BEFORE_GROUPS, tmp_path / "old-tree")
    monkeypatch.chdir(tmp_path)    # `python -m raftq` puts its working directory first on sys.path
    cluster = LocalCluster.create(tmp_path / "cluster", 3, env={**os.environ, "PYTHONPATH": str(old_tree)})
    register(cluster)
    try:
        cluster.start()
        assert cluster.wait_for_leader(60) is not None and cluster.wait_all_ready(60)
        assert "raft_groups" not in cluster.ready_view(cluster.ids[0], groups=True)   # the old release is running
        load(cluster)
        before = contents(cluster)
        cluster.stop()
        cluster.env = {**os.environ, "PYTHONPATH": str(REPO)}
        cluster.start()
        assert cluster.wait_for_leader(60) is not None and cluster.wait_all_ready(60)
        assert sorted(cluster.ready_view(cluster.ids[0], groups=True)["raft_groups"]) == ["0"]
        assert contents(cluster) == before
        assert not list(cluster.root.glob("n*/group-*"))
    finally:
        cluster.close()


def test_a_node_refuses_a_config_that_changes_the_group_count(tmp_path):
    """A cluster's group count is fixed when it is made: a node restarted
    with a cluster.toml of another count refuses to start (exit 1), rather
    than apply group 0's catalog otherwise than the other replicas do."""
    import dataclasses

    cluster = start_cluster(tmp_path / "regrouped", 3, groups=3, replicas=2)
    try:
        wait_until(lambda: leaders(cluster), timeout=60, what="every group led")
        wait_until(lambda: routing(cluster)["members_recorded"], timeout=30, what="the members recorded")
        cluster.stop("n1")
        cluster.cfg = dataclasses.replace(cluster.cfg, groups=4)
        cluster.write_config()
        cluster.start("n1")
        assert cluster.procs["n1"].wait(60) == 1
        cluster.procs.pop("n1")
        assert "node n1 was made with 3 Raft groups; cluster.toml now says 4" in \
            cluster.log_path("n1").read_text()
    finally:
        cluster.close()


def routing(cluster) -> dict:
    with cluster.client(retry_for=5.0) as client:
        return client.routing()


def routed_members(cluster) -> list[list[str]]:
    return [group["members"] for group in routing(cluster)["groups"]]


def test_the_members_of_each_group_are_group_0s_record_not_the_config(tmp_path):
    """Group 0's leader records each group's members once (engine/members.py);
    routing follows the record: restarted with its nodes listed in another
    order, whose placement would order each group's members otherwise, the
    cluster still routes by the members it was made with."""
    import dataclasses

    cluster = start_cluster(tmp_path / "recorded", 3, groups=4)
    try:
        made = [list(members) for members in for_cluster(cluster.cfg).groups]
        wait_until(lambda: leaders(cluster), timeout=60, what="every group led")
        wait_until(lambda: routing(cluster)["members_recorded"], timeout=30, what="the members recorded")
        assert routed_members(cluster) == made and routing(cluster)["move"] is None
        cluster.stop()
        cluster.cfg = dataclasses.replace(cluster.cfg, nodes=tuple(reversed(cluster.cfg.nodes)))
        cluster.write_config()
        reordered = [list(members) for members in for_cluster(cluster.cfg).groups]
        assert reordered[1:] != made[1:], "the new order must place the groups' members otherwise"
        cluster.start()
        wait_until(lambda: leaders(cluster), timeout=60, what="every group led again")
        wait_until(lambda: routing(cluster)["members_recorded"], timeout=30, what="the record replayed")
        assert routed_members(cluster)[1:] == made[1:]
    finally:
        cluster.close()


def engine_groups(cluster, node_id: str) -> list[int]:
    """The groups whose engine processes run under the node's supervisor (by their process names)."""
    found = []
    for pid in children_of(cluster.pid(node_id)):
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
        if name.startswith("raftq-group-"):
            found.append(int(name.removeprefix("raftq-group-")))
    return sorted(found)


def test_a_node_runs_the_engines_of_the_groups_the_record_names_it_in_and_no_others(tmp_path):
    """Group 0's record says which nodes run which group (engine/members.py):
    a node that restarts without the data of a group the record names it in
    (a replaced disk) starts that group's engine while it runs, in a fresh
    interpreter, and the group's leader brings it up to date; a group whose
    data it kept but the record does not name it in (a move abandoned while
    it was down) has its engine stopped and its data removed. Every front
    links to the one and drops the other."""
    from tests.test_routing import queues_in_groups
    from tests.wire import call

    cluster = start_cluster(tmp_path / "held", 3, groups=4, replicas=2)
    try:
        wait_until(lambda: leaders(cluster), timeout=60, what="every group led")
        wait_until(lambda: routing(cluster)["members_recorded"], timeout=30, what="the members recorded")
        members = routed_members(cluster)
        held = [g for g in range(1, 4) if "n3" in members[g]]
        not_held = [g for g in range(1, 4) if "n3" not in members[g]]
        assert held and not_held and engine_groups(cluster, "n3") == [0, *held]
        placed = queues_in_groups(cluster, 3)
        regrown, abandoned = held[0], not_held[0]
        url = cluster.url(cluster.ids[0])
        for n in range(20):
            assert call("POST", f"{url}/v1/queues/{placed[regrown]}/messages", {"body": n}).status == 201
        cluster.stop("n3")
        data = cluster.root / "n3"
        shutil.rmtree(data / f"group-{regrown}")
        (data / f"group-{abandoned}").mkdir()
        (data / f"group-{abandoned}" / "members").write_text(" ".join(sorted([*members[abandoned], "n3"])) + "\n")
        cluster.start("n3", extra_args=("--workers", "2"))   # each front links to the new engine
        wait_until(lambda: cluster.running("n3") and engine_groups(cluster, "n3") == [0, *held], timeout=60,
                   what="n3 running the engines of the groups the record names it in")
        assert not (data / f"group-{abandoned}").exists()
        log = cluster.log_path("n3").read_text()
        assert f"group {regrown}: engine started" in log and f"group {abandoned}: engine stopped" in log
        def agreeing():   # (an answer without "agree": the group's leader was not known for a moment)
            answer = call("POST", f"{url}/v1/cluster/verify?group={regrown}").body
            return answer if answer.get("agree") else None
        verify = wait_until(agreeing, timeout=30, what=f"group {regrown}'s replicas agreeing")
        assert sorted(verify["digests"]) == sorted(members[regrown])
        assert (data / f"group-{regrown}" / "members").read_text().split() == sorted(members[regrown])
        # the node's fronts (whichever answers) serve the new engine, and no longer have one of the other
        for _ in range(8):
            views = cluster.ready_view("n3", groups=True, timeout=5.0)["raft_groups"]
            assert str(regrown) in views and str(abandoned) not in views, views
        assert call("POST", f"{url}/v1/cluster/verify").body["agree"] is True
    finally:
        cluster.close()


def test_a_nodes_metrics_count_the_engines_of_every_group_it_holds(groups4):
    """/metrics sums what each of the node's engines counts: a receive waiting on a queue of
    group 1, 2 or 3 is on its leader's `raftq_long_polls_waiting`, as one of group 0 is."""
    url = groups4.url(groups4.ids[0])
    names = [f"metered-{i}" for i in range(12)]
    for name in names:
        assert call("PUT", f"{url}/v1/queues/{name}", {}).status in (200, 201)
    table = routing(groups4)
    queue = next(name for name in names if table["queues"][name] != 0)
    group = next(g for g in table["groups"] if g["id"] == table["queues"][queue])
    leader_url = f"{groups4.urls[0].split('://')[0]}://{group['leader_http_addr']}"

    def waiting() -> float:
        text = call("GET", f"{leader_url}/metrics").raw.decode()
        return next(float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith("raftq_long_polls_waiting "))

    reply = {}
    receiver = threading.Thread(target=lambda: reply.setdefault("got", call(
        "POST", f"{leader_url}/v1/queues/{queue}/receive", {"wait_ms": 30000}, timeout=60)))
    receiver.start()
    try:
        wait_until(lambda: waiting() == 1, what=f"the receive on group {group['id']} counted")
    finally:
        call("POST", f"{url}/v1/queues/{queue}/messages", {"body": "done"})
        receiver.join(40)
    assert [m["body"] for m in reply["got"].body["messages"]] == ["done"]

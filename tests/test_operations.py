"""The operator's procedures of docs/operations.md, followed as written: backup and
restore, a node that lost its data rejoining, installing for deploy/'s systemd unit,
a rolling upgrade (issue 27, item 8)."""

import asyncio
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import aiohttp
import pytest

from raftq.api import removal
from raftq.client import Client
from raftq.failover import RaftqError
from raftq.local import LocalCluster
from raftq.server import REMOVED_EXIT
from tests.tools import cannot_run
from tests.waiting import wait_until
from tests.wire import call, register

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
QUEUES = ("orders", "events", "audit")


def load(cluster) -> None:
    """Messages in several queues, some of them leased, some acked, some keyed."""
    with cluster.client() as client:
        for name in QUEUES:
            for batch in range(3):
                client.put_batch(name, [{"body": {"queue": name, "n": batch * 100 + i}} for i in range(100)])
            client.put(name, {"latest": True}, key="k")
            leased = client.receive(name, max=20, lease_ms=600_000)["messages"]
            client.ack(name, [m["receipt"] for m in leased[:10]])


def contents(cluster) -> dict:
    """Every stored message of every queue, and the queues' counters."""
    seen = {}
    with cluster.client() as client:
        for name in sorted(q["name"] for q in client.queues()["queues"]):
            stats = client.queue(name)["stats"]
            browsed = client.browse(name, limit=10_000)["messages"]
            seen[name] = {"messages": [(m["seq"], m["body"], m["key"]) for m in browsed],
                          "counters": {k: stats[k] for k in ("depth", "in_flight", "put_total", "acked_total")}}
    return seen


def replica_contents(cluster, node_id: str) -> dict:
    """What one replica serves of every queue, read from that node alone."""
    with Client([cluster.url(node_id)], token=cluster.token, cafile=cluster.cafile) as client:
        return {name: ({k: stats[k] for k in ("depth", "in_flight", "put_total", "acked_total")},
                       [(m["seq"], m["body"]) for m in client.browse(name, limit=10_000, consistency="any")["messages"]])
                for name in sorted(q["name"] for q in client.queues(consistency="any")["queues"])
                for stats in [client.queue(name, consistency="any")["stats"]]}


def caught_up(cluster, node_id: str) -> bool:
    leader = cluster.wait_for_leader(30)
    mine, theirs = cluster.ready_view(node_id), cluster.ready_view(leader)
    if not (mine and theirs) or None in (mine["applied_index"], theirs["commit_index"]):
        return False            # a node whose engine did not answer in time says null
    return mine["applied_index"] >= theirs["commit_index"]


def test_a_backup_of_a_loaded_cluster_restores_as_a_new_cluster_elsewhere(fresh_cluster, tmp_path):
    cluster = fresh_cluster(3)
    load(cluster)
    before = contents(cluster)
    assert sum(len(q["messages"]) for q in before.values()) == 3 * (301 - 10)
    # the documented backup: a follower with no lag, stopped, its raft/ archived, started again
    follower = next(n for n in cluster.ids if n != cluster.wait_for_leader(30))
    wait_until(lambda: caught_up(cluster, follower), 60, what=f"{follower} to have applied everything")
    cluster.stop(follower)
    archive = tmp_path / f"raftq-{follower}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(cluster.root / follower / "raft", arcname=f"{follower}/raft")
    cluster.start(follower)

    # the documented restore: a new cluster (new addresses, secret and tokens), the same node ids,
    # the archive unpacked into every node's data directory
    copy = LocalCluster.create(tmp_path / "elsewhere", 3)
    register(copy)
    try:
        for node_id in copy.ids:
            data_dir = copy.root / node_id
            data_dir.mkdir(mode=0o700)
            with tarfile.open(archive) as tar:
                members = [m for m in tar.getmembers() if "/" in m.name]
                for member in members:
                    member.name = member.name.split("/", 1)[1]
                tar.extractall(data_dir, members=members, filter="data")
        copy.start()
        assert copy.wait_for_leader(60) is not None and copy.wait_all_ready(60)
        assert contents(copy) == before
        with copy.client() as client:
            assert client.verify()["agree"]
            client.put("orders", {"after": "restore"})      # and it takes writes as a cluster of its own
        assert contents(cluster) == before                    # the original never saw that put
    finally:
        copy.close()


def test_a_node_that_lost_its_data_rejoins_and_holds_every_message(fresh_cluster):
    cluster = fresh_cluster(3)
    load(cluster)
    before = contents(cluster)
    lost = next(n for n in cluster.ids if n != cluster.wait_for_leader(30))
    spec = cluster.cfg.node(lost)
    cluster.kill(lost)
    shutil.rmtree(cluster.root / lost)          # the disk is gone
    with cluster.client() as client:
        client.remove_node(lost)
        client.add_node(lost, spec.raft, spec.http)
    cluster.start(lost)
    wait_until(lambda: caught_up(cluster, lost), 120, what=f"{lost} to catch up from nothing")
    with cluster.client() as client:
        assert client.verify()["agree"]
    # the rebuilt node's own replica holds every message (consistency=any: no leader involved)
    with Client(cluster.url(lost), token=cluster.token) as own:
        for name, queue in before.items():
            browsed = own.browse(name, limit=10_000, consistency="any")["messages"]
            assert [(m["seq"], m["body"], m["key"]) for m in browsed] == queue["messages"]
    assert contents(cluster) == before


def test_a_node_removed_while_it_runs_stops_and_one_cut_off_keeps_running(fresh_cluster):
    """`raftq cluster remove` of a running node: the leader stops sending to it at once, so it
    never learns of its removal through Raft. It finds out from the voters it knew and stops,
    with the exit status that systemd's unit and `raftq up` leave down. Nodes that only hear from
    no leader (half of them stopped) keep running however long that lasts."""
    cluster = fresh_cluster(4)
    leader = cluster.wait_for_leader(30)
    stopped, kept = [n for n in cluster.ids if n != leader][:2], [n for n in cluster.ids if n != leader][2]
    for node_id in stopped:
        cluster.stop(node_id)
    time.sleep(removal.QUIET_S + 2 * removal.CHECK_S)     # at least one round of asking the others
    assert cluster.running(leader) and cluster.running(kept)
    for node_id in stopped:
        cluster.start(node_id)
    assert cluster.wait_all_ready(60)
    with cluster.client() as client:
        client.put("before", "x")
        client.remove_node(kept)
        assert cluster.procs[kept].wait(60) == REMOVED_EXIT
        assert "is no longer a voter of the cluster" in cluster.log_path(kept).read_text()
        assert sorted(node["id"] for node in client.cluster()["nodes"]) == sorted(set(cluster.ids) - {kept})
        client.put("after", "y")
        assert client.verify()["agree"]


@pytest.mark.parametrize("groups", [1, 4])
def test_verify_while_the_lead_moves_gives_a_verdict_not_a_bug(fresh_cluster, groups):
    """`verify` takes its checkpoint through the leader's log. A lead lost before the checkpoint
    was written is served again where the lead went, as writes are; it answered 500 ("the node
    hit a bug") when a replica move's leadership hand-off fell inside it (a CI run of
    tests/test_tls.py). With several groups, verify gathers every group's verdict, and the lead
    that moves is group 0's."""
    cluster = fresh_cluster(3, groups=groups)
    cluster.wait_for_leader(30)
    stop, moves, refused = threading.Event(), [], []

    def move_the_lead():
        with cluster.client() as mover:
            while not stop.is_set():
                try:
                    moves.append(mover.transfer_leadership()["moved"])
                except RaftqError as exc:       # a hand-off asked of a node that just lost the lead
                    refused.append(exc)
                time.sleep(0.02)

    mover = threading.Thread(target=move_the_lead)
    mover.start()
    try:
        with cluster.client() as client:
            for _ in range(25):
                assert client.verify()["agree"]
    finally:
        stop.set()
        mover.join()
    assert sum(moves) >= 5, (moves, refused)

def documented_block(heading: str) -> str:
    """The first ```sh block after `heading` in docs/operations.md."""
    text = (REPO / "docs" / "operations.md").read_text()
    after = text[text.index(heading):]
    return after[after.index("```sh\n") + 6:after.index("```", after.index("```sh\n") + 6)]


def test_the_documented_install_gives_the_systemd_unit_every_path_it_names(tmp_path):
    """The install steps, run as written into a temporary root: without sudo, and without what
    needs root (the user, ownership, systemctl). Then the unit's own command runs a node."""
    root, wheels = tmp_path / "root", tmp_path / "wheels"
    checkout = tmp_path / "checkout"          # building writes build/ and *.egg-info: not in the tree
    shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(".venv", ".git", "results", "__pycache__",
                                                                  "build", "*.egg-info", ".raftq"))
    single = LocalCluster.create(tmp_path / "cluster", 1)
    steps = []
    for line in documented_block("## Installing for systemd").splitlines():
        if not line.strip() or line.startswith("#") or "useradd" in line or "systemctl" in line:
            continue
        line = line.replace("sudo ", "").replace("-o raftq -g raftq ", "").replace("python3 ", f"{sys.executable} ")
        line = line.replace("/tmp/raftq-wheels", str(wheels)).replace(" cluster.toml ", f" {single.config_path} ")
        line = re.sub(r"(?<![\w/.-])/(opt|etc|var/lib)/", f"{root}/\\1/", line)
        steps.append(line)
    assert len(steps) == 7, steps
    # as an operator runs them: nothing of a checkout on the path (PYTHONPATH=<checkout> would make
    # raftq an installed distribution to pip, which then installs only its dependencies)
    operator = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    built = subprocess.run(["bash", "-e", "-c", steps[0]], cwd=checkout, env=operator, capture_output=True,
                           text=True, timeout=1200)
    if built.returncode != 0:
        cannot_run(f"building the wheels needs a package index: {built.stderr[-500:]}")
    (root / "etc/systemd/system").mkdir(parents=True)      # there on any machine with systemd
    done = subprocess.run(["bash", "-e", "-c", "\n".join(steps[1:])], cwd=checkout, env=operator, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr

    unit = (REPO / "deploy" / "raftq@.service").read_text()
    command = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1).replace("%i", "n1").split()
    config = root / "etc/raftq/cluster.toml"
    data_root = root / re.search(r"^ReadWritePaths=/(.*)$", unit, re.M).group(1)
    assert command[0] == "/opt/raftq/bin/raftq" and (root / command[0][1:]).is_file()
    assert command[command.index("--config") + 1] == "/etc/raftq/cluster.toml" and config.is_file()
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert data_root.is_dir() and stat.S_IMODE(data_root.stat().st_mode) == 0o700
    assert (root / "etc/systemd/system/raftq@.service").read_text() == unit
    version = subprocess.run([str(root / command[0][1:]), "--version"], env=operator, capture_output=True, text=True,
                             timeout=60)
    assert re.fullmatch(r"raftq \d+\.\d+\.\d+\S*\n", version.stdout), version
    # the unit's command, its paths under the temporary root, serves a node from the installed package
    # (run from tmp_path, with no PYTHONPATH: nothing of the checkout is importable)
    node = [str(root / command[0][1:])] + [str(root) + arg if arg.startswith("/") else arg for arg in command[1:]]
    proc = subprocess.Popen(node, cwd=tmp_path, env=operator, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        wait_until(lambda: single.ready_view("n1") or proc.poll() is not None, 60, what="the installed node")
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert (data_root / "n1" / "raft").is_dir()
    finally:
        proc.terminate()
        proc.wait(30)


# The revision the rolling-upgrade test starts from: the last one before issue 27's changes.
# Move it to the newest release that a cluster may be upgraded from whenever one is cut.
UPGRADE_FROM = "9a08f1a"


def exported(revision: str, into: Path) -> Path:
    """The tree of `revision`, exported from this repository's history. A checkout without it (a
    shallow clone) skips its callers, and fails them in CI (tests/tools.py), whose .ci/run fetches
    the history a shallow clone lacks."""
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision], capture_output=True, timeout=120)
    if archive.returncode != 0:
        cannot_run(f"revision {revision} is not in this checkout's history (a shallow clone?), so this proof "
                   f"cannot run: git fetch --unshallow (.ci/run does): {archive.stderr.decode().strip()[-300:]}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True, timeout=120)
    return into


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_revision_missing_from_the_history_skips_its_proof_and_fails_it_in_ci(tmp_path, monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises((pytest.fail.Exception, pytest.skip.Exception), match="fetch --unshallow") as stopped:
        exported("0" * 40, tmp_path / "tree")
    assert stopped.type is (pytest.fail.Exception if ci else pytest.skip.Exception)


def test_a_rolling_upgrade_keeps_serving_and_loses_nothing(tmp_path, monkeypatch):
    """docs/operations.md's rolling upgrade: followers first, one at a time, then the leader after a
    transfer; reads, writes and replica digests checked with old and new nodes side by side."""
    old_tree = exported(UPGRADE_FROM, tmp_path / "old-tree")
    # `python -m raftq` puts its working directory first on sys.path: run the nodes from elsewhere
    monkeypatch.chdir(tmp_path)
    old_env = {**os.environ, "PYTHONPATH": str(old_tree)}
    new_env = {**os.environ, "PYTHONPATH": str(REPO)}
    cluster = LocalCluster.create(tmp_path / "cluster", 3, env=old_env)
    register(cluster)
    try:
        cluster.start()
        assert cluster.wait_for_leader(60) is not None and cluster.wait_all_ready(60)
        load(cluster)
        with cluster.client() as client:
            # this release's rows carry each node's pid; the old one's do not: old code is running
            assert all("pid" not in n for n in client.cluster()["nodes"])
        old_leader = cluster.wait_for_leader(30)

        def upgrade(node_id: str) -> None:
            wait_until(lambda: caught_up(cluster, node_id), 60, what=f"{node_id} to be caught up")
            cluster.stop(node_id)                    # SIGTERM, as systemctl restart sends it
            cluster.env = new_env
            cluster.start(node_id)
            wait_until(lambda: caught_up(cluster, node_id), 120, what=f"{node_id} back on the new release")

        upgraded = set()
        for step, follower in enumerate(n for n in cluster.ids if n != old_leader):
            upgrade(follower)
            upgraded.add(follower)
            # an upgraded node writes no command the old release lacks (relocate) while one runs:
            # it names the first node of the old release it finds, whichever that is
            old_nodes = [n for n in cluster.ids if n not in upgraded]
            wait_until(lambda: any(f"relocation of live bodies: waiting for {n} to run a release that knows it"
                                   in cluster.log_path(follower).read_text() for n in old_nodes),
                       30, what=f"{follower} to wait for one of {old_nodes}")
            with cluster.client() as client:        # mixed: it serves, and the replicas hold the same
                client.put_batch("orders", [{"body": {"during": step, "n": i}} for i in range(50)])
            # `verify` hashes each replica's snapshot encoding, which names its release's version:
            # across releases it differs by design (docs/operations.md), so compare what each serves
            wait_until(lambda: all(caught_up(cluster, n) for n in cluster.ids), 60, what="every replica")
            held = [replica_contents(cluster, n) for n in cluster.ids]
            assert all(h == held[0] for h in held[1:]), held
        upgraded = next(n for n in cluster.ids if n != old_leader)
        with cluster.client() as client:
            client.put_batch("receipts", [{"body": n} for n in range(3)])
            issued_by_the_old_leader = client.receive("receipts")["messages"][0]["receipt"]
            assert client.transfer_leadership(upgraded)["moved"]
        # While an older release runs, receipts are unsealed both ways (api/receipt_mode.py): the old
        # leader's is taken by the new one, and the new one's by the old node's edge
        wait_until(lambda: "run a release before sealed receipts" in cluster.log_path(upgraded).read_text(), 30,
                   what=f"{upgraded} to find a node of the older release")
        with cluster.client() as client:
            assert client.ack("receipts", [issued_by_the_old_leader])["acked"] == 1
            issued_while_mixed = client.receive("receipts")["messages"][0]["receipt"]
        assert issued_while_mixed.count(":") == 3, issued_while_mixed
        at_the_old_node = call("POST", f"{cluster.url(old_leader)}/v1/queues/receipts/ack",
                               {"receipts": [issued_while_mixed]})
        assert at_the_old_node.status == 307, at_the_old_node
        upgrade(old_leader)

        def seals(node_id: str) -> bool:       # a front started on the new release starts sealing
            return node_id == old_leader or \
                "every node runs a release with sealed receipts" in cluster.log_path(node_id).read_text()
        wait_until(lambda: seals(cluster.wait_for_leader(30)), 30, what="the leader to find every node upgraded")
        with cluster.client() as client:
            sealed = client.receive("receipts")["messages"][0]["receipt"]
            assert sealed.count(":") == 4, sealed
            with pytest.raises(RaftqError) as unsealed:
                client.ack("receipts", [sealed.rpartition(":")[0]])      # what an older release would issue
            assert unsealed.value.code == "stale_receipt"
            assert client.ack("receipts", [sealed])["acked"] == 1
            client.put_batch("orders", [{"body": {"after": i}} for i in range(50)])
            assert client.verify()["agree"]
            view = client.cluster()
        assert [n["pid"] for n in view["nodes"]] == [cluster.pid(n["id"]) for n in view["nodes"]]
        seen = contents(cluster)
        assert seen["orders"]["counters"]["put_total"] == 301 + 2 * 50 + 50
        assert seen["events"]["counters"]["put_total"] == seen["audit"]["counters"]["put_total"] == 301
    finally:
        cluster.close()


# The last revision before a deleted queue's name could leave the catalog (statemachine/release.py).
NAME_RELEASE_FROM = "7c4791e"


def test_with_four_groups_a_name_leaves_the_catalog_only_once_every_node_runs_the_release_that_fences(
        tmp_path, monkeypatch):
    """The name releaser writes commands an older release does not know: while one node runs it,
    a deleted queue's name stays in the catalog, and the newer nodes say whom they wait for; once
    it is upgraded the name goes, and the replicas agree."""
    old_tree = exported(NAME_RELEASE_FROM, tmp_path / "old-tree")
    monkeypatch.chdir(tmp_path)
    old_env = {**os.environ, "PYTHONPATH": str(old_tree)}
    new_env = {**os.environ, "PYTHONPATH": str(REPO)}
    cluster = LocalCluster.create(tmp_path / "cluster", 3, groups=4, env=old_env)
    register(cluster)
    try:
        cluster.start()
        assert cluster.wait_for_leader(60) is not None and cluster.wait_all_ready(60)
        cluster.env = new_env
        for node_id in ("n1", "n2"):
            wait_until(lambda: caught_up(cluster, node_id), 60, what=f"{node_id} to be caught up")
            cluster.stop(node_id)
            cluster.start(node_id)
            wait_until(lambda: caught_up(cluster, node_id), 120, what=f"{node_id} on the new release")
        def waits_for_n3() -> int:
            return sum(cluster.log_path(node_id).read_text().count(
                "name releaser: waiting for n3 to run a release that knows it") for node_id in ("n1", "n2"))

        def placed(name: str):             # as group 0's leader has it
            return call("GET", f"{cluster.urls[0]}/v1/cluster/routing?queue={name}").body["queues"][name]

        with cluster.client() as client:
            client.put("passing", "through")       # a creating command, stamped by a newer front
            client.delete_queue("passing")
            client.put("staying", "kept")
            waited = waits_for_n3()
            wait_until(lambda: waits_for_n3() >= waited + 6, 30, what="three steps of both releasers")
            assert placed("passing") is not None          # its name is still in the catalog
        wait_until(lambda: caught_up(cluster, "n3"), 60, what="n3 to be caught up")
        cluster.stop("n3")
        cluster.start("n3")
        with cluster.client() as client:
            wait_until(lambda: placed("passing") is None, 60, what="passing's name released")
            assert client.verify()["agree"]
            assert client.queue("staying")["stats"]["depth"] == 1
    finally:
        cluster.close()


# The last revision before issue 51 (priorities, back-off, paused groups, retention and replay).
QUEUE_FEATURES_FROM = "645935c"


def test_what_issue_51_adds_is_refused_until_every_node_runs_it_then_served(tmp_path, monkeypatch):
    """A release before issue 51 refuses a priority, a back-off policy, a group's pause or seek,
    which the newer replicas would apply: while one node runs it, a newer leader's front refuses
    them 409 (writing nothing); once the last node is upgraded they are served and the replicas
    agree."""
    old_tree = exported(QUEUE_FEATURES_FROM, tmp_path / "old-tree")
    monkeypatch.chdir(tmp_path)
    old_env = {**os.environ, "PYTHONPATH": str(old_tree)}
    new_env = {**os.environ, "PYTHONPATH": str(REPO)}
    cluster = LocalCluster.create(tmp_path / "cluster", 3, env=old_env)
    register(cluster)
    try:
        cluster.start()
        assert cluster.wait_for_leader(60) is not None and cluster.wait_all_ready(60)
        with cluster.client() as client:
            client.create_queue("jobs")
            client.put("jobs", "before")
        cluster.env = new_env
        for node_id in ("n1", "n2"):
            wait_until(lambda: caught_up(cluster, node_id), 60, what=f"{node_id} to be caught up")
            cluster.stop(node_id)
            cluster.start(node_id)
            wait_until(lambda: caught_up(cluster, node_id), 120, what=f"{node_id} on the new release")
        with cluster.client() as client:
            if cluster.wait_for_leader(30) != "n1":
                assert client.transfer_leadership("n1")["moved"]
        leader = cluster.url("n1")
        refused = [call("POST", f"{leader}/v1/queues/jobs/messages", {"body": "urgent", "priority": 9}),
                   call("PATCH", f"{leader}/v1/queues/jobs", {"backoff": {"initial_ms": 100}}),
                   call("PATCH", f"{leader}/v1/queues/jobs/groups/default", {"paused": True}),
                   call("POST", f"{leader}/v1/queues/jobs/groups/default/seek", {"to": "earliest"})]
        for reply in refused:
            assert (reply.status, reply.body["error"], reply.body.get("feature")) == \
                (409, "conflict", "priority_backoff_pause_replay"), reply
        with cluster.client() as client:
            assert client.queue("jobs")["stats"]["put_total"] == 1
            assert client.queue("jobs")["config"]["backoff"] is None
        wait_until(lambda: caught_up(cluster, "n3"), 60, what="n3 to be caught up")
        cluster.stop("n3")
        cluster.start("n3")
        wait_until(lambda: caught_up(cluster, "n3"), 120, what="n3 on the new release")
        with cluster.client() as client:
            wait_until(lambda: call("POST", f"{cluster.url(cluster.wait_for_leader(30))}/v1/queues/jobs/messages",
                                    {"body": "urgent", "priority": 9}).status == 201, 30,
                       what="a priority served once every node runs the release")
            assert [m["body"] for m in client.receive("jobs", max=5)["messages"]] == ["urgent", "before"]
            assert client.verify()["agree"]
    finally:
        cluster.close()


# The last revision that counted a principal's connections on each node, not for the cluster.
PER_NODE_CONNECTIONS_FROM = "5059152"


def test_connections_are_counted_per_node_until_every_node_counts_them_for_the_cluster(tmp_path, monkeypatch):
    """An older group-0 leader knows no connections' leases: while it runs, the upgraded nodes
    count a principal's connections each on its own, as it does (none refused 503 for a route it
    lacks); once the last node is upgraded, they are counted for the cluster."""
    old_tree = exported(PER_NODE_CONNECTIONS_FROM, tmp_path / "old-tree")
    monkeypatch.chdir(tmp_path)
    old_env = {**os.environ, "PYTHONPATH": str(old_tree)}
    new_env = {**os.environ, "PYTHONPATH": str(REPO)}
    cluster = LocalCluster.create(tmp_path / "cluster", 3, env=old_env)
    register(cluster)
    admin = {"Authorization": f"Bearer {cluster.cfg.tokens.admin}"}
    try:
        cluster.start()
        assert cluster.wait_for_leader(60) is not None and cluster.wait_all_ready(60)
        made = call("POST", cluster.url(cluster.wait_for_leader(30)) + "/v1/principals",
                    {"name": "tenant", "rules": [{"actions": ["put"], "queues": ["t-*"]}],
                     "quotas": {"connections": 1}}, headers=admin, follow=True)
        assert made.status == 201, made
        tenant = {"Authorization": f"Bearer {made.body['token']}"}
        cluster.env = new_env
        for node_id in ("n1", "n2"):
            wait_until(lambda: caught_up(cluster, node_id), 60, what=f"{node_id} to be caught up")
            cluster.stop(node_id)
            cluster.start(node_id)
            wait_until(lambda: caught_up(cluster, node_id), 120, what=f"{node_id} on the new release")
        with cluster.client() as client:
            if cluster.wait_for_leader(30) != "n3":
                assert client.transfer_leadership("n3")["moved"]

        async def per_node():
            async with aiohttp.ClientSession() as session:
                held = [await session.ws_connect(cluster.url(node) + "/v1/stream", headers=tenant)
                        for node in ("n1", "n2")]
                over = call("GET", cluster.url("n1") + "/v1/stream", headers=tenant)
                assert (over.status, over.body["quota"]) == (429, "connections"), over
                assert "on this node" in over.body["message"], over
                for connection in held:
                    await connection.close()
        asyncio.run(per_node())

        wait_until(lambda: caught_up(cluster, "n3"), 60, what="n3 to be caught up")
        cluster.stop("n3")
        cluster.start("n3")
        wait_until(lambda: caught_up(cluster, "n3"), 120, what="n3 on the new release")

        async def for_the_cluster() -> bool:
            async with aiohttp.ClientSession() as session:
                try:
                    first = await session.ws_connect(cluster.url("n1") + "/v1/stream", headers=tenant)
                except aiohttp.WSServerHandshakeError:
                    return False       # a new group-0 leader relearning, or the last probe's lease
                try:
                    over = call("GET", cluster.url("n2") + "/v1/stream", headers=tenant)
                    return over.status == 429 and "on this node" not in over.body["message"]
                finally:
                    await first.close()
        wait_until(lambda: asyncio.run(for_the_cluster()), 60,
                   what="connections counted for the cluster once every node runs the release")
    finally:
        cluster.close()


def test_a_node_not_yet_heard_from_makes_issue_51_writes_a_retry_not_an_upgrade_refusal(tmp_path, monkeypatch):
    """At a cluster's birth a node that has not yet answered which release it runs is not known to
    run an older one: a priority is answered 503 release_unknown with Retry-After (a client
    retries it), not 409 "finish the upgrade", and served once the node answers."""
    monkeypatch.chdir(tmp_path)
    cluster = LocalCluster.create(tmp_path / "cluster", 3)
    register(cluster)
    try:
        cluster.start()
        cluster.kill("n3")
        leader = cluster.url(cluster.wait_for_leader(60, among=["n1", "n2"]))
        reply = call("POST", f"{leader}/v1/queues/jobs/messages", {"body": "urgent", "priority": 9})
        assert (reply.status, reply.body["error"], reply.body.get("feature")) == \
            (503, "release_unknown", "priority_backoff_pause_replay"), reply
        assert reply.headers["Retry-After"] == "1" and "n3" in reply.body["message"], reply
        assert call("GET", f"{leader}/v1/queues/jobs").status == 404        # nothing was written
        cluster.start("n3")
        wait_until(lambda: call("POST", f"{cluster.url(cluster.wait_for_leader(30))}/v1/queues/jobs/messages",
                                {"body": "urgent", "priority": 9}).status == 201, 60,
                   what="the priority served once n3 answers")
    finally:
        cluster.close()


# The last revision whose nodes sent appends and their answers only as pickles (engine/raft/binary_wire.py).
PICKLED_APPENDS_FROM = "478c791"


def appends_sent(cluster, node_id: str) -> dict[str, float]:
    """What group 0's engine on `node_id` sent of its appends, by wire."""
    with Client(cluster.url(node_id), token=cluster.token, cafile=cluster.cafile, retry_for=0,
                timeout=30) as client:
        found = re.findall(r'^raftq_raft_appends_sent_total\{wire="(\w+)"\} (\S+)$', client.metrics(), re.MULTILINE)
    return {wire: float(count) for wire, count in found}


def plain_entries(cluster, node_id: str) -> float:
    """Whether group 0's engine on `node_id` logs its proposals without pickle (engine/raft/node.py, item 19)."""
    with Client(cluster.url(node_id), token=cluster.token, cafile=cluster.cafile, retry_for=0,
                timeout=30) as client:
        return float(re.search(r"^raftq_raft_plain_entries (\S+)$", client.metrics(), re.MULTILINE).group(1))


def queue_on(cluster, node_id: str, queue: str) -> list | None:
    """What the replica on `node_id` serves of `queue`, read from that node alone (None: it knows
    no such queue)."""
    with Client([cluster.url(node_id)], token=cluster.token, cafile=cluster.cafile) as client:
        try:
            return [(m["seq"], m["body"]) for m in client.browse(queue, limit=10_000, consistency="any")["messages"]]
        except RaftqError as error:
            if error.status != 404:
                raise
            return None


def test_a_rolling_upgrade_to_the_binary_wire_keeps_replicating_with_writes_flowing(tmp_path, monkeypatch):
    """Node by node from the release that pickled every append and every entry, with a writer
    putting throughout: an upgraded leader sends pickles to the nodes not yet upgraded and binary
    appends to the others, and logs pickled calls, which the old replicas apply as it does; none
    of the acknowledged puts is lost, and once every node runs this release the leader sends no
    more pickled appends and logs its entries without pickle."""
    old_tree = exported(PICKLED_APPENDS_FROM, tmp_path / "old-tree")
    monkeypatch.chdir(tmp_path)
    old_env = {**os.environ, "PYTHONPATH": str(old_tree)}
    new_env = {**os.environ, "PYTHONPATH": str(REPO)}
    cluster = LocalCluster.create(tmp_path / "cluster", 3, env=old_env)
    register(cluster)
    acked: list[int] = []
    stop = threading.Event()

    def write() -> None:
        with cluster.client() as client:
            n = 0
            while not stop.is_set():
                try:
                    client.put("flow", {"n": n})
                except RaftqError:
                    time.sleep(0.05)      # a node going down under the writer: this one is put again
                    continue
                acked.append(n)
                n += 1
                time.sleep(0.01)

    try:
        cluster.start()
        assert cluster.wait_for_leader(60) is not None and cluster.wait_all_ready(60)
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        wait_until(lambda: len(acked) >= 20, 60, what="writes flowing on the old release")
        assert appends_sent(cluster, cluster.wait_for_leader(30)) == {}    # the old release counts none
        cluster.env = new_env
        mixed = None
        for node_id in sorted(cluster.ids, key=lambda n: n == cluster.wait_for_leader(30)):   # the leader last
            wait_until(lambda: caught_up(cluster, node_id), 60, what=f"{node_id} to be caught up")
            cluster.stop(node_id)
            cluster.start(node_id)
            wait_until(lambda: caught_up(cluster, node_id), 120, what=f"{node_id} on the new release")
            before = len(acked)
            wait_until(lambda: len(acked) >= before + 20, 60, what=f"writes flowing after {node_id}")
            if mixed is None:
                # one node upgraded: made leader, it speaks pickles to the two old nodes
                with cluster.client() as client:
                    assert client.transfer_leadership(node_id)["moved"]
                wait_until(lambda: cluster.wait_for_leader(30) == node_id, 30, what=f"{node_id} to lead")
                first = appends_sent(cluster, node_id)
                wait_until(lambda: len(acked) >= before + 40, 60, what=f"writes flowing with {node_id} leading")
                mixed = appends_sent(cluster, node_id)
                assert mixed["pickled"] > first["pickled"] and mixed["binary"] == first["binary"] == 0, mixed
                # what it logs while old voters run, they apply: each replica holds the same
                assert plain_entries(cluster, node_id) == 0
                with cluster.client() as client:
                    client.put_batch("mixed", [{"body": n} for n in range(20)])
                # the writer goes on meanwhile, so no replica is ever caught up with the leader: wait
                # for each to hold the batch, which an old replica that skipped it never does
                def held_everywhere():
                    held = [queue_on(cluster, n, "mixed") for n in cluster.ids]
                    return held if all(h is not None and len(h) == 20 for h in held) else None
                held = wait_until(held_everywhere, 60, what="every replica to hold the batch")
                assert all(h == held[0] for h in held[1:]), held
        leader = cluster.wait_for_leader(30)
        wait_until(lambda: plain_entries(cluster, leader) == 1, 30, what="the leader to log entries without pickle")
        first = appends_sent(cluster, leader)
        before = len(acked)
        wait_until(lambda: len(acked) >= before + 40, 60, what="writes flowing on the new release")
        last = appends_sent(cluster, leader)
        assert last["binary"] > first["binary"] and last["pickled"] == first["pickled"], (first, last)
        stop.set()
        writer.join(60)
        with cluster.client() as client:
            stored = {m["body"]["n"] for m in client.browse("flow", limit=10_000)["messages"]}
            assert client.verify()["agree"]
        assert set(acked) <= stored, sorted(set(acked) - stored)[:20]
    finally:
        stop.set()
        cluster.close()

"""The `raftq` command line, run as a user runs it."""

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from raftq.cli.cluster import VERIFY_EXITS, verify_verdict
from raftq.cli.connect import DEFAULT_URL, Target, where_it_looked
from raftq.client import Client
from raftq.local import LocalCluster, free_ports, port_free
from tests.stopping import descendants
from tests.waiting import wait_until
from tests.wire import token_for

pytestmark = pytest.mark.integration


def raftq(*args, url=None, cluster=None, cwd=None, check=True, timeout=60) -> subprocess.CompletedProcess:
    """Run the CLI; `cluster` gives it every node's URL (RAFTQ_URL) and the cluster's token."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTQ_URL", "RAFTQ_TOKEN")}
    if cluster is not None:
        env["RAFTQ_URL"] = ",".join(cluster.urls)
    if url:
        env["RAFTQ_URL"] = url
        if token_for(url):
            env["RAFTQ_TOKEN"] = token_for(url)
    if cluster is not None and cluster.token:
        env["RAFTQ_TOKEN"] = cluster.token
    done = subprocess.run([sys.executable, "-m", "raftq", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd)
    if check and done.returncode != 0:
        raise AssertionError(f"raftq {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done


def as_json(*args, **kwargs):
    return json.loads(raftq(*args, "--json", **kwargs).stdout)


def test_cluster_status_table_and_json(cluster3):
    url = cluster3.urls[0]
    leader = cluster3.wait_for_leader(30)
    table = raftq("cluster", "status", url=url, cluster=cluster3).stdout
    assert f"{leader} *" in table
    rows = status_rows(table)
    assert sorted(rows) == sorted(cluster3.ids)
    header = table.splitlines()[0].split()
    for row in rows.values():
        assert row[header.index("fsync")] == "fsync-per-append"
        assert row[header.index("healthy")] == "yes"
    view = json.loads(raftq("cluster", "status", "--json", url=url, cluster=cluster3).stdout)
    assert view["leader"] == leader and all(n["healthy"] for n in view["nodes"])
    # what `raftq node` runs in production: an fdatasync before every acknowledgement
    assert [n["fsync_policy"] for n in view["nodes"]] == ["fsync-per-append"] * 3


def test_put_receive_ack_queues_and_verify(cluster3):
    url = cluster3.urls[1]     # any node: the CLI follows redirects
    put = json.loads(raftq("put", "cli-q", '{"n": 1}', "--id", "cli-1", "--json", url=url, cluster=cluster3).stdout)
    assert put["messages"][0]["duplicate"] is False
    again = raftq("put", "cli-q", '{"n": 1}', "--id", "cli-1", url=url, cluster=cluster3).stdout
    assert "duplicate" in again
    got = json.loads(raftq("receive", "cli-q", "--max", "5", "--json", url=url, cluster=cluster3).stdout)["messages"]
    assert [m["body"] for m in got] == [{"n": 1}]
    assert "acked 1" in raftq("ack", "cli-q", got[0]["receipt"], url=url, cluster=cluster3).stdout
    assert "cli-q" in raftq("queues", url=url, cluster=cluster3).stdout
    verify = raftq("cluster", "verify", url=url, cluster=cluster3).stdout
    assert "replicas agree" in verify


def test_verify_with_a_replica_down_names_it_instead_of_calling_the_replicas_different(fresh_cluster):
    """A replica that gives no digest is not a divergence: the verdict is `incomplete`, in every
    group it serves, it is named, and the CLI exits 3 (1 stays for digests that differ)."""
    cluster = fresh_cluster(3, groups=4)
    cluster.kill("n3")
    with Client(cluster.urls[:2], token=cluster.token) as client:
        def led_by_the_living() -> bool:
            return all(group["leader"] in ("n1", "n2") for group in client.routing()["groups"])
        wait_until(led_by_the_living, 30, "every group led by n1 or n2")
    done = raftq("cluster", "verify", "--json", url=",".join(cluster.urls[:2]), cluster=cluster, check=False)
    assert done.returncode == VERIFY_EXITS["incomplete"] == 3, done
    result = json.loads(done.stdout)
    assert (result["verdict"], result["agree"], result["unanswered"]) == ("incomplete", False, ["n3"])
    for group in result["groups"]:
        assert (group["verdict"], group["unanswered"], group["digests"]["n3"]) == ("incomplete", ["n3"], None)
        assert len({group["digests"]["n1"], group["digests"]["n2"]}) == 1, group
    assert verify_verdict(result).startswith("no digest from n3 in time")


def test_status_exits_1_without_quorum(fresh_cluster):
    cluster = fresh_cluster(3)
    survivor = cluster.ids[0]
    for nid in cluster.ids[1:]:
        cluster.kill(nid)
    # The survivor answers for itself and finds the others unreachable: no
    # healthy majority, exit 1. (It may still name the dead leader: pysyncobj
    # starts no election while connected to nobody.) It calls itself ready
    # until an election timeout has passed without hearing the leader.
    def minority_status():
        done = raftq("cluster", "status", url=cluster.url(survivor), cluster=cluster, check=False)
        rows = status_rows(done.stdout)
        others_gone = all(rows.get(n, [None, None])[1] == "unreachable" for n in cluster.ids[1:])
        return (done, rows) if others_gone and "NO" in rows.get(survivor, []) else None

    done, rows = wait_until(minority_status, what="the survivor to find the others unreachable")
    assert done.returncode == 1, done.stderr
    assert sorted(rows) == sorted(cluster.ids)
    header = done.stdout.splitlines()[0].split()
    assert [rows[n][header.index("healthy")] for n in cluster.ids] == ["NO"] * 3
    assert rows[survivor][header.index("fsync")] == "fsync-per-append"


def test_a_command_leaves_a_hand_edited_cluster_toml_as_it_is(cluster3):
    """Operators edit cluster.toml by hand (docs/sqs.md: its SQS keys); every command that
    reads it must leave their edits, comments and layout included, as they are."""
    path = cluster3.config_path
    before = path.read_bytes()
    edited = before + b"\n# keys rotated by hand: see the runbook\n"
    path.write_bytes(edited)
    try:
        view = json.loads(raftq("cluster", "status", "--json", "--cluster-dir", str(cluster3.root)).stdout)
        assert sorted(n["id"] for n in view["nodes"]) == sorted(cluster3.ids)
        assert path.read_bytes() == edited
    finally:
        path.write_bytes(before)


def status_rows(table: str) -> dict[str, list[str]]:
    """`raftq cluster status` rows by node id, the leader's `*` dropped."""
    rows = {}
    for line in table.splitlines()[1:]:
        cells = [c for c in line.split() if c != "*"]
        if cells and re.fullmatch(r"n\d+", cells[0]):
            rows[cells[0]] = cells
    return rows


def test_without_a_cluster_or_a_token_the_cli_says_where_it_looked(cluster3, tmp_path):
    """From a directory without `.raftq/cluster.toml`, a 401 says that no token was sent, the
    cluster.toml it looked for, and how to name one (not that no node answered: one did)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTQ_")}

    def run(*args, **more):
        return subprocess.run([sys.executable, "-m", "raftq", *args], cwd=tmp_path, env={**env, **more},
                              capture_output=True, text=True, timeout=60)

    for command in (["queues"], ["cluster", "status"]):
        done = run("--url", cluster3.urls[0], *command)
        assert done.returncode == 1, done
        assert "unauthorized" in done.stderr and "answered" not in done.stderr, done.stderr
        assert "no token was sent" in done.stderr and str(tmp_path / ".raftq" / "cluster.toml") in done.stderr
        assert "--cluster-dir DIR" in done.stderr and "RAFTQ_TOKEN" in done.stderr, done.stderr
    refused = run("--url", cluster3.urls[0], "queues", RAFTQ_TOKEN="not-the-token")
    assert "the token from RAFTQ_TOKEN was refused" in refused.stderr, refused.stderr
    named = run("--cluster-dir", str(cluster3.root), "cluster", "status")      # as the advice says
    assert named.returncode == 0, named.stderr
    # and where no cluster was named at all: the default address answered nothing
    nowhere = Target([DEFAULT_URL], None, None, "the default", looked_for=tmp_path / ".raftq" / "cluster.toml")
    said = where_it_looked(nowhere, ConnectionRefusedError())
    assert "no cluster was named" in said and str(tmp_path / ".raftq" / "cluster.toml") in said and "--url" in said


@pytest.mark.parametrize("typed, meant", [(["queue", "list"], "queues"), (["queus"], "queues"),
                                          (["clster", "status"], "cluster status"), (["stauts"], "cluster status"),
                                          (["cluster", "stat"], "cluster status"), (["dwon"], "down")])
def test_a_mistyped_command_gets_the_one_meant(typed, meant):
    done = raftq(*typed, check=False)
    assert done.returncode == 2 and "invalid choice" in done.stderr, done
    assert f"did you mean `raftq {meant}`?" in done.stderr, done.stderr


def test_unreachable_node_is_a_clear_error():
    port, = free_ports(1)
    done = raftq("queues", url=f"http://127.0.0.1:{port}", check=False)
    assert done.returncode == 1 and "cannot reach" in done.stderr


def test_a_node_whose_http_port_is_taken_exits_with_a_clear_error(tmp_path):
    cluster = LocalCluster.create(tmp_path / "c", 1)
    host, port = cluster.cfg.node("n1").http.rsplit(":", 1)
    squatter = socket.socket()
    try:
        squatter.bind((host, int(port)))
        squatter.listen()
        done = raftq("node", "--config", str(cluster.config_path), "--id", "n1",
                     "--data-dir", str(tmp_path / "n1"), check=False)
    finally:
        squatter.close()
    assert done.returncode == 1
    assert "raftq node: cannot serve n1" in done.stderr and "in use" in done.stderr
    assert "Unclosed" not in done.stderr


def test_up_starts_demo_and_stops_cleanly_keeping_data(tmp_path):
    http_port = free_ports(1)[0]
    raft_port = http_port + 3
    # `up` takes three consecutive ports from each: below the ephemeral range
    # (raftq.local.free_ports) the ones next to a free port are free unless named.
    args = [sys.executable, "-m", "raftq", "up", "--nodes", "3", "--data-dir", str(tmp_path / "up"),
            "--http-port", str(http_port), "--raft-port", str(raft_port), "--demo"]
    for run in range(2):
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            lines = []
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line)
                if "Ctrl-C stops" in line:
                    break
            output = "".join(lines)
            assert "cluster up" in output, output
            assert "receive  demo" in output and "ack      demo" in output
            assert f"put_total {run + 1}" in output   # the second run kept the first run's data
            proc.send_signal(signal.SIGINT)
            assert proc.wait(60) == 0
            assert "stopped." in proc.stdout.read()
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for pid_file in (tmp_path / "up").glob("*.pid"):
                try:
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_queue_commands_create_show_patch_list_delete(cluster3):
    created = as_json("queue", "create", "cli-admin", "--lease-ms", "5000", "--max-deliveries", "3",
                      "--dead-letter", "cli-admin-dlq", "--config", '{"ttl_ms": 60000}', cluster=cluster3)
    assert created["config"]["lease_ms"] == 5000 and created["config"]["max_deliveries"] == 3
    assert created["config"]["dead_letter"] == "cli-admin-dlq" and created["config"]["ttl_ms"] == 60000
    conflict = raftq("queue", "create", "cli-admin", "--lease-ms", "6000", cluster=cluster3, check=False)
    assert conflict.returncode == 1 and "conflict" in conflict.stderr
    patched = as_json("queue", "patch", "cli-admin", "--max-deliveries", "none", "--overflow", "drop_oldest",
                      cluster=cluster3)
    assert patched["config"]["max_deliveries"] is None and patched["config"]["overflow"] == "drop_oldest"
    raftq("put", "cli-admin", "x", "--text", cluster=cluster3)
    shown = raftq("queue", "show", "cli-admin", cluster=cluster3).stdout
    assert "depth 1" in shown and "lease_ms=5000" in shown and "default" in shown
    assert as_json("queue", "show", "cli-admin", cluster=cluster3)["stats"]["put_total"] == 1
    assert "cli-admin" in raftq("queues", cluster=cluster3).stdout
    assert raftq("queue", "delete", "cli-admin", cluster=cluster3).stdout.strip() == "deleted cli-admin"
    gone = raftq("queue", "show", "cli-admin", cluster=cluster3, check=False)
    assert gone.returncode == 1 and "not_found" in gone.stderr
    bad = raftq("queue", "create", "cli-bad", "--max-length", "lots", cluster=cluster3, check=False)
    assert bad.returncode == 2 and "not an integer" in bad.stderr


def test_group_commands(cluster3):
    raftq("put", "cli-groups", "1", cluster=cluster3)
    added = as_json("group", "add", "cli-groups", "audit", "--start", "earliest", cluster=cluster3)
    assert (added["name"], added["depth"]) == ("audit", 1)
    listed = as_json("group", "list", "cli-groups", cluster=cluster3)["groups"]
    assert [g["name"] for g in listed] == ["default", "audit"]
    assert as_json("group", "show", "cli-groups", "audit", cluster=cluster3)["cursor"] == 1
    assert "audit" in raftq("group", "list", "cli-groups", cluster=cluster3).stdout
    raftq("group", "delete", "cli-groups", "audit", cluster=cluster3)
    assert [g["name"] for g in as_json("group", "list", "cli-groups", cluster=cluster3)["groups"]] == ["default"]


def test_message_commands_put_receive_nack_extend_ack_browse_commit_tx(cluster3):
    q = "cli-msgs"
    put = as_json("put", q, '{"n": 1}', "--key", "k", "--header", "trace=abc", "--ttl-ms", "600000",
                  cluster=cluster3)
    assert put["messages"][0]["seq"] == 1
    raftq("put", q, "two", "--text", cluster=cluster3)
    browsed = as_json("browse", q, "--from-seq", "1", "--limit", "5", cluster=cluster3)
    assert [(m["seq"], m["body"], m["key"], m["headers"]) for m in browsed["messages"]] == [
        (1, {"n": 1}, "k", {"trace": "abc"}), (2, "two", None, None)]
    assert json.loads(raftq("browse", q, cluster=cluster3).stdout.splitlines()[0])["key"] == "k"
    first = as_json("receive", q, "--lease-ms", "60000", cluster=cluster3)["messages"][0]
    assert raftq("nack", q, first["receipt"], cluster=cluster3).stdout.strip() == "nacked 1"
    again = as_json("receive", q, cluster=cluster3)["messages"][0]
    assert (again["seq"], again["deliveries"]) == (1, 2)
    assert as_json("extend", q, again["receipt"], "--lease-ms", "90000", cluster=cluster3)["extended"] == 1
    stale = raftq("ack", q, first["receipt"], cluster=cluster3, check=False)
    assert stale.returncode == 1 and "stale_receipt" in stale.stderr
    committed = as_json("commit", q, "default", "1", cluster=cluster3)
    assert committed == {"acked": 1, "cursor": 2}
    second = as_json("receive", q, cluster=cluster3)["messages"][0]
    tx = as_json("tx", "--ack", q, second["receipt"], "--put", "cli-msgs-out", '{"done": 2}', cluster=cluster3)
    assert tx["acked"] == 1 and tx["put"][0]["queue"] == "cli-msgs-out"
    assert as_json("queue", "show", q, cluster=cluster3)["stats"]["depth"] == 0
    assert [m["body"] for m in as_json("browse", "cli-msgs-out", cluster=cluster3)["messages"]] == [{"done": 2}]
    empty = raftq("tx", cluster=cluster3, check=False)
    assert empty.returncode != 0 and "--ack" in empty.stderr


def test_subscribe_prints_pushed_messages_and_acks_them(cluster3):
    for n in range(3):
        raftq("put", "cli-sub", str(n), cluster=cluster3)
    lines = raftq("subscribe", "cli-sub", "--count", "3", "--json", cluster=cluster3).stdout.splitlines()
    assert [json.loads(line)["body"] for line in lines] == [0, 1, 2]
    assert as_json("queue", "show", "cli-sub", cluster=cluster3)["stats"]["acked_total"] == 3
    raftq("put", "cli-sub", '"kept"', cluster=cluster3)
    text = raftq("subscribe", "cli-sub", "--no-ack", "--idle", "2", cluster=cluster3).stdout
    kept = json.loads(text)
    assert kept["body"] == "kept" and kept["receipt"]


def test_redrive_command(cluster3):
    raftq("queue", "create", "cli-work", "--max-deliveries", "1", "--dead-letter", "cli-dead", cluster=cluster3)
    for n in range(3):
        raftq("put", "cli-work", str(n), cluster=cluster3)
    for m in as_json("receive", "cli-work", "--max", "3", cluster=cluster3)["messages"]:
        raftq("nack", "cli-work", m["receipt"], cluster=cluster3)
    dead = as_json("browse", "cli-dead", cluster=cluster3)["messages"]
    assert [m["headers"]["x-raftq-from-queue"] for m in dead] == ["cli-work"] * 3
    assert raftq("redrive", "cli-dead", "--from-queue", "cli-work", "--max", "2",
                 cluster=cluster3).stdout.strip() == "moved 2 to cli-work"
    assert as_json("redrive", "cli-dead", cluster=cluster3)["to"] == {"cli-work": 1}
    assert [m["body"] for m in as_json("browse", "cli-work", cluster=cluster3)["messages"]] == [0, 1, 2]
    assert as_json("queue", "show", "cli-dead", cluster=cluster3)["stats"]["redriven_total"] == 3


def test_health_metrics_top_and_bench(cluster3):
    health = as_json("health", cluster=cluster3)["nodes"]
    assert [h["url"] for h in health] == cluster3.urls and all(h["live"] and h["ready"] for h in health)
    assert "raftq_commit_index" in raftq("metrics", cluster=cluster3).stdout
    bench = raftq("bench", "--count", "300", "--producers", "2", "--consumers", "2", "--size", "64",
                  "--batch", "10", "--queue", "cli-bench", "--keep", cluster=cluster3, timeout=120).stdout
    figures = json.loads(bench.strip().splitlines()[-1])
    assert figures["consumed"] == 300 and figures["put_samples"] == 30 and figures["errors"] == []
    assert figures["put_msgs_per_s"] > 0 and set(figures["end_to_end_latency"]) == {"p50_ms", "p90_ms",
                                                                                     "p99_ms", "max_ms"}
    stats = as_json("queue", "show", "cli-bench", cluster=cluster3)["stats"]
    assert (stats["put_total"], stats["acked_total"], stats["depth"]) == (300, 300, 0)
    streamed = raftq("bench", "--wire", "stream", "--count", "500", "--producers", "2", "--consumers", "1",
                     "--queue", "cli-bench-stream", "--keep", cluster=cluster3, timeout=120).stdout
    figures = json.loads(streamed.strip().splitlines()[-1])
    assert (figures["wire"], figures["consumed"], figures["put_samples"], figures["errors"]) == ("stream", 500, 500, [])
    stats = as_json("queue", "show", "cli-bench-stream", cluster=cluster3)["stats"]
    assert (stats["put_total"], stats["acked_total"], stats["depth"]) == (500, 500, 0)
    top = raftq("top", "--iterations", "2", "--interval", "0.3", cluster=cluster3).stdout
    frames = top.strip().split("\n\n\n") if "\n\n\n" in top else top.strip().split("raftq top")[1:]
    assert len(frames) == 2
    for nid in cluster3.ids:
        assert nid in frames[-1]
    assert "cli-bench" in frames[-1] and "put/s" in frames[-1]
    row = next(line for line in frames[-1].splitlines() if line.startswith("cli-bench"))
    assert row.split()[1:4] == ["0", "0", "0"]      # depth, in flight, delayed
    assert row.split()[6:8] == ["0.0", "0.0"]         # nothing put or acked between the two looks
    looks = [json.loads(line) for line in raftq("top", "--iterations", "2", "--interval", "0.3", "--json",
                                                  cluster=cluster3).stdout.splitlines()]
    assert len(looks) == 2 and looks[1]["cluster"]["leader"] == cluster3.wait_for_leader(30)
    bench_queue = next(q for q in looks[1]["queues"] if q["name"] == "cli-bench")
    assert (bench_queue["stats"]["depth"], bench_queue["put_per_s"], bench_queue["ack_per_s"]) == (0, 0.0, 0.0)
    assert next(q for q in looks[0]["queues"] if q["name"] == "cli-bench")["put_per_s"] is None


def test_status_with_the_first_node_dead_finds_the_cluster_through_cluster_toml(fresh_cluster, tmp_path):
    cluster = fresh_cluster(3)
    cluster.kill(cluster.ids[0])
    leader = cluster.wait_for_leader(30, among=cluster.ids[1:])
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / ".raftq").symlink_to(cluster.root)
    # no RAFTQ_URL, no --url: ./.raftq/cluster.toml names the nodes (and gives the token)
    done = raftq("cluster", "status", cwd=workdir, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    dead = next(line for line in lines if line.startswith(cluster.ids[0]))
    assert "unreachable" in dead and " NO " in dead
    mine = next(line for line in lines if line.startswith(f"{leader} *"))
    assert mine.split()[7] == "-"          # the leader does not hear from itself
    other = next(n for n in cluster.ids[1:] if n != leader)
    follower = next(line for line in lines if line.startswith(other + " "))
    assert follower.split()[6].endswith("ms")
    assert "heard: how long ago the leader last heard" in done.stdout
    urls = [arg for u in cluster.urls for arg in ("--url", u)]
    view = as_json("cluster", "status", *urls, cwd=workdir)
    assert view["leader"] == leader and view["id"] == leader
    assert [n["healthy"] for n in view["nodes"]].count(True) == 2


def test_cluster_remove_add_and_transfer_replace_a_dead_node(fresh_cluster):
    import dataclasses

    from raftq.engine.config import NodeSpec

    cluster = fresh_cluster(3)
    cluster.kill("n3")
    http_port, raft_port = free_ports(2)
    n4 = NodeSpec(id="n4", raft=f"127.0.0.1:{raft_port}", http=f"127.0.0.1:{http_port}")
    assert raftq("cluster", "remove", "n3", cluster=cluster).stdout.strip() == "removed n3"
    added = as_json("cluster", "add", n4.id, n4.raft, n4.http, cluster=cluster)
    assert added == {"id": "n4", "raft_addr": n4.raft, "http_addr": n4.http}
    cluster.cfg = dataclasses.replace(cluster.cfg, nodes=tuple(n for n in cluster.cfg.nodes if n.id != "n3") + (n4,))
    cluster.write_config()
    cluster.start("n4")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view = cluster.ready_view("n4")
        if view and view["ready"] and view["applied_index"] >= view["commit_index"] > 0:
            break
        time.sleep(0.2)
    status = as_json("cluster", "status", cluster=cluster)
    assert sorted(n["id"] for n in status["nodes"]) == ["n1", "n2", "n4"]
    assert all(n["healthy"] for n in status["nodes"])
    leader = status["leader"]
    moved = as_json("cluster", "transfer", "n4", cluster=cluster)
    assert (moved["moved"], moved["previous"], moved["leader"]) == (True, leader, "n4")
    assert cluster.wait_for_leader(30) == "n4"
    assert "leader: n4" in raftq("cluster", "transfer", "n4", cluster=cluster).stdout   # already leads
    unknown = raftq("cluster", "transfer", "n9", cluster=cluster, check=False)
    assert unknown.returncode == 1 and "not_found" in unknown.stderr


def test_adding_a_node_to_a_cluster_made_on_two_nodes_warns_that_its_groups_keep_two_copies(fresh_cluster):
    """Growing a cluster moves replicas and makes none: groups 1.. of a cluster made on two
    nodes keep two members however many nodes join, which `raftq cluster add` says rather than
    let a third node suggest a third copy."""
    import dataclasses

    from raftq.engine.config import NodeSpec

    cluster = fresh_cluster(2, groups=4)
    http_port, raft_port = free_ports(2)
    n3 = NodeSpec(id="n3", raft=f"127.0.0.1:{raft_port}", http=f"127.0.0.1:{http_port}")
    done = raftq("cluster", "add", n3.id, n3.raft, n3.http, cluster=cluster)
    assert done.stdout.strip() == "added n3"
    assert done.stderr.strip() == ("warning: groups 1..3 keep 2 replica(s) each, as when the cluster was made: "
                                   "adding nodes spreads those replicas and adds none (a cluster of 3 nodes "
                                   "would be made with 3)")
    cluster.cfg = dataclasses.replace(cluster.cfg, nodes=cluster.cfg.nodes + (n3,))
    cluster.write_config()
    cluster.start("n3", extra_args=("--join",))
    with cluster.client() as client:
        def spread():
            routing = client.routing()
            members = [group["members"] for group in routing["groups"][1:]]
            on_n3 = sum("n3" in group for group in members)
            return members if routing["move"] is None and on_n3 == 2 else None
        members = wait_until(spread, 90, "two of the six replicas moved to n3")
    assert [len(group) for group in members] == [2, 2, 2]


def test_a_cluster_made_on_one_node_grows_to_three_with_the_cli(fresh_cluster):
    """A second voter leaves one node of two live until it answers: `raftq cluster add` refuses
    it and says how to insist; started first with --join, the new node answers at once, so the
    forced add completes, and the third needs no force. Groups 1 and 2 keep their one replica
    each (said at each add), and one of them moves off the first node: the mover forces the
    add of a group of one, whose only copy could not move otherwise."""
    import dataclasses

    from raftq.engine.config import NodeSpec

    cluster = fresh_cluster(1, groups=3)
    with cluster.client() as client:
        for queue in ("kept-1", "kept-2", "kept-3", "kept-4"):
            client.put(queue, queue)
    for node_id in ("n2", "n3"):
        http_port, raft_port = free_ports(2)
        spec = NodeSpec(id=node_id, raft=f"127.0.0.1:{raft_port}", http=f"127.0.0.1:{http_port}")
        cluster.cfg = dataclasses.replace(cluster.cfg, nodes=cluster.cfg.nodes + (spec,))
        cluster.write_config()
        cluster.start(node_id, extra_args=("--join",))
        if node_id == "n2":
            refused = raftq("cluster", "add", spec.id, spec.raft, spec.http, cluster=cluster, check=False)
            assert refused.returncode != 0 and "1 of 2 voters would be live" in refused.stderr
            assert "--force" in refused.stderr
        forced = ("--force",) if node_id == "n2" else ()
        added = raftq("cluster", "add", spec.id, spec.raft, spec.http, *forced, cluster=cluster)
        assert added.stdout.strip() == f"added {node_id}"
        assert "groups 1..2 keep 1 replica(s) each" in added.stderr
    with cluster.client() as client:
        def spread():
            routing = client.routing()
            members = [group["members"] for group in routing["groups"][1:]]
            return routing["move"] is None and members[0] != members[1] and members
        members = wait_until(spread, 60, "a replica of group 1 or 2 moved off n1")
        assert [len(group) for group in members] == [1, 1]
        for queue in ("kept-1", "kept-2", "kept-3", "kept-4"):
            assert [m["body"] for m in client.receive(queue, max=5)["messages"]] == [queue]
        assert client.verify()["verdict"] == "agree"
    status = as_json("cluster", "status", cluster=cluster)
    assert sorted(n["id"] for n in status["nodes"] if n["healthy"]) == ["n1", "n2", "n3"]


def test_an_added_node_is_told_how_many_copies_each_group_keeps():
    from raftq.api.cluster import _replicas_kept

    assert _replicas_kept(3, 4, 5) == {"replicas": 3}
    assert _replicas_kept(3, 4, 3) == {"replicas": 3}
    assert _replicas_kept(2, 8, 2) == {"replicas": 2}
    lone = _replicas_kept(1, 4, 3)
    assert lone["replicas"] == 1 and "groups 1..3 keep 1 replica(s)" in lone["warning"]
    assert lone["warning"].endswith("(a cluster of 3 nodes would be made with 3)")


def consecutive_free_port(count: int) -> int:
    """The first of `count` consecutive ports free now (`raftq up` takes them in a row)."""
    while True:
        base = free_ports(1)[0]
        if base + count <= 65535 and all(port_free(base + i) for i in range(count)):
            return base


def start_up(data_dir, *extra):
    """`raftq up` in its own session, read until it says it is up; (process, output)."""
    http_port = consecutive_free_port(3)
    raft_port = consecutive_free_port(3)
    while abs(raft_port - http_port) < 3:
        raft_port = consecutive_free_port(3)
    proc = subprocess.Popen([sys.executable, "-m", "raftq", "up", "--nodes", "3", "--data-dir", str(data_dir),
                             "--http-port", str(http_port), "--raft-port", str(raft_port), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops" in line:
            break
    return proc, "".join(lines)


def stop_everything(proc, data_dir):
    """Whatever a test left: `raftq up` and every node it wrote a PID file for."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid_file in data_dir.glob("*.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_up_stops_its_nodes_on_every_stop_signal(tmp_path, sig):
    data_dir = tmp_path / "up"
    proc, output = start_up(data_dir)
    try:
        assert "cluster up" in output, output
        assert re.search(r"sqs: +off: no keys", output), output       # no --sqs, no keys in cluster.toml
        pids = [int(p) for p in re.findall(r"pid (\d+)", output)]
        assert len(pids) == 3 and all(alive(p) for p in pids)
        proc.send_signal(sig)
        assert proc.wait(60) == 0
        assert "stopped." in proc.stdout.read()
        assert [p for p in pids if alive(p)] == []
        assert list(data_dir.glob("*.pid")) == []
    finally:
        stop_everything(proc, data_dir)


def test_up_detached_runs_until_down_stops_it_from_another_directory(tmp_path):
    """`raftq up --detach` returns once its cluster serves; `raftq down --data-dir DIR`, run from
    another directory, stops `raftq up` first (which would start stopped nodes again) and with it
    every process of every node, and says what it stopped."""
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    http_port = consecutive_free_port(3)
    raft_port = consecutive_free_port(3)
    while abs(raft_port - http_port) < 3:
        raft_port = consecutive_free_port(3)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTQ_")}
    data_dir = here / ".raftq"
    started = subprocess.run([sys.executable, "-m", "raftq", "up", "--detach", "--http-port", str(http_port),
                              "--raft-port", str(raft_port)], cwd=here, env=env, capture_output=True, text=True,
                             timeout=120)
    up_pid = int((data_dir / "up.pid").read_text()) if (data_dir / "up.pid").exists() else None
    nodes = [int(pid) for pid in re.findall(r"^  n\d+ .* pid (\d+) ", started.stdout, re.M)]
    try:
        assert started.returncode == 0, started.stderr
        assert "cluster up" in started.stdout and "`raftq down` stops the cluster" in started.stdout
        processes = [up_pid, *nodes, *(pid for node in nodes for pid in descendants(node))]
        assert len(nodes) == 3 and all(alive(pid) for pid in processes), started.stdout
        status = subprocess.run([sys.executable, "-m", "raftq", "--cluster-dir", str(data_dir), "cluster", "status"],
                                cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        down = subprocess.run([sys.executable, "-m", "raftq", "down", "--data-dir", str(data_dir)],
                              cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        assert f"raftq up (pid {up_pid})" in down.stdout, down.stdout
        assert [pid for pid in processes if alive(pid)] == []
        assert list(data_dir.glob("*.pid")) == []
        assert "SIGTERM: stopping the cluster" in (data_dir / "up.log").read_text()
        again = subprocess.run([sys.executable, "-m", "raftq", "down"], cwd=here, env=env, capture_output=True,
                               text=True, timeout=60)
        assert again.returncode == 0 and "nothing of the cluster" in again.stdout, again
    finally:
        for pid in [up_pid, *nodes]:
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_up_refuses_to_report_up_while_orphans_hold_its_ports(tmp_path):
    data_dir = tmp_path / "up"
    first, output = start_up(data_dir)
    second = None
    try:
        assert "cluster up" in output, output
        orphans = [int(p) for p in re.findall(r"pid (\d+)", output)]
        first.kill()              # as a lost terminal did before: `up` gone, its nodes not
        first.wait()
        assert all(alive(p) for p in orphans)
        second = subprocess.run([sys.executable, "-m", "raftq", "up", "--data-dir", str(data_dir)],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert "cluster up" not in second.stdout
        assert "ports already in use" in second.stderr
        assert all(f"pid {p}" in second.stderr for p in orphans), second.stderr
    finally:
        stop_everything(first, data_dir)


def test_a_leader_on_our_port_counts_only_when_it_is_our_process(fresh_cluster):
    # What `raftq up` relies on when a node it started lost its port to another process.
    cluster = fresh_cluster(1)
    assert cluster.wait_for_leader(30) == "n1"
    impostor_view = LocalCluster.open(cluster.root)
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        impostor_view.procs["n1"] = stand_in       # "we started n1", but n1's port answers from another pid
        assert impostor_view.ready_view("n1") is None
        assert impostor_view.wait_for_leader(2) is None
        assert cluster.ready_view("n1")["pid"] == cluster.pid("n1")
    finally:
        stand_in.kill()
        stand_in.wait()


def test_put_body_is_json_unless_a_flag_says_otherwise(cluster3, tmp_path):
    q = "cli-body-kinds"
    typo = raftq("put", q, '{"x": 1', cluster=cluster3, check=False)
    assert typo.returncode == 2 and "is not JSON" in typo.stderr and "--text" in typo.stderr
    assert len(typo.stderr.strip().splitlines()) == 1
    assert raftq("queues", "--json", cluster=cluster3, check=False).stdout.count(q) == 0   # nothing stored
    raftq("put", q, '{"x": 1}', cluster=cluster3)
    raftq("put", q, '{"x": 1', "--text", cluster=cluster3)
    raftq("put", q, base64.b64encode(b"\x00\xff").decode(), "--base64", cluster=cluster3)
    payload = tmp_path / "payload.bin"
    payload.write_bytes(b"\x01raw\xfe")
    raftq("put", q, "--file", str(payload), cluster=cluster3)
    bodies = [m.get("body", m.get("body_b64")) for m in as_json("browse", q, cluster=cluster3)["messages"]]
    assert bodies == [{"x": 1}, '{"x": 1', base64.b64encode(b"\x00\xff").decode(),
                      base64.b64encode(b"\x01raw\xfe").decode()]
    for args, complaint in ((("not base64!", "--base64"), "is not base64"),
                            (("--file", str(tmp_path / "missing")), "cannot read --file"),
                            (("{}", "--file", str(payload)), "not both"),
                            ((), "give the message body")):
        refused = raftq("put", q, *args, cluster=cluster3, check=False)
        assert refused.returncode == 2 and complaint in refused.stderr, refused.stderr
    assert as_json("queue", "show", q, cluster=cluster3)["stats"]["put_total"] == 4
    bad_tx = raftq("tx", "--put", q, "{oops", cluster=cluster3, check=False)
    assert bad_tx.returncode == 2 and "is not JSON" in bad_tx.stderr


def test_receive_and_browse_print_one_json_line_per_message(cluster3):
    q = "cli-json-lines"
    raftq("put", q, '{"task": 2}', cluster=cluster3)
    raftq("put", q, base64.b64encode(b"\x00").decode(), "--base64", cluster=cluster3)
    browsed = [json.loads(line) for line in raftq("browse", q, cluster=cluster3).stdout.splitlines()]
    assert [(m["seq"], m.get("body"), m.get("body_b64")) for m in browsed] == [(1, {"task": 2}, None),
                                                                              (2, None, "AA==")]
    assert all("receipt" not in m for m in browsed)
    received = [json.loads(line) for line in raftq("receive", q, "--max", "2", cluster=cluster3).stdout.splitlines()]
    assert [m["body"] for m in received[:1]] == [{"task": 2}] and all(m["receipt"] for m in received)
    empty = raftq("receive", q, cluster=cluster3)
    assert empty.stdout == "" and "nothing ready" in empty.stderr


def test_version():
    done = raftq("--version")
    assert re.fullmatch(r"raftq \d+\.\d+\.\d+\S*\n", done.stdout), done.stdout


def test_status_lists_nodes_in_id_order_with_their_pids(cluster3):
    # A leader lists itself first: make it the last node so that its own order is not id order.
    if cluster3.wait_for_leader(30) != "n3":
        raftq("cluster", "transfer", "n3", cluster=cluster3)
    assert cluster3.wait_for_leader(30) == "n3"
    with Client(cluster3.url("n3"), token=cluster3.token) as client:
        assert client.cluster()["nodes"][0]["id"] == "n3"
    rows = [line.split()[0] for line in raftq("cluster", "status", cluster=cluster3).stdout.splitlines()[1:4]]
    assert rows == ["n1", "n2", "n3"]
    view = as_json("cluster", "status", cluster=cluster3)
    assert [(n["id"], n["pid"]) for n in view["nodes"]] == [(nid, cluster3.pid(nid)) for nid in cluster3.ids]
    top = json.loads(raftq("top", "--iterations", "1", "--json", cluster=cluster3).stdout)
    assert [n["id"] for n in top["cluster"]["nodes"]] == ["n1", "n2", "n3"]


def test_top_fits_the_terminal_it_is_given(cluster3):
    long_name = "a-queue-with-a-name-much-longer-than-a-terminal-has-room-for-" + "x" * 20
    raftq("put", long_name, "1", cluster=cluster3)

    def top_in(columns: int) -> str:
        env = {**os.environ, "COLUMNS": str(columns), "RAFTQ_URL": ",".join(cluster3.urls),
               "RAFTQ_TOKEN": cluster3.token}
        done = subprocess.run([sys.executable, "-m", "raftq", "top", "--iterations", "1"], capture_output=True,
                              text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    for columns in (80, 60):
        lines = top_in(columns).splitlines()
        assert max(len(line) for line in lines) <= columns, lines
        row = next(line for line in lines if line.startswith("a-queue-with"))
        assert row.split()[0].endswith("…") and row.split()[1] == "1"    # the name shortened, its depth kept
        assert all(any(line.startswith(nid) for line in lines) for nid in cluster3.ids)
    wide = top_in(250)
    assert "fsync-per-append" in wide and long_name in wide


class Lines:
    """What a running `raftq up` prints from now on, read by a thread so that a test can wait on it."""

    def __init__(self, proc, already: str = ""):
        self.text = already
        self.reader = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.reader.start()

    def _read(self, proc):
        for line in proc.stdout:
            self.text += line

    def wait_for(self, pattern: str, timeout: float = 90.0) -> re.Match:
        return wait_until(lambda: re.search(pattern, self.text), timeout, what=f"{pattern!r} in: {self.text}")


def secrets_of(data_dir) -> list[str]:
    from raftq.engine.config import load
    cfg = load(data_dir / "cluster.toml")
    return [cfg.secret, cfg.tokens.admin, cfg.tokens.data, cfg.tokens.metrics]


def test_up_restarts_a_node_that_died_and_never_prints_a_secret(tmp_path):
    data_dir = tmp_path / "up"
    proc, output = start_up(data_dir, "--demo")
    try:
        assert "cluster up" in output, output
        printed = Lines(proc, output)
        pids = dict(re.findall(r"(n\d)  \S+   pid (\d+)", output))
        os.killpg(int(pids["n2"]), signal.SIGKILL)
        printed.wait_for(r"node n2 exited with -9; see \S+n2.log. Restarting it in 1 s")
        restarted = int(printed.wait_for(r"node n2 restarted \(pid (\d+)\)").group(1))
        assert restarted != int(pids["n2"]) and alive(restarted)

        def n2_back():
            done = raftq("cluster", "status", "--json", "--cluster-dir", str(data_dir), check=False)
            view = json.loads(done.stdout) if done.returncode == 0 else None
            return view and [(n["id"], n["pid"], n["healthy"]) for n in view["nodes"]][1] == ("n2", restarted, True)
        wait_until(n2_back, 60, what="n2 to be back, with the pid `raftq up` printed")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        printed.reader.join(10)
        assert "stopped." in printed.text
        assert not alive(restarted) and not any(alive(int(p)) for p in pids.values())
        # issue 21: its output goes to files (make up > up.log): no token, no secret in it
        leaked = [s for s in secrets_of(data_dir) if s and s in printed.text]
        assert leaked == [], printed.text
        assert str(data_dir / "cluster.toml") in printed.text          # it names where they are instead
    finally:
        stop_everything(proc, data_dir)


def test_up_stops_a_node_restarted_by_hand_too(tmp_path):
    data_dir = tmp_path / "up"
    proc, output = start_up(data_dir, "--no-restart")
    by_hand = None
    try:
        assert "cluster up" in output, output
        printed = Lines(proc, output)
        pids = dict(re.findall(r"(n\d)  \S+   pid (\d+)", output))
        os.killpg(int(pids["n3"]), signal.SIGKILL)
        command = printed.wait_for(r"node n3 exited with -9; see \S+. Restart it by hand: raftq (node .*) >> "
                                   r"(\S+) 2>&1 &").groups()
        with open(command[1], "ab") as log:
            by_hand = subprocess.Popen([sys.executable, "-m", "raftq", *command[0].split()], stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        printed.wait_for(rf"node n3 runs again, started by hand \(pid {by_hand.pid}\); Ctrl-C stops it")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert by_hand.wait(30) == 0          # stopped as the others are: SIGTERM, a clean exit
    finally:
        if by_hand is not None and by_hand.poll() is None:
            by_hand.kill()
            by_hand.wait()
        stop_everything(proc, data_dir)


def test_up_names_the_process_holding_its_port(tmp_path):
    http_port = consecutive_free_port(3)
    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", http_port + 1))
        squatter.listen()
        done = subprocess.run([sys.executable, "-m", "raftq", "up", "--data-dir", str(tmp_path / "up"),
                               "--http-port", str(http_port), "--raft-port", str(consecutive_free_port(3))],
                              capture_output=True, text=True, timeout=60)
    finally:
        squatter.close()
    assert done.returncode == 1 and "cluster up" not in done.stdout
    assert f"ports already in use: 127.0.0.1:{http_port + 1} (pid {os.getpid()}: " in done.stderr, done.stderr


def test_cluster_status_shows_the_replica_move_in_progress_and_the_nodes_leaving():
    from raftq.cli.cluster import status_table

    node = {"id": "n1", "role": "leader", "term": 3, "commit_index": 9, "applied_index": 9, "last_contact_ms": None,
            "healthy": True, "fsync_policy": "fsync-per-append", "http_addr": "127.0.0.1:8001"}
    view = {"id": "n1", "leader": "n1", "commit_index": 9, "nodes": [node],
            "move": {"group": 2, "source": "n1", "target": "n4"}, "leaving": ["n5"]}
    shown = status_table(view)
    assert "moving: group 2's replica from n1 to n4" in shown
    assert "leaving once their replicas have moved away: n5" in shown
    assert "moving" not in status_table({**view, "move": None, "leaving": []})


def test_cluster_status_names_a_replica_that_counts_other_voters_than_its_leader():
    from raftq.cli.cluster import status_table

    node = {"id": "n1", "role": "leader", "term": 3, "commit_index": 9, "applied_index": 9, "last_contact_ms": None,
            "healthy": True, "fsync_policy": "fsync-per-append", "http_addr": "127.0.0.1:8001"}
    four = ["n1", "n2", "n3", "n4"]
    replicas = {"n1": {"applied_index": 9, "lag": 0, "voters": four}, "n2": {"applied_index": 9, "lag": 0, "voters": four},
                "n3": {"applied_index": 7, "lag": 2, "voters": ["n1", "n2", "n3"]}}
    view = {"id": "n1", "leader": "n1", "commit_index": 9, "nodes": [node],
            "groups": [{"id": 0, "members": four, "leader": "n1", "term": 3, "commit_index": 9, "replicas": replicas}]}
    assert "group 0: n3 counts voters n1, n2, n3; its leader n1 counts n1, n2, n3, n4" in status_table(view)
    replicas["n3"]["voters"] = four
    assert "counts voters" not in status_table(view)

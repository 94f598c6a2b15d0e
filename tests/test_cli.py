"""The `raftq` command line, run as a user runs it."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from raftq.local import LocalCluster, free_ports
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def raftq(*args, url=None, check=True, timeout=60) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if url:
        env["RAFTQ_URL"] = url
    done = subprocess.run([sys.executable, "-m", "raftq", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"raftq {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done


def test_cluster_status_table_and_json(cluster3):
    url = cluster3.urls[0]
    leader = cluster3.wait_for_leader(30)
    table = raftq("cluster", "status", url=url).stdout
    assert f"{leader} *" in table
    rows = status_rows(table)
    assert sorted(rows) == sorted(cluster3.ids)
    header = table.splitlines()[0].split()
    for row in rows.values():
        assert row[header.index("fsync")] == "fsync-per-append"
        assert row[header.index("healthy")] == "yes"
    view = json.loads(raftq("cluster", "status", "--json", url=url).stdout)
    assert view["leader"] == leader and all(n["healthy"] for n in view["nodes"])
    # what `raftq node` runs in production: an fdatasync before every acknowledgement
    assert [n["fsync_policy"] for n in view["nodes"]] == ["fsync-per-append"] * 3


def test_put_receive_ack_queues_and_verify(cluster3):
    url = cluster3.urls[1]     # any node: the CLI follows redirects
    put = json.loads(raftq("put", "cli-q", '{"n": 1}', "--id", "cli-1", "--json", url=url).stdout)
    assert put["messages"][0]["duplicate"] is False
    again = raftq("put", "cli-q", '{"n": 1}', "--id", "cli-1", url=url).stdout
    assert "duplicate" in again
    got = json.loads(raftq("receive", "cli-q", "--max", "5", "--json", url=url).stdout)["messages"]
    assert [m["body"] for m in got] == [{"n": 1}]
    assert "acked 1" in raftq("ack", "cli-q", got[0]["receipt"], url=url).stdout
    assert "cli-q" in raftq("queues", url=url).stdout
    verify = raftq("cluster", "verify", url=url).stdout
    assert "replicas agree" in verify


def test_status_exits_1_without_quorum(fresh_cluster):
    cluster = fresh_cluster(3)
    survivor = cluster.ids[0]
    for nid in cluster.ids[1:]:
        cluster.kill(nid)
    # The survivor answers for itself and finds the others unreachable: no
    # healthy majority, exit 1. (It may still name the dead leader: pysyncobj
    # starts no election while connected to nobody.)
    def minority_status():
        done = raftq("cluster", "status", url=cluster.url(survivor), check=False)
        rows = status_rows(done.stdout)
        return (done, rows) if all(rows.get(n, [None, None])[1] == "unreachable" for n in cluster.ids[1:]) else None

    done, rows = wait_until(minority_status, what="the survivor to find the others unreachable")
    assert done.returncode == 1, done.stderr
    assert sorted(rows) == sorted(cluster.ids)
    header = done.stdout.splitlines()[0].split()
    assert [rows[n][header.index("healthy")] for n in cluster.ids] == ["NO"] * 3
    assert rows[survivor][header.index("fsync")] == "fsync-per-append"


def status_rows(table: str) -> dict[str, list[str]]:
    """`raftq cluster status` rows by node id, the leader's `*` dropped."""
    rows = {}
    for line in table.splitlines()[1:]:
        cells = [c for c in line.split() if c != "*"]
        if cells and cells[0].startswith("n"):
            rows[cells[0]] = cells
    return rows


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

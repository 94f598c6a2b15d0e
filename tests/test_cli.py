"""The `raftq` command line, run as a user runs it."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from raftq.local import LocalCluster, free_ports, port_free

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
    assert f"{leader} *" in table and "fsync" in table
    for nid in cluster3.ids:
        assert nid in table
    view = json.loads(raftq("cluster", "status", "--json", url=url).stdout)
    assert view["leader"] == leader and all(n["healthy"] for n in view["nodes"])
    assert all(n["fsync_policy"] for n in view["nodes"])


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
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        done = raftq("cluster", "status", url=cluster.url(survivor), check=False)
        if done.returncode == 1:
            break
        time.sleep(0.2)
    assert done.returncode == 1
    assert "NO" in done.stdout or "cannot reach" in done.stderr


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
    http_port = consecutive_free_port(3)
    raft_port = consecutive_free_port(3)
    while abs(raft_port - http_port) < 3:
        raft_port = consecutive_free_port(3)
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
        pids = [int(p) for p in re.findall(r"pid (\d+)", output)]
        assert len(pids) == 3 and all(alive(p) for p in pids)
        proc.send_signal(sig)
        assert proc.wait(60) == 0
        assert "stopped." in proc.stdout.read()
        assert [p for p in pids if alive(p)] == []
        assert list(data_dir.glob("*.pid")) == []
    finally:
        stop_everything(proc, data_dir)


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

"""Who may do what: the auth matrix of every route and cluster.toml's tokens (each acting as its
role's rules), a node that will not start insecurely, and files only their owner can read."""

import http.client
import json
import os
import re
import stat
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from raftq.api.routes import AUTHENTICATED, ROUTES, SIGV4
from raftq.statemachine.rules import ROLE_RULES, allows
from raftq.engine import config as cluster_config
from raftq.local import LocalCluster
from tests.wire import call

pytestmark = pytest.mark.integration

PATH_VALUES = {"{queue}": "authq", "{group}": "default", "{node}": "n9", "{token}": "nope", "{producer}": "p1",
               "{access_key}": "AKIANOBODY0000000001",
               "{name}": "console.js", "{account:[0-9]{12}}": "123456789012"}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from tests.conftest import start_cluster
    cluster = start_cluster(tmp_path_factory.mktemp("auth"), 1)
    yield cluster
    cluster.close()


def concrete(path: str) -> str:
    for name, value in PATH_VALUES.items():
        path = path.replace(name, value)
    return path


def credentials(cluster) -> dict:
    tokens = cluster.cfg.tokens
    return {
        "none": None,
        "wrong": "Bearer " + "x" * 43,
        "non-utf8": "Bearer \udcff\udcfe",       # sent as the raw bytes ff fe
        "data": f"Bearer {tokens.data}",
        "metrics": f"Bearer {tokens.metrics}",
        "admin": f"Bearer {tokens.admin}",
    }


# a leadership transfer to itself changes nothing (to nowhere, a lone node would step down)
BODIES = {"/v1/cluster/leader": b'{"to": "n1"}'}


def send(url: str, method: str, authorization: str | None) -> tuple[int, dict | None]:
    """The status and error body; a stream (events) is not read past its headers."""
    raw = (authorization or "").encode("utf-8", "surrogateescape")
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=15)
    try:
        body = BODIES.get(parts.path, b"{}") if method in ("POST", "PUT", "PATCH") else None
        conn.putrequest(method, parts.path)
        conn.putheader("Authorization", raw)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body or b"")))
        conn.endheaders(body)
        reply = conn.getresponse()
        if reply.status >= 400 and reply.getheader("Content-Type", "").startswith("text/xml"):
            code = re.search(rb"<Code>([^<]*)</Code>", reply.read())      # the SQS API's error shape
            return reply.status, {"sqs_error": code and code.group(1).decode()}
        if reply.status >= 400:
            return reply.status, json.loads(reply.read())
        return reply.status, None
    finally:
        conn.close()


def takes(role: str, route) -> bool:
    """Whether a bootstrap token of `role` may call `route` (its actions: any one, on some queue)."""
    return route.actions == (AUTHENTICATED,) or any(allows(ROLE_RULES[role], action) for action in route.actions)


def test_the_bootstrap_tokens_take_the_routes_of_their_role_as_before_principals():
    """data: a queue's messages and groups, transactions, the stream, staged writes, the list of
    queues and the routing; metrics: /metrics and reading the cluster's state (GET /v1/cluster,
    the event stream: what /metrics exports, as the console shows it); admin: everything."""
    by_role = {role: {(r.method, r.template) for r in ROUTES if r.action not in (None, SIGV4) and takes(role, r)}
               for role in ("admin", "data", "metrics")}
    assert by_role["admin"] == {(r.method, r.template) for r in ROUTES if r.action not in (None, SIGV4)}
    assert by_role["metrics"] == {("GET", "/metrics"), ("GET", "/v1/cluster"), ("GET", "/v1/events"),
                                  ("GET", "/v1/whoami")}
    data_paths = ("/v1/queues", "/v1/tx", "/v1/stream", "/v1/producers", "/v1/cluster/routing", "/v1/whoami")
    assert by_role["data"] == {(r.method, r.template) for r in ROUTES if r.action not in (None, SIGV4)
                               and r.template.startswith(data_paths) and r.template != "/v1/queues/{queue}/redrive"
                               and not (r.template == "/v1/queues/{queue}" and r.method != "GET")}


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
def test_every_route_takes_exactly_the_tokens_whose_role_allows_its_action(node, route):
    url = node.urls[0] + concrete(route.path)
    for who, authorization in credentials(node).items():
        status, error = send(url, route.method, authorization)
        assert status != 500, (who, status, error)
        if route.action is None:
            assert status not in (401, 403), (who, status, error)
        elif route.action == SIGV4:
            # only a SigV4 signature opens the SQS API (tests/test_sqs_auth.py), never a bearer token;
            # this node has no [sqs] keys, so nothing does
            assert (status, error) == (403, {"sqs_error": "AccessDenied"}), (who, status, error)
        elif who in ("none", "wrong", "non-utf8"):
            assert (status, error["error"]) == (401, "unauthorized"), (who, status, error)
        elif takes(who, route):
            assert status not in (401, 403), (who, status, error)
        else:
            assert (status, error["error"]) == (403, "forbidden"), (who, status, error)
            assert (error["principal"], error["action"]) == (who, "|".join(route.actions)), error
            assert set(error) <= {"error", "message", "principal", "action", "queue"}


def test_an_unknown_route_needs_a_token_before_it_is_a_404(node):
    assert call("GET", node.urls[0] + "/v1/nothing", headers={"Authorization": ""}).status == 401
    assert call("GET", node.urls[0] + "/v1/nothing").status == 404


def test_health_is_open_and_reveals_no_data(node):
    ready = call("GET", node.urls[0] + "/health/ready", headers={"Authorization": ""})
    assert ready.status == 200 and set(ready.body) == {
        "id", "role", "leader", "term", "commit_index", "applied_index", "last_log_index", "fsync_policy", "pid",
        "ready", "disk"}


def run_node(cfg_path, data_dir, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raftq", "node", "--config", str(cfg_path), "--id", "n1",
                           "--data-dir", str(data_dir), *extra], capture_output=True, text=True, timeout=60)


def test_a_node_without_a_secret_or_a_token_refuses_to_start(tmp_path):
    cluster = LocalCluster.create(tmp_path / "c", 1)
    bare = cluster_config.ClusterConfig(nodes=cluster.cfg.nodes)
    path = tmp_path / "bare.toml"
    path.write_text(bare.to_toml())
    done = run_node(path, tmp_path / "d")
    assert done.returncode == 2 and "--insecure-no-secret" in done.stderr
    assert not (tmp_path / "d" / "raft").exists()

    with_secret = tmp_path / "secret.toml"
    cluster_config.write_private(with_secret, cluster_config.ClusterConfig(
        nodes=cluster.cfg.nodes, secret=cluster_config.new_secret()).to_toml())
    done = run_node(with_secret, tmp_path / "d")
    assert done.returncode == 2 and "--insecure-no-auth" in done.stderr


def test_generated_tokens_are_256_bits_and_never_read_as_a_command_line_option():
    """`raftq ... --token TOKEN` takes any generated token: one beginning with '-' would be taken
    for an option (URL-safe base64 began so in one cluster of 32, and CI met one)."""
    tokens = [getattr(cluster_config.Tokens.generate(), role) for _ in range(300) for role in cluster_config.ROLES]
    assert len(set(tokens)) == len(tokens)
    assert all(re.fullmatch(r"[0-9a-f]{64}", token) for token in tokens)


def test_a_config_readable_by_others_is_refused_with_the_chmod_to_run(tmp_path):
    cluster = LocalCluster.create(tmp_path / "c", 1)
    cluster.config_path.chmod(0o644)
    done = run_node(cluster.config_path, tmp_path / "d")
    assert done.returncode == 2
    assert f"chmod 600 {cluster.config_path}" in done.stderr


def test_the_config_is_written_0600_from_the_start(tmp_path):
    cluster = LocalCluster.create(tmp_path / "c", 1)
    assert stat.S_IMODE(cluster.config_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(cluster.root.stat().st_mode) == 0o700


def test_every_file_a_node_writes_is_its_owners_only(fresh_cluster):
    """Message bodies, queue names and errors end up in a node's files, and a
    backup or copy of its directory keeps their modes: every file a node
    writes is 0600 and every directory 0700. The cluster's directory is
    walked whole once it holds one of each kind: cluster.toml, each node's
    log and pid file, journal segments and meta, a snapshot (written by a
    node stopped with a long log), the put buffer (a put taken while no
    majority was up) and its replay state."""
    cluster = fresh_cluster(3)
    with cluster.client() as client:
        for _ in range(16):     # 16 MiB of log: a node stopped now compacts it into a snapshot first
            client.put_batch("perm", [{"body": "secret body " * 80} for _ in range(1000)])
    survivor = cluster.wait_for_leader(30)
    for nid in cluster.ids:
        if nid != survivor:
            cluster.kill(nid)
    url = cluster.url(survivor) + "/v1/queues/perm/messages?buffer=allow"
    assert call("POST", url, {"body": "buffered"}).status == 202
    cluster.stop(survivor)
    cluster.start()
    assert cluster.wait_for_leader(60) is not None
    kinds, wrong = set(), []
    for dirpath, _, filenames in os.walk(cluster.root):
        if stat.S_IMODE(os.stat(dirpath).st_mode) != 0o700:
            wrong.append((dirpath, oct(stat.S_IMODE(os.stat(dirpath).st_mode))))
        for name in filenames:
            path = os.path.join(dirpath, name)
            mode = stat.S_IMODE(os.stat(path).st_mode)
            if mode != 0o600:
                wrong.append((path, oct(mode)))
            kinds.add(name.rsplit(".", 1)[-1] if name.startswith("seg-") else name.replace(survivor, "n"))
    assert not wrong, wrong
    assert {"cluster.toml", "n.log", "n.pid", "snapshot.bin", "log", "buffer.log"} <= kinds, sorted(kinds)

"""Principals through every door (issue 52), against real node processes: a principal with ``put``
on ``orders-*`` puts to orders-eu and nothing else on the HTTP API, the streaming wire (each frame,
not only the upgrade), SQS and the event stream; what it names beyond a path (a transaction's
second queue, a dead-letter target, a redrive's source) is checked too, and a refusal changes
nothing; a revoked principal is refused by every node within a second (the time is printed);
changes need no restart; each quota holds, and with several Raft groups counts the cluster's.
"""

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import aiohttp
import cbor2
import pytest
from botocore.exceptions import ClientError

from raftq.engine.config import SqsKey
from raftq.engine.quotas import CONNECTION_LEASE_S
from tests.sqsutil import sqs_client
from tests.waiting import wait_until
from tests.wire import call

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PUT_ORDERS = [{"actions": ["put"], "queues": ["orders-*"]}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from tests.conftest import start_cluster
    cluster = start_cluster(tmp_path_factory.mktemp("principals"), 3)
    yield cluster
    cluster.close()


def admin(cluster) -> dict:
    return {"Authorization": f"Bearer {cluster.cfg.tokens.admin}"}


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def make(cluster, name: str, rules: list, *, quotas: dict | None = None, sqs: bool = False) -> dict:
    """A new principal, once every node takes its token."""
    made = call("POST", cluster.urls[0] + "/v1/principals", {"name": name, "rules": rules, "quotas": quotas or {},
                                                             "sqs": sqs}, headers=admin(cluster), follow=True)
    assert made.status == 201, made
    for url in cluster.urls:
        wait_until(lambda: call("GET", url + "/v1/whoami", headers=bearer(made.body["token"])).status == 200, 10,
                   f"{url} to take principal {name}")
    return made.body


def put(url: str, queue: str, who: dict, body=1):
    return call("POST", f"{url}/v1/queues/{queue}/messages", {"body": body}, headers=who, follow=True)


def depth(cluster, queue: str) -> int | None:
    shown = call("GET", f"{cluster.urls[0]}/v1/queues/{queue}", headers=admin(cluster), follow=True)
    return shown.body["stats"]["depth"] if shown.status == 200 else None


def refused(reply, action: str, queue: str | None):
    assert reply.status == 403, reply
    assert (reply.body["error"], reply.body["action"], reply.body.get("queue")) == ("forbidden", action, queue), reply
    assert action in reply.body["message"] and (queue is None or queue in reply.body["message"])


async def stream_frames(url: str, token: str, frames: list, answers: int) -> list:
    """Send `frames` over one /v1/stream connection (to the leader) and read `answers` frames after hello."""
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url + "/v1/stream", headers=bearer(token)) as ws:
            hello = cbor2.loads((await ws.receive()).data)
            assert hello["op"] == "hello" and hello["leader"], hello
            for frame in frames:
                await ws.send_bytes(cbor2.dumps(frame))
            got = []
            while len(got) < answers:
                message = await asyncio.wait_for(ws.receive(), 15)
                if message.type != aiohttp.WSMsgType.BINARY:
                    break
                got.append(cbor2.loads(message.data))
            return got


# ---- the doors -----------------------------------------------------------------------------------

def test_put_on_orders_puts_to_orders_eu_and_nothing_else_at_every_door(cluster):
    writer = make(cluster, "orders-writer", PUT_ORDERS, sqs=True)
    who = bearer(writer["token"])
    leader = cluster.url(cluster.wait_for_leader(30))
    # the HTTP API, on every node (a follower checks before it redirects, the leader again)
    for url in cluster.urls:
        assert put(url, "orders-eu", who).status == 201
        refused(put(url, "billing", who), "put", "billing")
    assert depth(cluster, "orders-eu") == 3 and depth(cluster, "billing") is None
    refused(call("POST", leader + "/v1/queues/orders-eu/receive", {}, headers=who), "receive", "orders-eu")
    refused(call("GET", leader + "/v1/queues/orders-eu/messages", headers=who), "browse", "orders-eu")
    refused(call("PUT", leader + "/v1/queues/orders-new", {}, headers=who), "admin", "orders-new")
    refused(call("PATCH", leader + "/v1/queues/orders-eu", {"retention_ms": 1000}, headers=who), "admin", "orders-eu")
    refused(call("PATCH", leader + "/v1/queues/orders-eu/groups/default", {"paused": True}, headers=who),
            "receive", "orders-eu")
    refused(call("POST", leader + "/v1/queues/orders-eu/groups/default/seek", {"to": "earliest"}, headers=who),
            "receive", "orders-eu")
    refused(call("GET", leader + "/v1/cluster", headers=who), "metrics", None)
    refused(call("GET", leader + "/v1/events", headers=who), "metrics", None)
    refused(call("GET", leader + "/metrics", headers=who), "metrics", None)
    refused(call("GET", leader + "/v1/principals", headers=who), "cluster", None)
    # a transaction's every queue: the second one refused, the first not written either
    tx = call("POST", leader + "/v1/tx", {"put": [{"queue": "orders-eu", "messages": [{"body": "tx"}]},
                                                  {"queue": "billing", "messages": [{"body": "tx"}]}]}, headers=who)
    refused(tx, "put", "billing")
    assert depth(cluster, "orders-eu") == 3 and depth(cluster, "billing") is None
    # lists show only what it has an action on
    call("PUT", leader + "/v1/queues/billing", {}, headers=admin(cluster))
    listed = call("GET", leader + "/v1/queues", headers=who).body["queues"]
    assert [q["name"] for q in listed] == ["orders-eu"]
    # the streaming wire: every frame, not only the upgrade
    frames = asyncio.run(stream_frames(leader, writer["token"], [
        {"op": "publish", "queue": "orders-eu", "messages": [{"cid": 1, "body": "s"}]},
        {"op": "publish", "queue": "billing", "messages": [{"cid": 2, "body": "s"}]},
        {"op": "subscribe", "sub": "s1", "queue": "orders-eu"}], 3))
    by_op = {(f["op"], f.get("sub", f.get("queue"))): f for f in frames}
    assert by_op[("confirm", "orders-eu")]["results"][0]["seq"] and not by_op[("confirm", "orders-eu")]["refused"]
    assert by_op[("confirm", "billing")]["refused"][0]["status"] == 403
    assert by_op[("error", "s1")]["error"] == "forbidden" and by_op[("error", "s1")]["action"] == "receive"
    assert depth(cluster, "orders-eu") == 4 and depth(cluster, "billing") == 0
    # SQS: the principal's own key, under its own rules
    key = SqsKey(writer["sqs"]["access_key"], writer["sqs"]["secret_key"], None)
    sqs = sqs_client(leader, key, attempts=1)
    url = sqs.get_queue_url(QueueName="orders-eu")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="via sqs")
    for call_sqs in (lambda: sqs.send_message(QueueUrl=url.replace("orders-eu", "billing"), MessageBody="x"),
                     lambda: sqs.receive_message(QueueUrl=url), lambda: sqs.create_queue(QueueName="orders-new")):
        with pytest.raises(ClientError) as denied:
            call_sqs()
        assert denied.value.response["Error"]["Code"] == "AccessDenied", denied.value.response
    assert [u.rsplit("/", 1)[1] for u in sqs.list_queues()["QueueUrls"]] == ["orders-eu"]
    assert depth(cluster, "orders-eu") == 5 and depth(cluster, "billing") == 0
    # every refusal is counted by principal and action, and kept on the node that refused it
    metrics = call("GET", leader + "/metrics", headers=admin(cluster)).raw.decode()
    assert 'raftq_auth_denied_total{action="put",principal="orders-writer"}' in metrics
    refusals = call("GET", leader + "/v1/audit", headers=admin(cluster)).body["refusals"]
    assert {"principal": "orders-writer", "action": "put", "queue": "billing"}.items() <= refusals[-1].items() \
        or any(r["queue"] == "billing" for r in refusals)


def test_a_dead_letter_target_and_a_redrive_source_are_checked_too(cluster):
    ops = make(cluster, "orders-ops", [{"actions": ["admin", "redrive", "put", "receive"], "queues": ["orders-*"]}])
    who, leader = bearer(ops["token"]), cluster.url(cluster.wait_for_leader(30))
    refused(call("PUT", leader + "/v1/queues/orders-jobs", {"dead_letter": "shared-dlq", "max_deliveries": 1},
                 headers=who), "admin", "shared-dlq")
    assert depth(cluster, "orders-jobs") is None
    assert call("PUT", leader + "/v1/queues/orders-jobs", {"max_deliveries": 1, "lease_ms": 100}, headers=who).status == 201
    refused(call("PATCH", leader + "/v1/queues/orders-jobs", {"dead_letter": "shared-dlq"}, headers=who),
            "admin", "shared-dlq")
    assert call("GET", leader + "/v1/queues/orders-jobs", headers=admin(cluster)).body["config"]["dead_letter"] is None
    # a dead-letter queue both tenants' queues send to: a redrive of orders-ops moves only its own
    boss = admin(cluster)
    for queue in ("orders-work", "billing-jobs"):
        call("PUT", f"{leader}/v1/queues/{queue}", {"max_deliveries": 1, "lease_ms": 100, "dead_letter": "orders-dlq"},
             headers=boss)
        put(leader, queue, boss)
        call("POST", f"{leader}/v1/queues/{queue}/receive", {}, headers=boss)
    wait_until(lambda: depth(cluster, "orders-dlq") == 2, 10, "both dead letters")
    refused(call("POST", leader + "/v1/queues/orders-dlq/redrive", {"from_queue": "billing-jobs"}, headers=who),
            "redrive", "billing-jobs")
    moved = call("POST", leader + "/v1/queues/orders-dlq/redrive", {}, headers=who)
    assert moved.status == 200 and moved.body["to"] == {"orders-work": 1}, moved
    assert depth(cluster, "orders-dlq") == 1


# ---- revocation and change ---------------------------------------------------------------------

def test_a_revoked_principal_is_refused_by_every_node_within_a_second(cluster):
    """The time from the revocation's answer until every node refuses the token is printed (no
    threshold here: bench/tenant_attack.py reports it too); an open streaming-wire connection of
    the principal is told and closed."""
    doomed = make(cluster, "doomed", PUT_ORDERS)
    who, leader = bearer(doomed["token"]), cluster.url(cluster.wait_for_leader(30))
    opened, stream = threading.Event(), {}
    streaming = threading.Thread(target=lambda: stream.update(asyncio.run(_stay_open(leader, doomed["token"],
                                                                                      opened))))
    streaming.start()
    assert opened.wait(15)
    refused_at, revoking = {}, threading.Event()

    def watch(url):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if call("GET", url + "/v1/whoami", headers=who, timeout=5).status == 401:
                refused_at[url] = (revoking.is_set(), time.monotonic())
                return
            time.sleep(0.005)
    watchers = [threading.Thread(target=watch, args=(url,)) for url in cluster.urls]
    for watcher in watchers:
        watcher.start()
    time.sleep(0.3)
    revoking.set()
    assert call("DELETE", leader + "/v1/principals/doomed", headers=admin(cluster)).status == 204
    revoked_at = time.monotonic()
    for watcher in watchers:
        watcher.join(20)
    assert set(refused_at) == set(cluster.urls) and all(after for after, _ in refused_at.values()), refused_at
    seconds = {url: max(0.0, at - revoked_at) for url, (_, at) in refused_at.items()}
    print(f"\nrevocation seen by every node {max(seconds.values()):.3f} s after its answer "
          f"({', '.join(f'{s:.3f}' for s in seconds.values())})")
    streaming.join(20)
    assert stream == {"error": "unauthorized", "closed": 4401}, stream
    for url in cluster.urls:
        assert put(url, "orders-eu", who).status == 401


async def _stay_open(url: str, token: str, opened: threading.Event) -> dict:
    """Open a stream, then read until the node closes it: the error frame it sent, and its close code."""
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url + "/v1/stream", headers=bearer(token)) as ws:
            assert cbor2.loads((await ws.receive()).data)["op"] == "hello"
            opened.set()
            got = {}
            while True:
                message = await asyncio.wait_for(ws.receive(), 30)
                if message.type == aiohttp.WSMsgType.BINARY:
                    got["error"] = cbor2.loads(message.data)["error"]
                else:
                    got["closed"] = ws.close_code
                    return got


def test_rules_change_and_a_new_token_take_effect_on_every_node_without_a_restart(cluster):
    changing = make(cluster, "changing", PUT_ORDERS)
    leader = cluster.url(cluster.wait_for_leader(30))
    changed = call("PATCH", leader + "/v1/principals/changing", {"rules": [{"actions": ["put"], "queues": ["billing"]}],
                                                                  "new_token": True}, headers=admin(cluster))
    assert changed.status == 200 and changed.body["token"] != changing["token"]
    old, new = bearer(changing["token"]), bearer(changed.body["token"])
    for url in cluster.urls:
        wait_until(lambda: put(url, "billing", new).status == 201, 10, f"{url} to take the new rules and token")
        assert put(url, "billing", old).status == 401
        refused(put(url, "orders-eu", new), "put", "orders-eu")
    events = call("GET", leader + "/v1/audit", headers=admin(cluster)).body["changes"]
    assert any(e["principal"] == "changing" and e["change"] == "changed" and e["by"] == "admin"
               and e.get("token") == "new" for e in events)
    assert changed.body["token"] not in str(events)


def test_cluster_tokens_stay_the_bootstrap_admin_and_names_are_theirs(cluster):
    leader = cluster.url(cluster.wait_for_leader(30))
    for name in ("admin", "data", "metrics"):
        taken = call("POST", leader + "/v1/principals", {"name": name, "rules": PUT_ORDERS}, headers=admin(cluster))
        assert taken.status == 409 and "cluster.toml" in taken.body["message"], taken
    me = call("GET", leader + "/v1/whoami", headers={"Authorization": f"Bearer {cluster.cfg.tokens.data}"}).body
    assert me["name"] == "data" and me["kept_by"] == "cluster.toml"
    # the metrics token reads the cluster's state too: what /metrics exports, as the console shows it
    metrics = {"Authorization": f"Bearer {cluster.cfg.tokens.metrics}"}
    assert call("GET", leader + "/v1/cluster", headers=metrics).status == 200
    refused(call("GET", leader + "/v1/queues", headers=metrics), "put|receive|browse|admin|redrive|producers", None)


def raftq(cluster, *args, token: str | None = None) -> subprocess.CompletedProcess:
    """The CLI as an operator runs it, with `token` (the admin's by default)."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("RAFTQ_URL", "RAFTQ_TOKEN")},
           "RAFTQ_URL": ",".join(cluster.urls), "RAFTQ_TOKEN": token or cluster.cfg.tokens.admin}
    return subprocess.run([sys.executable, "-m", "raftq", *args], capture_output=True, text=True, env=env, timeout=60)


def test_the_cli_makes_shows_uses_and_revokes_a_principal(cluster):
    """raftq principal add prints the token once as a shell line; the principal puts under its rule
    and no further; list, audit and whoami show it (never its token); remove revokes it."""
    made = raftq(cluster, "principal", "add", "cli-writer", "--allow", "put:cli-*", "--quota", "queues=3")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().removeprefix("export RAFTQ_TOKEN=")
    assert made.stdout.startswith("export RAFTQ_TOKEN=") and len(token) >= 32, made.stdout
    assert raftq(cluster, "put", "cli-jobs", '{"n": 1}', token=token).returncode == 0
    other = raftq(cluster, "put", "billing", '{"n": 1}', token=token)
    assert other.returncode != 0 and "forbidden" in other.stderr + other.stdout and "billing" in other.stderr + other.stdout
    me = json.loads(raftq(cluster, "principal", "whoami", "--json", token=token).stdout)
    assert (me["name"], me["rules"], me["quotas"]) == ("cli-writer", [{"actions": ["put"], "queues": ["cli-*"]}],
                                                       {"queues": 3})
    listed = raftq(cluster, "principal", "list")
    assert "cli-writer" in listed.stdout and "put:cli-*" in listed.stdout and token not in listed.stdout
    bad = raftq(cluster, "principal", "add", "cli-bad", "--allow", "fly:cli-*")
    assert bad.returncode != 0 and "actions must be" in bad.stderr + bad.stdout
    assert raftq(cluster, "principal", "remove", "cli-writer").returncode == 0
    for url in cluster.urls:
        wait_until(lambda: call("GET", url + "/v1/whoami", headers=bearer(token)).status == 401, 10,
                   f"{url} to refuse the revoked token")
    audit = raftq(cluster, "principal", "audit")
    assert "cli-writer" in audit.stdout and "removed" in audit.stdout and token not in audit.stdout


# ---- quotas -------------------------------------------------------------------------------------

def test_a_principal_owns_at_most_its_queues_quota(cluster):
    tenant = make(cluster, "tenant-q", [{"actions": ["put", "admin"], "queues": ["tq-*"]}], quotas={"queues": 2})
    who, leader = bearer(tenant["token"]), cluster.url(cluster.wait_for_leader(30))
    assert put(leader, "tq-1", who).status == 201
    assert call("PUT", leader + "/v1/queues/tq-2", {}, headers=who).status == 201
    over = put(leader, "tq-3", who)
    assert (over.status, over.body["error"], over.body["quota"]) == (429, "quota_exceeded", "queues"), over
    assert "tenant-q" in over.body["message"] and depth(cluster, "tq-3") is None
    assert call("DELETE", leader + "/v1/queues/tq-2", headers=who).status == 204
    assert put(leader, "tq-3", who).status == 201


def test_a_principals_queues_store_at_most_its_stored_bytes_quota(cluster):
    tenant = make(cluster, "tenant-b", [{"actions": ["put", "receive"], "queues": ["tb-*"]}],
                  quotas={"stored_bytes": 10_000}, sqs=True)
    who, leader = bearer(tenant["token"]), cluster.url(cluster.wait_for_leader(30))
    stored = 0
    for _ in range(20):      # twice the quota: a quota ignored fails here rather than fill the disk
        reply = put(leader, "tb-fill", who, "x" * 1000)
        if reply.status != 201:
            break
        stored += 1
    assert (reply.status, reply.body["quota"]) == (429, "stored_bytes") and 8 <= stored <= 10, (stored, reply)
    assert put(leader, "tb-other", who, "x" * 1000).status == 429          # every queue of it counts
    sqs = sqs_client(leader, SqsKey(tenant["sqs"]["access_key"], tenant["sqs"]["secret_key"], None), attempts=1)
    with pytest.raises(ClientError) as throttled:       # the SQS door: AWS's throttling error, naming the quota
        sqs.send_message(QueueUrl=sqs.get_queue_url(QueueName="tb-fill")["QueueUrl"], MessageBody="x" * 1000)
    assert throttled.value.response["Error"]["Code"] == "RequestThrottled" and "stored_bytes" in str(throttled.value)
    taken = call("POST", leader + "/v1/queues/tb-fill/receive", {"max": 5}, headers=who).body["messages"]
    call("POST", leader + "/v1/queues/tb-fill/ack", {"receipts": [m["receipt"] for m in taken]}, headers=who)
    assert put(leader, "tb-fill", who, "x" * 1000).status == 201


def test_a_principal_puts_at_most_its_put_rate(cluster):
    rate = 5
    tenant = make(cluster, "tenant-r", [{"actions": ["put"], "queues": ["tr-*"]}], quotas={"put_rate": rate})
    who, leader = bearer(tenant["token"]), cluster.url(cluster.wait_for_leader(30))
    started, taken, over, held = time.monotonic(), 0, None, None
    for _ in range(14):
        sent = time.monotonic()
        reply = put(leader, "tr-1", who)
        if reply.status == 201:
            taken += 1
        else:
            over, held = reply, time.monotonic() - sent
    elapsed = time.monotonic() - started
    assert over is not None and (over.status, over.body["quota"]) == (429, "put_rate"), over
    # a refusal is answered a second late, the wait served (a flood's refusals cost it, not the node)
    assert held >= 1.0 and over.headers["Retry-After"] == "0", (held, over.headers)
    assert taken <= rate + rate * elapsed + 1, (taken, elapsed)         # a second's burst, then the rate
    assert depth(cluster, "tr-1") == taken


def test_a_principal_holds_at_most_its_connections_quota(cluster):
    tenant = make(cluster, "tenant-c", [{"actions": ["put"], "queues": ["tc-*"]}], quotas={"connections": 1})
    leader = cluster.url(cluster.wait_for_leader(30))

    async def connections():
        async with aiohttp.ClientSession() as session:
            first = await session.ws_connect(leader + "/v1/stream", headers=bearer(tenant["token"]))
            with pytest.raises(aiohttp.WSServerHandshakeError) as over:
                await session.ws_connect(leader + "/v1/stream", headers=bearer(tenant["token"]))
            assert over.value.status == 429
            await first.close()
            for _ in range(50):      # the node counts the first one gone once its handler ended
                try:
                    again = await session.ws_connect(leader + "/v1/stream", headers=bearer(tenant["token"]))
                    await again.close()
                    return True
                except aiohttp.WSServerHandshakeError:
                    await asyncio.sleep(0.1)
            return False
    assert asyncio.run(connections())


async def open_stream(session, url: str, token: str, wait: float = 10.0):
    """A /v1/stream connection, waiting out 503s (group 0's leader relearning after its election)
    for up to `wait` seconds; None when it is refused 429."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return await session.ws_connect(url + "/v1/stream", headers=bearer(token))
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status == 429:
                return None
            assert exc.status == 503 and time.monotonic() < deadline, exc
            await asyncio.sleep(0.1)


def test_connections_are_counted_for_the_cluster_and_a_killed_nodes_leave_within_a_lease(fresh_cluster):
    """Group 0's leader counts a principal's connections on every node: two on two nodes are held,
    a third on the third node is 429; closing one lets a new one in; a node killed with one open
    stops renewing its lease, and its connection leaves the count within the lease (timed)."""
    cluster = fresh_cluster(3)
    tenant = make(cluster, "tenant-cc", [{"actions": ["put"], "queues": ["cc-*"]}], quotas={"connections": 2})
    leader = cluster.wait_for_leader(30)
    first, second = [node for node in cluster.ids if node != leader]

    def connect(session, node: str):
        return open_stream(session, cluster.url(node), tenant["token"])

    async def connections():
        async with aiohttp.ClientSession() as session:
            on_first = await connect(session, first)
            on_second = await connect(session, second)
            assert on_first is not None and on_second is not None
            assert await connect(session, leader) is None
            over = call("GET", cluster.url(leader) + "/v1/stream", headers=bearer(tenant["token"]))
            assert (over.status, over.body["quota"], over.body["limit"]) == (429, "connections", 2), over
            assert "on this node" not in over.body["message"], over
            await on_first.close()
            on_leader = None
            for _ in range(50):                # released once the first node's handler ended
                on_leader = await connect(session, leader)
                if on_leader is not None:
                    break
                await asyncio.sleep(0.1)
            assert on_leader is not None
            assert await connect(session, first) is None

            cluster.kill(second)               # its connection is never closed: its lease expires
            killed = time.monotonic()
            again = None
            while again is None and time.monotonic() - killed < CONNECTION_LEASE_S + 5:
                again = await connect(session, first)
                if again is None:
                    await asyncio.sleep(0.1)
            released = time.monotonic() - killed
            print(f"a killed node's connection was released {released:.1f} s after the kill "
                  f"(lease {CONNECTION_LEASE_S} s)")
            assert again is not None and released <= CONNECTION_LEASE_S + 1.0, released
            assert await connect(session, first) is None             # and the quota holds again
            await again.close()
            await on_leader.close()
    asyncio.run(connections())


def test_a_new_group_0_leader_relearns_the_open_connections_before_it_takes_a_new_one(fresh_cluster):
    """Group 0's lead moves while a connection is open: the new leader knows none, and takes no
    new connection (503, Retry-After) until a lease has passed since its election, by when the
    open one was renewed to it and counts (timed). The open one is an event stream: a
    streaming-wire connection is closed when its group's lead moves."""
    cluster = fresh_cluster(3)
    tenant = make(cluster, "tenant-cr", [{"actions": ["put"], "queues": ["cr-*"]}, {"actions": ["metrics"]}],
                  quotas={"connections": 2})
    old = cluster.wait_for_leader(30)
    new, other = [node for node in cluster.ids if node != old]

    async def connections():
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 10
            while True:                # group 0's leader may still relearn after the cluster's first election
                before = await session.get(cluster.url(other) + "/v1/events", headers=bearer(tenant["token"]))
                if before.status != 503 or time.monotonic() > deadline:
                    break
                before.close()
                await asyncio.sleep(0.1)
            assert before.status == 200, before.status
            with cluster.client() as client:
                assert client.transfer_leadership(new)["moved"]
            moved = time.monotonic()
            after = await open_stream(session, cluster.url(other), tenant["token"], wait=CONNECTION_LEASE_S + 5)
            waited = time.monotonic() - moved
            print(f"a new group-0 leader took a new connection {waited:.1f} s after the lead moved "
                  f"(lease {CONNECTION_LEASE_S} s)")
            assert after is not None and waited >= CONNECTION_LEASE_S - 1.0, waited
            assert await open_stream(session, cluster.url(old), tenant["token"]) is None   # the open one counts
            await after.close()
            before.close()
    asyncio.run(connections())


def test_a_principal_holds_at_most_its_long_polls_quota(cluster):
    tenant = make(cluster, "tenant-l", [{"actions": ["receive"], "queues": ["tl-*"]}], quotas={"long_polls": 2})
    leader = cluster.url(cluster.wait_for_leader(30))
    call("PUT", leader + "/v1/queues/tl-1", {}, headers=admin(cluster))
    assert long_polls_taken(leader, tenant["token"], ["tl-1"] * 4) == 2


def long_polls_taken(url: str, token: str, queues: list) -> int:
    """How many of receives on `queues`, all at once with a 3 s wait, were let wait (the others
    are refused 429 at once, naming the long_polls quota)."""
    results = []

    def receive(queue):
        reply = call("POST", f"{url}/v1/queues/{queue}/receive", {"wait_ms": 3000}, headers=bearer(token),
                     follow=True)
        results.append(reply)
    threads = [threading.Thread(target=receive, args=(queue,)) for queue in queues]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    refusals = [r for r in results if r.status != 200]
    assert all((r.status, r.body["quota"]) == (429, "long_polls") for r in refusals), refusals
    return len(results) - len(refusals)


def test_with_several_groups_quotas_count_the_clusters_not_each_groups(fresh_cluster):
    """Queues spread over two Raft groups: the queues quota is the catalog's count, the long polls
    quota is split between the groups' leaders, so neither passes its whole in the cluster."""
    cluster = fresh_cluster(1, groups=2)
    tenant = make(cluster, "spread", [{"actions": ["put", "receive", "admin"], "queues": ["sp-*"]}],
                  quotas={"queues": 4, "long_polls": 2})
    url, who = cluster.urls[0], bearer(tenant["token"])
    made = [q for q in (f"sp-{n}" for n in range(8))
            if call("PUT", f"{url}/v1/queues/{q}", {}, headers=who, follow=True).status == 201]
    assert len(made) == 4
    routing = call("GET", url + "/v1/cluster/routing", headers=admin(cluster)).body["queues"]
    assert {routing[q] for q in made} == {0, 1}, routing          # both groups hold some
    by_group = {routing[q]: q for q in made}
    assert long_polls_taken(url, tenant["token"], [by_group[0], by_group[0], by_group[1], by_group[1]]) == 2

"""What a put's answer claims, against real node processes with a follower
paused by SIGSTOP (and resumed by the test, by PID, whatever happens).

- `durability=all` is answered only once a lagging voter holds the entry;
- when a connected voter does not get it within the write timeout, the answer
  says `quorum`, names the voter, and the client raises DurabilityNotReached;
- `consistency=strong` puts exactly one no-op through the log;
- a production node fdatasyncs before it answers (strace).
"""

import asyncio
import http.client
import json
import os
import re
import select
import signal
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from raftq.client import Client, DurabilityNotReached, Producer
from raftq.local import LocalCluster
from tests.tools import require_strace
from tests.waiting import wait_until
from tests.wire import call

pytestmark = pytest.mark.integration


def auth(cluster) -> dict:
    return {"Authorization": f"Bearer {cluster.token}"} if cluster.token else {}


class Pending:
    """One request sent now, whose answer is looked for later without waiting."""

    def __init__(self, url: str, method: str, path: str, body, headers: dict):
        self.conn = http.client.HTTPConnection(urlsplit(url).netloc, timeout=60)
        self.conn.request(method, path, body=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json", **headers})

    def answered(self) -> bool:
        """True once any byte of the answer has arrived."""
        readable, _, _ = select.select([self.conn.sock], [], [], 0)
        return bool(readable)

    def reply(self) -> tuple[int, dict]:
        try:
            response = self.conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            self.conn.close()


def followers(cluster, leader: str) -> list[str]:
    return [n for n in cluster.ids if n != leader]


def test_durability_all_is_answered_only_after_a_lagging_voter_caught_up(fresh_cluster):
    cluster = fresh_cluster(3)
    leader = cluster.wait_for_leader(30)
    url, lagging = cluster.url(leader), followers(cluster, leader)[0]
    assert call("PUT", f"{url}/v1/queues/everywhere", {}, headers=auth(cluster)).status == 201
    cluster.signal(lagging, signal.SIGSTOP)
    try:
        pending = Pending(url, "POST", "/v1/queues/everywhere/messages?durability=all", {"body": "late"},
                          auth(cluster))
        # Committed on the majority (leader and the running follower) ...
        wait_until(lambda: call("GET", f"{url}/v1/queues/everywhere", headers=auth(cluster))
                   .body["stats"]["depth"] == 1, what="the put to commit")
        # ... and a later write through the same log answered: an answer the
        # leader would give without waiting for the lagging voter is out by now.
        barrier = call("POST", f"{url}/v1/queues/barrier/messages", {"body": "b"}, headers=auth(cluster))
        assert barrier.status == 201, barrier
        assert not pending.answered(), "durability=all answered while a connected voter lacked the entry"
    finally:
        cluster.signal(lagging, signal.SIGCONT)
    status, body = pending.reply()
    assert status == 201 and body["durability"] == "all", body
    assert "durability_not_reached" not in body
    view = cluster.ready_view(lagging)
    assert view["last_log_index"] >= body["commit_index"]


def test_durability_all_not_reached_in_time_says_quorum_and_the_clients_raise(fresh_cluster):
    cluster = fresh_cluster(3)
    leader = cluster.wait_for_leader(30)
    paused = followers(cluster, leader)[0]

    def http_put():
        with Client([cluster.url(leader)], token=cluster.token, timeout=60) as client:
            client.put("short", "not everywhere", id="m-1", durability="all")

    async def stream_put():
        async with Producer([cluster.url(leader)], token=cluster.token, durability="all") as producer:
            await (await producer.send("streamed", "not everywhere", id="s-1"))

    async def both():
        # at once: the write timeout (10 s) is waited out once
        return await asyncio.gather(asyncio.to_thread(http_put), stream_put(), return_exceptions=True)

    cluster.signal(paused, signal.SIGSTOP)
    try:
        over_http, over_stream = asyncio.run(both())
    finally:
        cluster.signal(paused, signal.SIGCONT)
    assert isinstance(over_http, DurabilityNotReached), over_http
    assert (over_http.status, over_http.code) == (201, "durability_not_reached")
    body = over_http.body
    assert body["durability"] == "quorum"
    assert body["durability_not_reached"]["requested"] == "all"
    assert body["durability_not_reached"]["lagging"] == [paused]
    assert "durability=all was NOT reached" in over_http.message
    assert body["messages"] == [{"seq": 1, "duplicate": False, "replaced_seq": None}]
    assert isinstance(over_stream, DurabilityNotReached), over_stream
    assert over_stream.body["durability"] == "quorum" and over_stream.body["seq"] == 1
    assert over_stream.body["durability_not_reached"]["lagging"] == [paused]
    # Once the voter is back, the same put (same id) stores nothing and reaches all.
    with Client([cluster.url(leader)], token=cluster.token, timeout=60) as client:
        again = client.put("short", "not everywhere", id="m-1", durability="all")
    assert again["durability"] == "all"
    assert again["messages"] == [{"seq": 1, "duplicate": True, "replaced_seq": None}]


def test_a_strong_read_puts_one_no_op_through_the_log_and_a_leader_read_none(fresh_cluster):
    cluster = fresh_cluster(3)
    leader = cluster.wait_for_leader(30)
    url = cluster.url(leader)
    assert call("PUT", f"{url}/v1/queues/quiet", {}, headers=auth(cluster)).status == 201

    def commit_index():
        return call("GET", url + "/health/ready", headers=auth(cluster)).body["commit_index"]

    # A queue without leases or delays has no timers: once the leader's
    # barrier is in, nothing else enters the log.
    wait_until(lambda: commit_index() == commit_index(), what="a quiet log")
    before = commit_index()
    leader_read = call("GET", f"{url}/v1/queues/quiet?consistency=leader", headers=auth(cluster))
    assert leader_read.status == 200 and commit_index() == before
    strong = call("GET", f"{url}/v1/queues/quiet?consistency=strong", headers=auth(cluster))
    assert strong.status == 200 and strong.body["stats"]["depth"] == 0
    assert commit_index() == before + 1


def test_a_production_node_fdatasyncs_its_journal_before_it_answers_a_put(tmp_path):
    """`raftq node` as an operator runs it, traced at the syscall level: every
    201 leaves after an fdatasync of each journal write before it."""
    strace = require_strace()
    cluster = LocalCluster.create(tmp_path / "c", 1)
    trace = tmp_path / "trace"
    with open(tmp_path / "n1.log", "wb") as log:
        tracer = subprocess.Popen(
            [strace, "-f", "-yy", "-s", "16", "-o", str(trace), "-e", "trace=pwrite64,fdatasync,fsync,sendto,write",
             sys.executable, "-m", "raftq", "node", "--config", str(cluster.config_path), "--id", "n1",
             "--data-dir", str(tmp_path / "n1")], stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)   # strace and the node it runs: one group to stop
    puts = 20
    try:
        # (not cluster.wait_for_leader: it trusts only nodes it started itself, by
        # PID, and this one is strace's child)
        view = wait_until(lambda: (lambda v: v if v and v["ready"] else None)(cluster.ready_view("n1")),
                          timeout=60, what="the traced node to lead")
        assert view["role"] == "leader"
        node_pid = view["pid"]
        with Client(cluster.urls, token=cluster.token) as client:
            for i in range(puts):
                assert client.put("synced", i)["messages"][0]["seq"] == i + 1
        os.kill(node_pid, signal.SIGTERM)
        assert tracer.wait(60) == 0
    finally:
        if tracer.poll() is None:
            os.killpg(tracer.pid, signal.SIGKILL)   # the node too, whatever failed
            tracer.wait()
    http_port = cluster.cfg.node("n1").http.rsplit(":", 1)[1]
    unsynced, answered, syncs = False, 0, 0
    for call, target, line in calls(trace.read_text()):
        if re.search(r"/seg-\d+\.log$", target):
            if call in ("fsync", "fdatasync"):
                unsynced, syncs = False, syncs + 1
            else:
                unsynced = True
        elif f"127.0.0.1:{http_port}->" in target and "HTTP/1.1 201" in line:
            assert not unsynced, "a put was answered while a journal write was not yet synced"
            answered += 1
    assert answered == puts
    assert syncs >= puts


def calls(trace: str):
    """(call, fd target, line) from `strace -f -yy` output, in the order they
    took effect: a write or send when it starts, a sync when it has returned."""
    started = re.compile(r"^(\d+)\s+(pwrite64|fdatasync|fsync|sendto|write)\(\d+<(.+?)>[,)]")
    resumed = re.compile(r"^(\d+)\s+<\.\.\. (fdatasync|fsync) resumed>")
    waiting_syncs = {}
    for line in trace.splitlines():
        m = started.match(line)
        if m:
            pid, call, target = m.groups()
            if call in ("fsync", "fdatasync") and "<unfinished" in line:
                waiting_syncs[pid] = (call, target, line)
            else:
                yield call, target, line
            continue
        m = resumed.match(line)
        if m and m.group(1) in waiting_syncs:
            yield waiting_syncs.pop(m.group(1))

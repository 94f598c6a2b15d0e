"""Issue 51 through the doors of a real 3-node cluster: HTTP (raw, and through a follower), the
Python clients, the streaming wire, the command line, the web console and the SQS API.
Priorities, redelivery back-off, paused and rate-limited groups, retention and replay
(docs/api.md); the state machine's own rules are
tests/test_statemachine_{priorities,backoff,pauses,retention}.py and the model test."""

import asyncio
import json
import re
import time
import uuid

import pytest

from raftq.client import AsyncClient, Client, Consumer, Producer, RaftqError
from tests.test_cli import as_json, raftq
from tests.sqsutil import sqs_client, start_sqs_cluster
from tests.test_console import CHROMIUM, CHROMIUM_ARGS, RESULTS, WAIT_MS, browser_or_skip
from tests.wire import call

pytestmark = pytest.mark.integration


def qname() -> str:
    return "qf-" + uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory):
    """One 3-node cluster for every door, the SQS API's included."""
    cluster = start_sqs_cluster(tmp_path_factory.mktemp("queue-features"))
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def client(cluster3):
    with Client(cluster3.urls, token=cluster3.token) as c:
        yield c


def leader_url(cluster) -> str:
    return cluster.url(cluster.wait_for_leader(30))


def follower_url(cluster) -> str:
    leader = cluster.wait_for_leader(30)
    return cluster.url(next(n for n in cluster.ids if n != leader))


def test_priorities_over_http_through_a_follower_and_the_client(cluster3, client):
    q = qname()
    put = call("POST", f"{leader_url(cluster3)}/v1/queues/{q}/messages",
               {"messages": [{"body": "low"}, {"body": "urgent", "priority": 9}, {"body": "mid", "priority": 4}]})
    assert put.status == 201, put
    client.put(q, "also urgent", priority=9)
    refused = call("POST", f"{leader_url(cluster3)}/v1/queues/{q}/messages", {"body": "x", "priority": 10})
    assert (refused.status, refused.body["error"]) == (400, "bad_request")
    # a follower forwards (X-Raftq-Forward) a browse and a receive like any other
    browsed = call("GET", f"{follower_url(cluster3)}/v1/queues/{q}/messages", headers={"X-Raftq-Forward": "1"})
    assert [m["priority"] for m in browsed.body["messages"]] == [0, 9, 4, 9]
    got = call("POST", f"{follower_url(cluster3)}/v1/queues/{q}/receive", {"max": 10},
               headers={"X-Raftq-Forward": "1"})
    assert [(m["body"], m["priority"]) for m in got.body["messages"]] == \
        [("urgent", 9), ("also urgent", 9), ("mid", 4), ("low", 0)]


def test_a_back_off_policy_delays_a_nack_without_a_delay(cluster3, client):
    q = qname()
    created = client.create_queue(q, backoff={"initial_ms": 1_500, "factor": 2})
    assert created["config"]["backoff"] == {"initial_ms": 1_500, "factor": 2.0, "max_ms": 60_000, "jitter": 0.0}
    client.put(q, "job")
    first = client.receive(q)["messages"][0]
    client.nack(q, [first["receipt"]])
    waiting = client.browse(q)["messages"][0]
    assert waiting["deliveries"] == 1 and waiting["next_ready_at_ms"] is not None
    started = time.monotonic()
    again = client.receive(q, wait_ms=10_000)["messages"]      # a long poll, woken when the delay ends
    assert [m["deliveries"] for m in again] == [2]
    assert time.monotonic() - started >= 1.0
    bad = call("PATCH", f"{leader_url(cluster3)}/v1/queues/{q}", {"backoff": {"factor": 20}})
    assert (bad.status, bad.body["error"]) == (400, "bad_request")


def test_a_paused_group_gets_nothing_until_its_pause_ends_and_a_limited_one_its_rate(cluster3, client):
    q = qname()
    client.create_queue(q)
    client.put_batch(q, [f"m{i}" for i in range(12)])
    paused = client.pause_group(q, "default", for_ms=1_500)
    assert paused["paused"] is True and paused["resume_at_ms"] is not None
    assert client.group(q, "default")["paused"] is True
    started = time.monotonic()
    got = client.receive(q, max=3, wait_ms=10_000)["messages"]   # woken by the tick at the pause's end
    assert len(got) == 3 and time.monotonic() - started >= 1.0
    client.pause_group(q, "default")
    assert client.receive(q, max=3, wait_ms=300)["messages"] == []
    assert client.resume_group(q, "default")["paused"] is False
    assert client.limit_group_rate(q, "default", 4)["rate_limit"] == 4
    assert len(client.receive(q, max=100)["messages"]) == 4        # one second's worth
    assert len(client.receive(q, max=100)["messages"]) <= 1        # then a quarter second for each
    client.limit_group_rate(q, "default", None)
    assert client.group(q, "default")["rate_limit"] is None
    bad = call("PATCH", f"{leader_url(cluster3)}/v1/queues/{q}/groups/default", {"paused": "soon"})
    assert (bad.status, bad.body["error"]) == (400, "bad_request")
    missing = call("PATCH", f"{leader_url(cluster3)}/v1/queues/{q}/groups/nope", {"paused": True})
    assert missing.status == 404


def test_retained_messages_are_replayed_by_a_seek_and_a_group_made_at_a_position(cluster3, client):
    q = qname()
    client.create_queue(q, retention_ms=600_000)
    seqs = [m["seq"] for m in client.put_batch(q, ["a", "b"])["messages"]]
    time.sleep(0.05)                        # c and d are put at a later log time
    seqs += [m["seq"] for m in client.put_batch(q, ["c", "d"])["messages"]]
    for m in client.receive(q, max=10)["messages"]:
        client.ack(q, [m["receipt"]])
    stats = client.queue(q)["stats"]
    assert (stats["depth"], stats["retained"]) == (0, 4)
    scraped = re.search(rf'raftq_queue_retained{{queue="{q}"}} (\S+)', client.metrics())
    assert scraped and float(scraped.group(1)) == 4
    moved = client.seek_group(q, "default", {"seq": seqs[1]})
    assert moved["replayed"] == 3
    assert [m["body"] for m in client.receive(q, max=10)["messages"]] == ["b", "c", "d"]
    made = call("PUT", f"{leader_url(cluster3)}/v1/queues/{q}/groups/audit", {"start": "earliest"})
    assert made.status == 201 and made.body["depth"] == 4
    put_at = client.browse(q, group="audit")["messages"][2]["put_at_ms"]
    client.seek_group(q, "audit", {"time_ms": put_at})
    assert [m["seq"] for m in client.browse(q, group="audit")["messages"]] == seqs[2:]
    for bad in ({"to": "start"}, {"to": {"seq": -1}}, {}, {"to": "earliest", "extra": 1}):
        refused = call("POST", f"{leader_url(cluster3)}/v1/queues/{q}/groups/audit/seek", bad)
        assert (refused.status, refused.body["error"]) == (400, "bad_request"), bad
    assert call("POST", f"{leader_url(cluster3)}/v1/queues/{q}/groups/nope/seek", {"to": "latest"}).status == 404


def test_the_streaming_wire_carries_priorities_and_a_nack_without_a_delay_backs_off(cluster3):
    q = qname()

    async def scenario():
        async with AsyncClient(cluster3.urls, token=cluster3.token) as http:
            await http.create_queue(q, backoff={"initial_ms": 60_000})
        async with Producer(cluster3.urls, token=cluster3.token) as producer:
            confirms = [await producer.send(q, body, priority=priority)
                        for body, priority in (("low", None), ("high", 7))]
            await producer.flush()
            for confirm in confirms:
                assert "seq" in await confirm
        async with Consumer(cluster3.urls, q, prefetch=10, token=cluster3.token) as consumer:
            first = await consumer.receive(timeout=10)
            second = await consumer.receive(timeout=10)
            assert [(m.body, m.priority) for m in (first, second)] == [("high", 7), ("low", 0)]
            first.nack()                  # the policy's minute: not delivered again in this test
            second.ack()
            await consumer.flush()
            assert await consumer.receive(timeout=1.5) is None
        async with AsyncClient(cluster3.urls, token=cluster3.token) as http:
            waiting = (await http.browse(q))["messages"]
            assert [(m["body"], m["deliveries"]) for m in waiting] == [("high", 1)]
            assert waiting[0]["next_ready_at_ms"] - waiting[0]["put_at_ms"] >= 60_000
    asyncio.run(scenario())


def test_a_bad_position_or_patch_is_refused_by_the_client_as_the_node_answers(client):
    q = qname()
    client.create_queue(q)
    with pytest.raises(RaftqError) as refused:
        client.add_group(q, "g", start={"seq": "one"})
    assert refused.value.status == 400
    with pytest.raises(RaftqError) as refused:
        client.limit_group_rate(q, "default", 0)
    assert refused.value.status == 400


def test_the_command_line_puts_priorities_sets_policies_pauses_limits_and_seeks(cluster3, client):
    q = qname()
    created = as_json("queue", "create", q, "--backoff", "initial_ms=250,factor=3,max_ms=9000",
                      "--retention-ms", "600000", cluster=cluster3)
    assert created["config"]["backoff"] == {"initial_ms": 250, "factor": 3.0, "max_ms": 9_000, "jitter": 0.0}
    assert created["config"]["retention_ms"] == 600_000
    bad = raftq("queue", "patch", q, "--backoff", "fast", cluster=cluster3, check=False)
    assert bad.returncode == 2 and "--backoff" in bad.stderr
    client.put(q, "low")
    raftq("put", q, '"high"', "--priority", "8", cluster=cluster3)
    got = [json.loads(line) for line in raftq("receive", q, "--max", "5", cluster=cluster3).stdout.splitlines()]
    assert [(m["body"], m["priority"]) for m in got] == [("high", 8), ("low", 0)]
    client.ack(q, [m["receipt"] for m in got])
    assert "replays 2" in raftq("group", "seek", q, "default", "earliest", cluster=cluster3).stdout
    assert "paused until" in raftq("group", "pause", q, "default", "--for-ms", "600000", cluster=cluster3).stdout
    listed = raftq("group", "list", q, cluster=cluster3).stdout
    assert "paused" in listed.splitlines()[0] and "until" in listed
    assert "rate limit 3/s" in raftq("group", "limit", q, "default", "3", cluster=cluster3).stdout
    assert as_json("group", "add", q, "late", "--start", "seq:2", cluster=cluster3)["depth"] == 1
    wrong = raftq("group", "seek", q, "default", "yesterday", cluster=cluster3, check=False)
    assert wrong.returncode == 2 and "position" in wrong.stderr
    shown = raftq("queue", "show", q, cluster=cluster3).stdout
    assert "retained 0" in shown and "until" in shown and "3/s" in shown
    assert as_json("group", "resume", q, "default", cluster=cluster3)["paused"] is False


def test_the_console_shows_priorities_and_paused_groups_and_pauses_limits_and_seeks_them(cluster3, client):
    sync_playwright = browser_or_skip()
    RESULTS.mkdir(parents=True, exist_ok=True)
    q = qname()
    client.create_queue(q, retention_ms=600_000)
    client.put_batch(q, [{"body": "plain"}, {"body": "urgent", "priority": 5}])
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            answers = ["7", "earliest"]                  # the rate limit's prompt, then the seek's
            page.on("dialog", lambda dialog: dialog.accept(answers.pop(0)))
            script_errors = []
            page.on("pageerror", lambda error: script_errors.append(str(error)))
            page.goto(cluster3.urls[0] + f"/ui#/queue/{q}")
            page.fill("#token", cluster3.token)
            page.click("#token-form button")
            page.wait_for_function("() => document.querySelectorAll('#messages tr[data-seq]').length === 2",
                                   timeout=WAIT_MS)
            priorities = [page.inner_text(f'#messages tr[data-seq="{seq}"] td:nth-child(2)') for seq in (1, 2)]
            assert priorities == ["0", "5"]
            row = '#groups tr[data-group="default"]'
            page.click(f"{row} button[data-pause-group]")
            page.wait_for_selector(f"{row}.paused", timeout=WAIT_MS)
            assert page.inner_text(f"{row} td.pause") == "paused"
            assert client.group(q, "default")["paused"] is True
            page.click(f"{row} button[data-rate-group]")
            page.wait_for_function(f"() => document.querySelector('{row} td.rate')?.textContent === '7/s'",
                                   timeout=WAIT_MS)
            page.evaluate("location.hash = '#/'")
            page.wait_for_function(f"""() => document.querySelector('#queues tr[data-queue="{q}"]')
                                       ?.textContent.includes('default (paused)')""", timeout=WAIT_MS)
            page.evaluate(f"location.hash = '#/queue/{q}'")
            page.wait_for_selector(f"{row}.paused", timeout=WAIT_MS)
            page.screenshot(path=str(RESULTS / "paused-group.png"), full_page=True)
            page.click(f"{row} button[data-pause-group]")
            page.wait_for_selector(f"{row}:not(.paused)", timeout=WAIT_MS)
            got = client.receive(q, max=10)["messages"]
            assert [m["body"] for m in got] == ["urgent", "plain"]
            client.ack(q, [m["receipt"] for m in got])
            page.wait_for_function("() => document.querySelectorAll('#messages tr[data-seq]').length === 0",
                                   timeout=WAIT_MS)
            page.click(f"{row} button[data-seek-group]")
            page.wait_for_function("() => document.querySelectorAll('#messages tr[data-seq]').length === 2",
                                   timeout=WAIT_MS)
            page.fill("#patch-form input[name=backoff]", '{"initial_ms": 500, "factor": 3}')
            page.click("#patch-form button[type=submit]")
            page.wait_for_function(
                f"() => document.querySelector('#toast')?.textContent === 'patch queue {q} — done'", timeout=WAIT_MS)
            assert client.queue(q)["config"]["backoff"] == {"initial_ms": 500, "factor": 3.0, "max_ms": 60_000,
                                                            "jitter": 0.0}
            page.fill("#group-form input[name=group]", "late")
            page.fill("#group-form input[name=start]", "seq:2")
            page.click("#group-form button[type=submit]")
            page.wait_for_selector('#groups tr[data-group="late"]', timeout=WAIT_MS)
            assert page.inner_text('#groups tr[data-group="late"]').split()[:4] == ["late", "1", "0", "2"]
            assert script_errors == []
        finally:
            browser.close()


def test_over_sqs_a_back_off_policy_delays_a_message_whose_visibility_ends_and_visibility_0_is_at_once(cluster3,
                                                                                                      client):
    q = qname()
    sqs = sqs_client(cluster3.urls[0])
    url = sqs.create_queue(QueueName=q)["QueueUrl"]
    client.patch_queue(q, backoff={"initial_ms": 600_000})
    sqs.send_message(QueueUrl=url, MessageBody="job")
    first = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"][0]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
    again = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1, AttributeNames=["ApproximateReceiveCount"])
    assert again["Messages"][0]["Attributes"]["ApproximateReceiveCount"] == "2"
    time.sleep(1.5)                         # its visibility timeout ended: the policy's 10 minutes
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    delayed = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesDelayed"])
    assert delayed["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "1"

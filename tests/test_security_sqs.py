"""What an attacker found at the SQS door (issue 49), each closed: receipts nobody can guess,
authentication before a body is read, SigV4 as strict as AWS's, limits before the work they
bound, answers every XML parser takes, x-sqs-* headers the SQS door's own, forwarding no
client can starve. One 3-node cluster with SQS keys for the module; each test its own queues."""

import base64
import json
import uuid

import pytest
from botocore.exceptions import ClientError

from tests.sqsutil import DATA, start_sqs_cluster, sqs_client
from tests.wire import call

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_sqs_cluster(tmp_path_factory.mktemp("sqs-security"))
    yield cluster
    cluster.close()


def leader_url(cluster) -> str:
    return cluster.url(cluster.wait_for_leader(30))


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---- receipts ------------------------------------------------------------------------------------

def guessed(receipt: str) -> str:
    """What anyone can write down without receiving: the state machine's receipt is counters
    (queue incarnation, group, seq, a per-queue lease number)."""
    return ":".join(receipt.split(":")[:4])


def in_flight(url: str, queue: str) -> int:
    return call("GET", f"{url}/v1/queues/{queue}").body["stats"]["in_flight"]


def test_a_guessed_or_borrowed_receipt_settles_nothing_on_the_native_api(cluster):
    url, queue, other = leader_url(cluster), fresh("rcpt"), fresh("rcpt-other")
    for name in (queue, other):
        assert call("POST", f"{url}/v1/queues/{name}/messages", {"body": "mine"}).status == 201
    mine = call("POST", f"{url}/v1/queues/{queue}/receive", {}).body["messages"][0]["receipt"]
    borrowed = call("POST", f"{url}/v1/queues/{other}/receive", {}).body["messages"][0]["receipt"]
    tampered = mine[:-1] + ("A" if mine[-1] != "A" else "B")
    for forged in (guessed(mine), tampered, borrowed):
        for op in ("ack", "nack", "extend"):
            reply = call("POST", f"{url}/v1/queues/{queue}/{op}", {"receipts": [forged]})
            assert reply.status == 409 and reply.body["error"] == "stale_receipt", (op, forged, reply)
            assert reply.body["stale"] == [forged]
        assert in_flight(url, queue) == 1
    tx = call("POST", f"{url}/v1/tx", {"ack": [{"queue": queue, "receipts": [guessed(mine)]}]})
    assert tx.status == 409 and tx.body["stale"] == [guessed(mine)], tx
    both = call("POST", f"{url}/v1/queues/{queue}/ack", {"receipts": [guessed(mine), mine]})
    assert both.status == 200 and both.body == {"acked": 1, "stale": [guessed(mine)]}, both
    assert in_flight(url, queue) == 0
    # not a receipt raftq could have issued at all: still the client's mistake
    assert call("POST", f"{url}/v1/queues/{queue}/ack", {"receipts": [mine + "x"]}).status == 400


def test_a_guessed_or_borrowed_receipt_handle_deletes_and_hides_nothing_on_the_sqs_api(cluster):
    url = leader_url(cluster)
    sqs = sqs_client(url, DATA)
    admin = sqs_client(url)
    queue = admin.create_queue(QueueName=fresh("rcpt-sqs"))["QueueUrl"]
    other = admin.create_queue(QueueName=fresh("rcpt-sqs-other"))["QueueUrl"]
    for target in (queue, other):
        sqs.send_message(QueueUrl=target, MessageBody="mine")
    mine = sqs.receive_message(QueueUrl=queue)["Messages"][0]["ReceiptHandle"]
    borrowed = sqs.receive_message(QueueUrl=other)["Messages"][0]["ReceiptHandle"]
    for forged in (guessed(mine), borrowed):
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=forged)    # SQS's rule: a stale handle is no error
        with pytest.raises(ClientError) as refused:
            sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=forged, VisibilityTimeout=0)
        assert refused.value.response["Error"]["Code"].endswith("MessageNotInflight")
        batch = sqs.delete_message_batch(QueueUrl=queue, Entries=[{"Id": "a", "ReceiptHandle": forged}])
        assert batch["Successful"] == [{"Id": "a"}]
        assert sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"][
            "ApproximateNumberOfMessagesNotVisible"] == "1"
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=mine)
    assert sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"][
        "ApproximateNumberOfMessagesNotVisible"] == "0"


def test_a_receipt_works_on_the_next_leader(cluster):
    url, queue = leader_url(cluster), fresh("rcpt-failover")
    call("POST", f"{url}/v1/queues/{queue}/messages", {"messages": [{"body": 1}, {"body": 2}]})
    receipts = [m["receipt"] for m in call("POST", f"{url}/v1/queues/{queue}/receive", {"max": 2}).body["messages"]]
    leader = cluster.wait_for_leader(30)
    target = next(n for n in cluster.ids if n != leader)
    assert call("POST", f"{url}/v1/cluster/leader", {"to": target}).body["moved"]
    assert cluster.wait_for_leader(30) == target
    acked = call("POST", f"{cluster.url(target)}/v1/queues/{queue}/ack", {"receipts": receipts})
    assert acked.status == 200 and acked.body == {"acked": 2, "stale": []}, acked

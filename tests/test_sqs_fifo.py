"""FIFO queues of the SQS API with boto3 against a real 3-node cluster: per
message group, nothing is delivered while an earlier message of the group is
in flight (raftq's ordering keys); deduplication ids within 5 minutes."""

import threading
import time

import pytest
from botocore.exceptions import ClientError

from tests.sqsutil import follower, sqs_client, start_sqs_cluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_sqs_cluster(tmp_path_factory.mktemp("sqs-fifo"))
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def sqs(cluster):
    return sqs_client(cluster.url(cluster.wait_for_leader(30)))


@pytest.fixture(scope="module")
def other(cluster):
    """A second consumer, at a follower."""
    return sqs_client(cluster.url(follower(cluster)))


def fifo(sqs, name: str, **attributes) -> str:
    return sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", **attributes})["QueueUrl"]


def test_a_group_waits_while_its_earlier_message_is_in_flight_other_groups_go_on(sqs, other):
    url = fifo(sqs, "orders.fifo", ContentBasedDeduplication="true")
    for group, body in (("g1", "a1"), ("g1", "a2"), ("g2", "b1"), ("g1", "a3")):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group)
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, MessageSystemAttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in first] == ["a1"]
    assert first[0]["Attributes"]["MessageGroupId"] == "g1"
    # the other consumer gets g2's message, not a2: a1 of g1 is in flight
    got = other.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    assert [m["Body"] for m in got] == ["b1"]
    assert other.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []) == []
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"])
    rest = other.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    assert [m["Body"] for m in rest] == ["a2", "a3"]


def test_two_consumers_see_each_group_in_order(sqs, cluster):
    url = fifo(sqs, "two-consumers.fifo")
    groups = {f"g{i}": [f"g{i}-{n}" for n in range(8)] for i in range(3)}
    for n in range(8):
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": g, "MessageBody": bodies[n], "MessageGroupId": g, "MessageDeduplicationId": bodies[n]}
            for g, bodies in groups.items()])
    seen: dict[str, list] = {g: [] for g in groups}
    in_flight: dict[str, int] = {g: 0 for g in groups}
    overlaps = []
    lock = threading.Lock()

    def consume(client):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(map(len, seen.values())) < 24:
            got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=2, WaitTimeSeconds=1,
                                         MessageSystemAttributeNames=["MessageGroupId"]).get("Messages", [])
            for m in got:
                group = m["Attributes"]["MessageGroupId"]
                with lock:
                    in_flight[group] += 1
                    seen[group].append(m["Body"])
            time.sleep(0.05)      # hold them, so the other consumer tries the same groups meanwhile
            for m in got:
                with lock:
                    group = m["Attributes"]["MessageGroupId"]
                    if in_flight[group] > sum(1 for x in got if x["Attributes"]["MessageGroupId"] == group):
                        overlaps.append(group)      # the other consumer holds one of this group too
                client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
                with lock:
                    in_flight[group] -= 1

    consumers = [threading.Thread(target=consume, args=(c,)) for c in (
        sqs, sqs_client(cluster.url(follower(cluster))))]
    for c in consumers:
        c.start()
    for c in consumers:
        c.join(90)
    assert seen == groups
    assert overlaps == []


def test_deduplication_ids_and_content_based_deduplication(sqs):
    url = fifo(sqs, "dedup.fifo")
    first = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="d1")
    again = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="d1")
    assert (again["MessageId"], again["SequenceNumber"]) == (first["MessageId"], first["SequenceNumber"])
    with pytest.raises(ClientError) as needs_id:
        sqs.send_message(QueueUrl=url, MessageBody="y", MessageGroupId="g")
    assert needs_id.value.response["Error"]["Code"] == "InvalidParameterValue"
    with pytest.raises(ClientError) as needs_group:
        sqs.send_message(QueueUrl=url, MessageBody="y", MessageDeduplicationId="d2")
    assert needs_group.value.response["Error"]["Code"] == "MissingParameter"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"ContentBasedDeduplication": "true"})
    by_content = [sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g") for _ in range(2)]
    assert by_content[0]["MessageId"] == by_content[1]["MessageId"]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                              MessageSystemAttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in got] == ["x", "same"]
    assert got[0]["Attributes"]["MessageDeduplicationId"] == "d1"
    assert got[0]["Attributes"]["SequenceNumber"] == first["SequenceNumber"]
    assert int(got[1]["Attributes"]["SequenceNumber"]) > int(got[0]["Attributes"]["SequenceNumber"])


def test_fifo_queue_attributes_and_refusals(sqs):
    url = fifo(sqs, "attrs.fifo", DeduplicationScope="messageGroup", FifoThroughputLimit="perMessageGroupId")
    shown = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert {k: shown[k] for k in ("FifoQueue", "ContentBasedDeduplication", "DeduplicationScope",
                                  "FifoThroughputLimit")} == {
        "FifoQueue": "true", "ContentBasedDeduplication": "false", "DeduplicationScope": "messageGroup",
        "FifoThroughputLimit": "perMessageGroupId"}
    for name, attributes in (("no-suffix", {"FifoQueue": "true"}), ("suffix.fifo", {}),
                             ("plain", {"ContentBasedDeduplication": "true"})):
        with pytest.raises(ClientError) as refused:
            sqs.create_queue(QueueName=name, Attributes=attributes)
        assert refused.value.response["Error"]["Code"] in ("InvalidParameterValue", "InvalidAttributeName")
    with pytest.raises(ClientError) as per_message_delay:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="d",
                         DelaySeconds=1)
    assert per_message_delay.value.response["Error"]["Code"] == "InvalidParameterValue"
    standard = sqs.create_queue(QueueName="standard-dlq")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=standard, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    with pytest.raises(ClientError) as mixed:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={
            "RedrivePolicy": f'{{"deadLetterTargetArn": "{arn}", "maxReceiveCount": 2}}'})
    assert mixed.value.response["Error"]["Code"] == "InvalidParameterCombination"


def test_a_fifo_dead_letter_keeps_its_group(sqs):
    dlq = fifo(sqs, "fifo-dlq.fifo")
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = fifo(sqs, "fifo-source.fifo", RedrivePolicy=f'{{"deadLetterTargetArn": "{arn}", "maxReceiveCount": 1}}')
    sqs.send_message(QueueUrl=url, MessageBody="poison", MessageGroupId="g", MessageDeduplicationId="p")
    sqs.send_message(QueueUrl=url, MessageBody="next", MessageGroupId="g", MessageDeduplicationId="n")
    handle = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1)["Messages"][0]["ReceiptHandle"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)["Messages"]] == ["next"]
    dead = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=2, MessageSystemAttributeNames=["All"])["Messages"]
    assert [(m["Body"], m["Attributes"]["MessageGroupId"]) for m in dead] == [("poison", "g")]


def test_a_long_poll_does_not_spin_while_its_only_messages_wait_for_their_group(sqs, cluster):
    from tests.wire import call
    url = fifo(sqs, "quiet-poll.fifo", ContentBasedDeduplication="true")
    for body in ("a1", "a2"):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="a")
    held = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=60)["Messages"]
    leader = cluster.url(cluster.wait_for_leader(30))
    before = call("GET", leader + "/health/ready").body["commit_index"]
    started = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)
    assert time.monotonic() - started >= 1.9     # it waited, rather than answering at once
    # the wait wrote its one last receive, not a receive per turn of a loop
    assert call("GET", leader + "/health/ready").body["commit_index"] - before <= 3
    sqs.delete_message(QueueUrl=url, ReceiptHandle=held[0]["ReceiptHandle"])

"""The SQS API on a cluster of four Raft groups (issue 24), with boto3.

Every call is routed to the group of the queue it names, as the native API's
requests are: a node that does not lead that group forwards the signed call to
the one that does (boto3 follows no 307). CreateQueue places a new queue
through the catalog, ListQueues gathers every group, and a redrive policy
whose dead-letter queue lives in another group is refused.
"""

import uuid

import pytest
from botocore.exceptions import ClientError

from tests.conftest import wait_for_settled_leaders
from tests.sqsutil import ACCOUNT, DATA, REGION, sqs_client, start_sqs_cluster
from tests.wire import call

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_sqs_cluster(tmp_path_factory.mktemp("sqs-g4"), groups=4)
    try:
        wait_for_settled_leaders(cluster)
        yield cluster
    finally:
        cluster.close()


def routing(cluster) -> dict:
    return call("GET", cluster.url(cluster.ids[0]) + "/v1/cluster/routing").body


def group_of(cluster, name: str) -> int:
    """The queue's group as group 0's leader confirms it."""
    return call("GET", cluster.url(cluster.ids[0]) + f"/v1/cluster/routing?queue={name}").body["queues"][name]


def arn(name: str) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"


def error_code(exc_info) -> str:
    return exc_info.value.response["Error"]["Code"]


@pytest.fixture(scope="module")
def spread(cluster) -> dict[int, str]:
    """A queue in each of the four groups, each created through a node that does not lead group 0
    (the name is placed on group 0's leader, which may not lead the group it chose)."""
    leaders = {group["id"]: group["leader"] for group in routing(cluster)["groups"]}
    assert len(set(leaders.values())) == 3           # every node leads a group
    creator = sqs_client(cluster.url(next(n for n in cluster.ids if n != leaders[0])))
    placed = {}
    while len(placed) < 4:
        name = "g4-" + uuid.uuid4().hex[:8]
        creator.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "30"})
        placed.setdefault(group_of(cluster, name), name)
    return placed


def test_every_action_on_a_queue_is_served_by_its_groups_leader_whichever_node_takes_it(cluster, spread):
    for group, name in spread.items():
        for node_id in cluster.ids:
            sqs = sqs_client(cluster.url(node_id), DATA)
            url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
            sqs.send_message(QueueUrl=url, MessageBody=f"{name} via {node_id}")
            batch = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "batched"}])
            assert [entry["Id"] for entry in batch["Successful"]] == ["a"], batch
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
            assert sorted(m["Body"] for m in got) == sorted([f"{name} via {node_id}", "batched"])
            sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"], VisibilityTimeout=60)
            deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)])
            assert len(deleted["Successful"]) == 2, deleted
            attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
            assert attributes["ApproximateNumberOfMessages"] == attributes["ApproximateNumberOfMessagesNotVisible"] \
                == "0"
        # stored in its own group, which is where the native API finds it
        shown = call("GET", cluster.url(cluster.ids[0]) + f"/v1/queues/{name}").body
        assert shown["stats"]["depth"] == 0 and shown["config"]["lease_ms"] == 30_000
        assert group_of(cluster, name) == group


def test_list_queues_gathers_every_group_from_any_node(cluster, spread):
    for node_id in cluster.ids:
        sqs = sqs_client(cluster.url(node_id), DATA)
        urls = sqs.list_queues(QueueNamePrefix="g4-")["QueueUrls"]
        names = [url.rsplit("/", 1)[1] for url in urls]
        assert set(spread.values()) <= set(names) and names == sorted(names)
        first = sqs.list_queues(QueueNamePrefix="g4-", MaxResults=2)
        rest = sqs.list_queues(QueueNamePrefix="g4-", MaxResults=1000, NextToken=first["NextToken"])
        assert [u.rsplit("/", 1)[1] for u in first["QueueUrls"] + rest["QueueUrls"]] == names


def test_a_queue_named_nowhere_does_not_exist_on_any_node(cluster):
    for node_id in cluster.ids:
        sqs = sqs_client(cluster.url(node_id), DATA)
        with pytest.raises(ClientError) as refused:
            sqs.get_queue_url(QueueName="never-" + uuid.uuid4().hex[:8])
        assert error_code(refused) == "AWS.SimpleQueueService.NonExistentQueue"


def test_a_refused_call_places_no_name_in_any_group(cluster, spread):
    name = "refused-" + uuid.uuid4().hex[:8]
    sqs = sqs_client(cluster.url(cluster.ids[0]))
    for attributes in ({"VisibilityTimeout": "soon"}, {"Colour": "blue"}):
        with pytest.raises(ClientError) as refused:
            sqs.create_queue(QueueName=name, Attributes=attributes)
        assert error_code(refused) in ("InvalidAttributeValue", "InvalidAttributeName")
    known = sqs.get_queue_url(QueueName=spread[0])["QueueUrl"]
    never_created = known.rsplit("/", 1)[0] + "/" + name
    policy = f'{{"deadLetterTargetArn": "{arn(name + "-dlq")}", "maxReceiveCount": "2"}}'
    with pytest.raises(ClientError) as refused:
        sqs.set_queue_attributes(QueueUrl=never_created, Attributes={"RedrivePolicy": policy})
    assert error_code(refused) == "AWS.SimpleQueueService.NonExistentQueue"
    assert group_of(cluster, name) is None and group_of(cluster, name + "-dlq") is None


def test_a_redrive_policy_across_groups_is_refused_and_changes_nothing(cluster, spread):
    (g1, q1), (g2, q2) = sorted(spread.items())[1:3]
    sqs = sqs_client(cluster.url(cluster.ids[0]))
    policy = f'{{"deadLetterTargetArn": "{arn(q2)}", "maxReceiveCount": "2"}}'
    q1_url = sqs.get_queue_url(QueueName=q1)["QueueUrl"]
    with pytest.raises(ClientError) as refused:
        sqs.set_queue_attributes(QueueUrl=q1_url, Attributes={"RedrivePolicy": policy, "DelaySeconds": "5"})
    assert error_code(refused) == "InvalidParameterValue"
    message = refused.value.response["Error"]["Message"]
    assert "RedrivePolicy" in message and "Raft groups" in message and q2 in message
    attributes = sqs.get_queue_attributes(QueueUrl=q1_url, AttributeNames=["All"])["Attributes"]
    assert "RedrivePolicy" not in attributes and attributes["DelaySeconds"] == "0"
    with pytest.raises(ClientError) as refused:     # the same queue, created again with that policy
        sqs.create_queue(QueueName=q1, Attributes={"VisibilityTimeout": "30", "RedrivePolicy": policy})
    assert error_code(refused) == "InvalidParameterValue"
    assert group_of(cluster, q1) == g1 and group_of(cluster, q2) == g2


def test_a_new_queue_joins_its_dead_letter_queues_group_and_its_dead_letters_go_there(cluster, spread):
    group, dlq = max(spread.items())       # group 3: no queue of it is in group 0
    sqs = sqs_client(cluster.url(cluster.ids[0]))
    name = "g4-sourced-" + uuid.uuid4().hex[:8]
    policy = f'{{"deadLetterTargetArn": "{arn(dlq)}", "maxReceiveCount": "1"}}'
    url = sqs.create_queue(QueueName=name, Attributes={"RedrivePolicy": policy})["QueueUrl"]
    assert group_of(cluster, name) == group
    dlq_url = sqs.get_queue_url(QueueName=dlq)["QueueUrl"]
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == [url]
    sqs.send_message(QueueUrl=url, MessageBody="dies")
    [first] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1, VisibilityTimeout=0)["Messages"]
    assert first["Body"] == "dies"
    # its second receive dead-letters it
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    [dead] = sqs.receive_message(QueueUrl=dlq_url, WaitTimeSeconds=1, VisibilityTimeout=0)["Messages"]
    assert dead["Body"] == "dies"
    handle = sqs.start_message_move_task(SourceArn=arn(dlq))["TaskHandle"]
    [task] = sqs.list_message_move_tasks(SourceArn=arn(dlq))["Results"]
    assert task["Status"] == "COMPLETED" and task["ApproximateNumberOfMessagesMoved"] == 1
    with pytest.raises(ClientError) as refused:
        sqs.cancel_message_move_task(TaskHandle=handle)
    assert error_code(refused) == "ResourceNotFoundException"
    [back] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    assert back["Body"] == "dies"

"""The SQS API with boto3 (AWS JSON 1.0 protocol) against a real 3-node cluster.

Every call is signed by boto3 with SigV4 and checked by the node; the
follower tests send to a follower, which forwards to the leader.
"""

import hashlib
import json
import time

import pytest
from botocore.exceptions import ClientError

from tests.sqsutil import ACCOUNT, DATA, follower, md5_of_attributes, sqs_client, start_sqs_cluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_sqs_cluster(tmp_path_factory.mktemp("sqs"))
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def sqs(cluster):
    return sqs_client(cluster.url(cluster.wait_for_leader(30)))


@pytest.fixture(scope="module")
def via_follower(cluster):
    return sqs_client(cluster.url(follower(cluster)))


def error_code(exc_info) -> str:
    return exc_info.value.response["Error"]["Code"]


def test_create_send_receive_delete_round_trip(sqs):
    url = sqs.create_queue(QueueName="round-trip")["QueueUrl"]
    assert url.endswith(f"/{ACCOUNT}/round-trip")
    sent = sqs.send_message(QueueUrl=url, MessageBody="hello ✓")
    assert sent["MD5OfMessageBody"] == hashlib.md5("hello ✓".encode()).hexdigest()
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                              MessageSystemAttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in got] == ["hello ✓"]
    assert got[0]["MessageId"] == sent["MessageId"]
    assert got[0]["Attributes"]["ApproximateReceiveCount"] == "1"
    assert got[0]["Attributes"]["SenderId"] == "AKIATESTADMIN0000001"
    assert abs(int(got[0]["Attributes"]["SentTimestamp"]) - time.time() * 1000) < 120_000
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)    # as AWS: no empty list
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "0"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_message_attributes_of_every_type_and_their_md5(sqs):
    url = sqs.create_queue(QueueName="attributes")["QueueUrl"]
    message_attributes = {
        "text": {"DataType": "String", "StringValue": "värde"},
        "count": {"DataType": "Number", "StringValue": "42.5"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
        "labelled": {"DataType": "String.custom", "StringValue": "x"},
    }
    # the Java and Go SDKs check MD5OfMessageAttributes (boto3 does not): computed here apart
    sent = sqs.send_message(QueueUrl=url, MessageBody="m", MessageAttributes=message_attributes)
    assert sent["MD5OfMessageAttributes"] == md5_of_attributes(
        {name: (v["DataType"], v.get("StringValue", v.get("BinaryValue"))) for name, v in message_attributes.items()})
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"], WaitTimeSeconds=1)["Messages"][0]
    assert got["MessageAttributes"] == message_attributes
    assert got["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]


def test_only_the_message_attributes_asked_for_come_back(sqs):
    url = sqs.create_queue(QueueName="attribute-names")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m", MessageAttributes={
        "a.one": {"DataType": "String", "StringValue": "1"}, "b": {"DataType": "String", "StringValue": "2"}})
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["a.*"], WaitTimeSeconds=1)["Messages"][0]
    assert set(got["MessageAttributes"]) == {"a.one"}


def test_create_queue_is_idempotent_with_equal_attributes_and_refuses_others(sqs):
    url = sqs.create_queue(QueueName="idem", Attributes={"VisibilityTimeout": "45"})["QueueUrl"]
    assert sqs.create_queue(QueueName="idem", Attributes={"VisibilityTimeout": "45"})["QueueUrl"] == url
    assert sqs.create_queue(QueueName="idem")["QueueUrl"] == url
    with pytest.raises(sqs.exceptions.QueueNameExists) as refused:
        sqs.create_queue(QueueName="idem", Attributes={"VisibilityTimeout": "46"})
    assert error_code(refused) == "QueueAlreadyExists"
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"] == {
        "VisibilityTimeout": "45"}


def test_get_queue_url_and_a_missing_queue(sqs):
    url = sqs.create_queue(QueueName="findme")["QueueUrl"]
    assert sqs.get_queue_url(QueueName="findme")["QueueUrl"] == url
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as missing:
        sqs.get_queue_url(QueueName="no-such-queue")
    assert error_code(missing) == "AWS.SimpleQueueService.NonExistentQueue"
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=url.replace("findme", "no-such-queue"), MessageBody="x")
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=url.replace(ACCOUNT, "999999999999"), MessageBody="x")
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):     # a name, which AWS takes there too
        sqs.send_message(QueueUrl="not-a-queue-url", MessageBody="x")
    with pytest.raises(sqs.exceptions.InvalidAddress) as invalid:
        sqs.send_message(QueueUrl=url + "/more/path", MessageBody="x")
    assert invalid.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_list_queues_by_prefix_and_in_pages(sqs):
    for i in range(5):
        sqs.create_queue(QueueName=f"paged-{i}")
    assert [u.rsplit("/", 1)[1] for u in sqs.list_queues(QueueNamePrefix="paged-")["QueueUrls"]] == [
        f"paged-{i}" for i in range(5)]
    seen, token = [], None
    while True:
        page = sqs.list_queues(QueueNamePrefix="paged-", MaxResults=2, **({"NextToken": token} if token else {}))
        seen += page["QueueUrls"]
        token = page.get("NextToken")
        if not token:
            break
    assert [u.rsplit("/", 1)[1] for u in seen] == [f"paged-{i}" for i in range(5)]
    paginated = [u for p in sqs.get_paginator("list_queues").paginate(QueueNamePrefix="paged-",
                                                                          PaginationConfig={"PageSize": 3})
                 for u in p["QueueUrls"]]
    assert paginated == seen


def test_delete_queue(sqs):
    url = sqs.create_queue(QueueName="doomed")["QueueUrl"]
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName="doomed")
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.delete_queue(QueueUrl=url)


def test_send_batch_with_a_bad_entry_stores_the_rest(sqs):
    url = sqs.create_queue(QueueName="batch")["QueueUrl"]
    reply = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "one"},
        {"Id": "b", "MessageBody": "bad \x01 char"},
        {"Id": "c", "MessageBody": "three", "DelaySeconds": 0}])
    assert [e["Id"] for e in reply["Successful"]] == ["a", "c"]
    assert [(e["Id"], e["Code"], e["SenderFault"]) for e in reply["Failed"]] == [
        ("b", "InvalidMessageContents", True)]
    bodies = sorted(m["Body"] for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                                           WaitTimeSeconds=1)["Messages"])
    assert bodies == ["one", "three"]


@pytest.mark.parametrize("entries, code", [
    ([], "AWS.SimpleQueueService.EmptyBatchRequest"),
    ([{"Id": str(i), "MessageBody": "x"} for i in range(11)], "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
    ([{"Id": "same", "MessageBody": "x"}, {"Id": "same", "MessageBody": "y"}],
     "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
    ([{"Id": "no spaces", "MessageBody": "x"}], "AWS.SimpleQueueService.InvalidBatchEntryId"),
])
def test_malformed_batches_are_refused_whole(sqs, entries, code):
    url = sqs.create_queue(QueueName="bad-batches")["QueueUrl"]
    with pytest.raises(ClientError) as refused:
        sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert error_code(refused) == code
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])[
        "Attributes"]["ApproximateNumberOfMessages"] == "0"


def test_a_batch_longer_than_1_mib_with_its_attributes_is_refused_whole(sqs):
    url = sqs.create_queue(QueueName="long-batch")["QueueUrl"]
    blob = {"blob": {"DataType": "Binary", "BinaryValue": b"x" * 100_000}}
    with pytest.raises(sqs.exceptions.BatchRequestTooLong):
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "MessageBody": "y" * 20_000, "MessageAttributes": blob} for i in range(10)])
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])[
        "Attributes"]["ApproximateNumberOfMessages"] == "0"


def test_delete_and_change_visibility_in_batches(sqs):
    url = sqs.create_queue(QueueName="settle-batch")["QueueUrl"]
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(4)])
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=4, WaitTimeSeconds=1, VisibilityTimeout=60)["Messages"]
    assert len(got) == 4
    handles = [m["ReceiptHandle"] for m in got]
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": "d0", "ReceiptHandle": handles[0]}, {"Id": "bad", "ReceiptHandle": "not-a-handle"}])
    assert [e["Id"] for e in deleted["Successful"]] == ["d0"]
    assert [(e["Id"], e["Code"]) for e in deleted["Failed"]] == [("bad", "ReceiptHandleIsInvalid")]
    changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "now", "ReceiptHandle": handles[1], "VisibilityTimeout": 0},
        {"Id": "later", "ReceiptHandle": handles[2], "VisibilityTimeout": 120},
        {"Id": "gone", "ReceiptHandle": handles[0], "VisibilityTimeout": 5}])
    assert sorted(e["Id"] for e in changed["Successful"]) == ["later", "now"]
    # the message of a deleted receipt is gone: AWS's words for it
    assert [(e["Id"], e["Code"], e["Message"]) for e in changed["Failed"]] == [
        ("gone", "InvalidParameterValue", f"Value {handles[0]} for parameter ReceiptHandle is invalid. Reason: Message "
                                          "does not exist or is not available for visibility timeout change.")]
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    assert [m["Body"] for m in again] == [got[1]["Body"]]


def test_visibility_timeout_expires_and_change_message_visibility_extends_it(sqs):
    url = sqs.create_queue(QueueName="visibility", Attributes={"VisibilityTimeout": "1"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="a")
    first = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1, MessageSystemAttributeNames=["All"])["Messages"][0]
    assert sqs.receive_message(QueueUrl=url).get("Messages", []) == []
    again = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, MessageSystemAttributeNames=["All"])["Messages"][0]
    assert again["MessageId"] == first["MessageId"]
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"
    first_receive = first["Attributes"]["ApproximateFirstReceiveTimestamp"]
    assert again["Attributes"]["ApproximateFirstReceiveTimestamp"] == first_receive
    assert int(first["Attributes"]["SentTimestamp"]) <= int(first_receive)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"], VisibilityTimeout=30)
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2).get("Messages", []) == []
    # an ended lease's receipt changes nothing and is not an error, as AWS answers it on a standard queue
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages", []) == []
    # a receipt whose lease has ended deletes nothing, and is not an error (SQS's rule)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])[
        "Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "1"
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.delete_message(QueueUrl=url, ReceiptHandle="forged")


def test_a_long_poll_is_woken_by_a_send(sqs, cluster):
    import threading
    url = sqs.create_queue(QueueName="long-poll")["QueueUrl"]
    sender = sqs_client(cluster.url(follower(cluster)), DATA)
    timer = threading.Timer(1.0, lambda: sender.send_message(QueueUrl=url, MessageBody="wake"))
    started = time.monotonic()
    timer.start()
    try:
        got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=20)["Messages"]
    finally:
        timer.join()
    assert [m["Body"] for m in got] == ["wake"]
    assert time.monotonic() - started < 19


def test_delay_seconds_per_queue_and_per_message(sqs):
    url = sqs.create_queue(QueueName="delayed", Attributes={"DelaySeconds": "2"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="queue-delay")
    sqs.send_message(QueueUrl=url, MessageBody="no-delay", DelaySeconds=0)
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]] == ["no-delay"]
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesDelayed"])[
        "Attributes"]["ApproximateNumberOfMessagesDelayed"] == "1"
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10)["Messages"]] == ["queue-delay"]


def test_queue_attributes_set_and_read_back(sqs):
    url = sqs.create_queue(QueueName="configured")["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={
        "VisibilityTimeout": "90", "MessageRetentionPeriod": "3600", "MaximumMessageSize": "2048",
        "ReceiveMessageWaitTimeSeconds": "3", "DelaySeconds": "1"})
    shown = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert {k: shown[k] for k in ("VisibilityTimeout", "MessageRetentionPeriod", "MaximumMessageSize",
                                  "ReceiveMessageWaitTimeSeconds", "DelaySeconds")} == {
        "VisibilityTimeout": "90", "MessageRetentionPeriod": "3600", "MaximumMessageSize": "2048",
        "ReceiveMessageWaitTimeSeconds": "3", "DelaySeconds": "1"}
    assert shown["QueueArn"] == f"arn:aws:sqs:us-east-1:{ACCOUNT}:configured"
    assert int(shown["LastModifiedTimestamp"]) >= int(shown["CreatedTimestamp"]) > 1_600_000_000
    with pytest.raises(sqs.exceptions.InvalidParameterValue if hasattr(sqs.exceptions, "InvalidParameterValue")
                       else ClientError) as too_long:
        sqs.send_message(QueueUrl=url, MessageBody="x" * 2049)
    assert error_code(too_long) == "InvalidParameterValue"
    with pytest.raises(ClientError) as bad:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "43201"})
    assert error_code(bad) == "InvalidAttributeValue"
    with pytest.raises(ClientError) as unknown:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"NoSuchAttribute": "1"})
    assert error_code(unknown) == "InvalidAttributeName"


def test_purge_queue_removes_every_message(sqs):
    url = sqs.create_queue(QueueName="purged")["QueueUrl"]
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(5)])
    sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    sqs.purge_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.PurgeQueueInProgress):     # one purge a minute, as AWS
        sqs.purge_queue(QueueUrl=url)
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attributes["ApproximateNumberOfMessages"], attributes["ApproximateNumberOfMessagesNotVisible"]) == ("0", "0")
    sqs.send_message(QueueUrl=url, MessageBody="after")
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]] == ["after"]


def test_every_action_works_through_a_follower(via_follower, sqs):
    url = via_follower.create_queue(QueueName="via-follower")["QueueUrl"]
    via_follower.send_message(QueueUrl=url, MessageBody="forwarded")
    got = via_follower.receive_message(QueueUrl=url, WaitTimeSeconds=2)["Messages"]
    assert [m["Body"] for m in got] == ["forwarded"]
    via_follower.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages",
                                                                  "ApproximateNumberOfMessagesNotVisible"])[
        "Attributes"] == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}
    with pytest.raises(via_follower.exceptions.QueueDoesNotExist):
        via_follower.get_queue_url(QueueName="nowhere")


def test_a_data_key_cannot_change_queues(cluster, sqs):
    data = sqs_client(cluster.url(cluster.wait_for_leader(30)), DATA)
    url = sqs.create_queue(QueueName="data-role")["QueueUrl"]
    for call in (lambda: data.create_queue(QueueName="by-data"), lambda: data.delete_queue(QueueUrl=url),
                 lambda: data.purge_queue(QueueUrl=url),
                 lambda: data.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "1"})):
        with pytest.raises(ClientError) as denied:
            call()
        assert error_code(denied) == "AccessDenied"
    data.send_message(QueueUrl=url, MessageBody="data may send")
    assert data.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"][0]["Body"] == "data may send"


def test_tags_on_a_queue(sqs):
    url = sqs.create_queue(QueueName="tagged", tags={"team": "red"})["QueueUrl"]
    sqs.tag_queue(QueueUrl=url, Tags={"env": "prod", "team": "blue"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "blue", "env": "prod"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "prod"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["env"])
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)


def test_redrive_policy_dead_letters_and_a_move_task_brings_them_back(sqs):
    dlq = sqs.create_queue(QueueName="dead-letters")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})
    source = sqs.create_queue(QueueName="dies-twice", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    shown = json.loads(sqs.get_queue_attributes(QueueUrl=source, AttributeNames=["RedrivePolicy"])[
        "Attributes"]["RedrivePolicy"])
    assert shown == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [source]
    sent = sqs.send_message(QueueUrl=source, MessageBody="poison")
    for _ in range(2):
        handle = sqs.receive_message(QueueUrl=source, WaitTimeSeconds=2)["Messages"][0]["ReceiptHandle"]
        sqs.change_message_visibility(QueueUrl=source, ReceiptHandle=handle, VisibilityTimeout=0)
    dead = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=5, VisibilityTimeout=1)["Messages"]
    assert [(m["Body"], m["MessageId"]) for m in dead] == [("poison", sent["MessageId"])]
    assert sqs.receive_message(QueueUrl=source).get("Messages", []) == []
    time.sleep(1.5)   # the dead letter's lease in the dead-letter queue ends: a move skips leased ones
    with pytest.raises(ClientError) as not_a_dlq:
        sqs.start_message_move_task(SourceArn=dlq_arn.replace("dead-letters", "dies-twice"))
    assert error_code(not_a_dlq) == "InvalidParameterValue"
    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    tasks = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert [(t["Status"], t["ApproximateNumberOfMessagesMoved"]) for t in tasks] == [("COMPLETED", 1)]
    back = sqs.receive_message(QueueUrl=source, WaitTimeSeconds=2)["Messages"]
    assert [(m["Body"], m["MessageId"]) for m in back] == [("poison", sent["MessageId"])]
    with pytest.raises(sqs.exceptions.ResourceNotFoundException):
        sqs.cancel_message_move_task(TaskHandle=handle)
    sqs.set_queue_attributes(QueueUrl=source, Attributes={"RedrivePolicy": ""})
    assert "RedrivePolicy" not in sqs.get_queue_attributes(QueueUrl=source, AttributeNames=["All"])["Attributes"]


def test_a_redrive_policy_needs_an_existing_dead_letter_queue_that_allows_it(sqs):
    missing = json.dumps({"deadLetterTargetArn": f"arn:aws:sqs:us-east-1:{ACCOUNT}:nowhere", "maxReceiveCount": 3})
    with pytest.raises(ClientError) as refused:
        sqs.create_queue(QueueName="orphan-source", Attributes={"RedrivePolicy": missing})
    assert error_code(refused) == "InvalidParameterValue"
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName="orphan-source")
    closed = sqs.create_queue(QueueName="closed-dlq", Attributes={
        "RedriveAllowPolicy": json.dumps({"redrivePermission": "denyAll"})})["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=closed, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    with pytest.raises(ClientError) as denied:
        sqs.create_queue(QueueName="denied-source", Attributes={
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 3})})
    assert error_code(denied) == "InvalidParameterValue"


def test_permissions_are_refused_honestly(sqs):
    url = sqs.create_queue(QueueName="no-policies")["QueueUrl"]
    with pytest.raises(sqs.exceptions.UnsupportedOperation):
        sqs.add_permission(QueueUrl=url, Label="l", AWSAccountIds=[ACCOUNT], Actions=["SendMessage"])
    with pytest.raises(ClientError) as no_label:     # a queue of raftq holds no permission labels
        sqs.remove_permission(QueueUrl=url, Label="l")
    assert error_code(no_label) == "InvalidParameterValue"



def test_a_message_of_1_mib_goes_through_and_one_byte_more_is_refused(sqs, via_follower):
    url = sqs.create_queue(QueueName="one-mib")["QueueUrl"]
    body = "z" * (1 << 20)
    via_follower.send_message(QueueUrl=url, MessageBody=body)
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)["Messages"]
    assert got[0]["Body"] == body and got[0]["MD5OfBody"] == hashlib.md5(body.encode()).hexdigest()
    with pytest.raises(ClientError) as too_long:
        sqs.send_message(QueueUrl=url, MessageBody=body + "z")
    assert error_code(too_long) == "InvalidParameterValue"

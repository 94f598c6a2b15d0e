"""The SQS API's query protocol (form-encoded Action=..., XML replies) and the
AWS CLI, against a real 3-node cluster.

The query calls are signed by botocore's SigV4 signer and built as AWS
documents the protocol (``Attribute.N.Name``, ``MessageAttribute.N.Value.*``,
batch entries); replies are parsed as XML.
"""

import base64
import hashlib
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.sqsutil import ACCOUNT, ADMIN, DATA, REGION, follower, md5_of_attributes, signed, start_sqs_cluster
from tests.wire import call

pytestmark = pytest.mark.timeout(300)
NS = {"q": "http://queue.amazonaws.com/doc/2012-11-05/"}
FORM = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_sqs_cluster(tmp_path_factory.mktemp("sqs-query"))
    yield cluster
    cluster.close()


def query(url: str, action: str, path: str = "/", **params) -> tuple[int, ET.Element]:
    body = urlencode({"Action": action, "Version": "2012-11-05", **params}).encode()
    reply = call("POST", url + path, raw=body, headers=signed(url + path, body, dict(FORM)))
    assert reply.headers["Content-Type"].startswith("text/xml"), reply
    return reply.status, ET.fromstring(reply.raw)


def ok(url: str, action: str, path: str = "/", **params) -> ET.Element:
    status, root = query(url, action, path, **params)
    assert status == 200, ET.tostring(root)
    assert root.tag == f"{{{NS['q']}}}{action}Response"
    assert root.find("q:ResponseMetadata/q:RequestId", NS).text
    return root


def texts(root: ET.Element, path: str) -> list:
    return [e.text for e in root.findall(path, NS)]


def test_the_query_protocol_serves_queues_and_messages(cluster):
    url = cluster.url(cluster.wait_for_leader(30))
    created = ok(url, "CreateQueue", QueueName="xml-queue", **{
        "Attribute.1.Name": "VisibilityTimeout", "Attribute.1.Value": "40",
        "Attribute.2.Name": "DelaySeconds", "Attribute.2.Value": "0",
        "Tag.1.Key": "team", "Tag.1.Value": "blue"})
    queue = created.find("q:CreateQueueResult/q:QueueUrl", NS).text
    assert queue == f"{url}/{ACCOUNT}/xml-queue"
    assert texts(ok(url, "ListQueues", QueueNamePrefix="xml-"), "q:ListQueuesResult/q:QueueUrl") == [queue]
    tags = ok(url, "ListQueueTags", QueueUrl=queue)
    assert [(t.find("q:Key", NS).text, t.find("q:Value", NS).text)
            for t in tags.findall("q:ListQueueTagsResult/q:Tag", NS)] == [("team", "blue")]

    blob = b"\x00raw\xff"
    sent = ok(url, "SendMessage", QueueUrl=queue, MessageBody="<hello & welcome>", **{
        "MessageAttribute.1.Name": "kind", "MessageAttribute.1.Value.DataType": "String",
        "MessageAttribute.1.Value.StringValue": "greeting",
        "MessageAttribute.2.Name": "raw", "MessageAttribute.2.Value.DataType": "Binary",
        "MessageAttribute.2.Value.BinaryValue": base64.b64encode(blob).decode()})
    result = sent.find("q:SendMessageResult", NS)
    assert result.find("q:MD5OfMessageBody", NS).text == hashlib.md5(b"<hello & welcome>").hexdigest()
    expected_md5 = md5_of_attributes({"kind": ("String", "greeting"), "raw": ("Binary", blob)})
    assert result.find("q:MD5OfMessageAttributes", NS).text == expected_md5

    got = ok(url, "ReceiveMessage", QueueUrl=queue, WaitTimeSeconds="1", MaxNumberOfMessages="5",
             **{"AttributeName.1": "All", "MessageAttributeName.1": "All"})
    messages = got.findall("q:ReceiveMessageResult/q:Message", NS)
    assert len(messages) == 1
    message = messages[0]
    assert message.find("q:Body", NS).text == "<hello & welcome>"
    assert message.find("q:MessageId", NS).text == result.find("q:MessageId", NS).text
    assert message.find("q:MD5OfMessageAttributes", NS).text == expected_md5
    system = {a.find("q:Name", NS).text: a.find("q:Value", NS).text for a in message.findall("q:Attribute", NS)}
    assert system["ApproximateReceiveCount"] == "1" and system["SenderId"] == ADMIN.access_key
    attributes = {a.find("q:Name", NS).text: a.find("q:Value", NS) for a in message.findall("q:MessageAttribute", NS)}
    assert attributes["kind"].find("q:StringValue", NS).text == "greeting"
    assert base64.b64decode(attributes["raw"].find("q:BinaryValue", NS).text) == blob

    empty = ok(url, "ReceiveMessage", QueueUrl=queue)
    assert empty.find("q:ReceiveMessageResult", NS) is not None
    assert empty.findall("q:ReceiveMessageResult/q:Message", NS) == []
    batch = ok(url, "DeleteMessageBatch", QueueUrl=queue, **{
        "DeleteMessageBatchRequestEntry.1.Id": "m1",
        "DeleteMessageBatchRequestEntry.1.ReceiptHandle": message.find("q:ReceiptHandle", NS).text})
    assert texts(batch, "q:DeleteMessageBatchResult/q:DeleteMessageBatchResultEntry/q:Id") == ["m1"]

    shown = ok(url, "GetQueueAttributes", QueueUrl=queue, **{"AttributeName.1": "All"})
    values = {a.find("q:Name", NS).text: a.find("q:Value", NS).text
              for a in shown.findall("q:GetQueueAttributesResult/q:Attribute", NS)}
    assert values["VisibilityTimeout"] == "40" and values["ApproximateNumberOfMessages"] == "0"
    assert values["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_the_query_protocol_at_the_queue_url_and_through_a_follower(cluster):
    leader_url = cluster.url(cluster.wait_for_leader(30))
    ok(leader_url, "CreateQueue", QueueName="xml-path")
    url = cluster.url(follower(cluster))
    path = f"/{ACCOUNT}/xml-path"
    entries = {}
    for i in (1, 2):
        entries[f"SendMessageBatchRequestEntry.{i}.Id"] = f"e{i}"
        entries[f"SendMessageBatchRequestEntry.{i}.MessageBody"] = f"body {i}"
    sent = ok(url, "SendMessageBatch", path, **entries)
    assert texts(sent, "q:SendMessageBatchResult/q:SendMessageBatchResultEntry/q:Id") == ["e1", "e2"]
    got = ok(url, "ReceiveMessage", path, MaxNumberOfMessages="10", WaitTimeSeconds="1")
    assert sorted(texts(got, "q:ReceiveMessageResult/q:Message/q:Body")) == ["body 1", "body 2"]


def test_query_protocol_errors_are_xml_with_the_query_codes(cluster):
    url = cluster.url(cluster.wait_for_leader(30))
    status, root = query(url, "GetQueueUrl", QueueName="no-such-xml-queue")
    assert status == 400
    assert root.find("q:Error/q:Code", NS).text == "AWS.SimpleQueueService.NonExistentQueue"
    assert root.find("q:Error/q:Type", NS).text == "Sender"
    assert root.find("q:RequestId", NS).text
    status, root = query(url, "NoSuchAction")
    assert (status, root.find("q:Error/q:Code", NS).text) == (400, "InvalidAction")


def aws(url: str, *args: str, service: str = "sqs", key=ADMIN) -> dict:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": key.access_key, "AWS_SECRET_ACCESS_KEY": key.secret_key,
           "AWS_DEFAULT_REGION": REGION, "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
    done = subprocess.run([str(Path(sys.executable).parent / "aws"), service, *args, "--endpoint-url", url,
                           "--output", "json"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else {}


def test_sts_get_caller_identity_names_the_keys_account_through_the_cli_and_a_follower(cluster):
    """The AWS CLI, Terraform and SDK helpers ask STS who they are first: each key answers with
    the cluster's account, itself as the user id and an IAM user ARN; STS's other actions are not
    served, and a wrong secret is refused as on SQS."""
    url = cluster.url(follower(cluster))
    for key in (ADMIN, DATA):
        assert aws(url, "get-caller-identity", service="sts", key=key) == {
            "UserId": key.access_key, "Account": ACCOUNT, "Arn": f"arn:aws:iam::{ACCOUNT}:user/{key.access_key}"}
    body = urlencode({"Action": "AssumeRole", "Version": "2011-06-15", "RoleArn": "arn:aws:iam::1:role/x",
                      "RoleSessionName": "s"}).encode()
    refused = call("POST", url + "/", raw=body, headers=signed(url + "/", body, dict(FORM), service="sts"))
    assert refused.status == 400 and b"<Code>InvalidAction</Code>" in refused.raw, refused
    body = urlencode({"Action": "GetCallerIdentity", "Version": "2011-06-15"}).encode()
    forged = call("POST", url + "/", raw=body, headers=signed(url + "/", body, dict(FORM), service="sts",
                                                               secret="not-the-secret-of-the-key-0123"))
    assert forged.status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in forged.raw, forged


def test_the_aws_cli_through_a_follower(cluster):
    url = cluster.url(follower(cluster))
    queue = aws(url, "create-queue", "--queue-name", "from-cli")["QueueUrl"]
    aws(url, "send-message", "--queue-url", queue, "--message-body", "via the CLI",
        "--message-attributes", '{"n": {"DataType": "Number", "StringValue": "7"}}')
    got = aws(url, "receive-message", "--queue-url", queue, "--wait-time-seconds", "2",
              "--message-attribute-names", "All")["Messages"]
    assert [m["Body"] for m in got] == ["via the CLI"]
    assert got[0]["MessageAttributes"]["n"]["StringValue"] == "7"
    aws(url, "delete-message", "--queue-url", queue, "--receipt-handle", got[0]["ReceiptHandle"])
    assert aws(url, "get-queue-attributes", "--queue-url", queue, "--attribute-names",
               "ApproximateNumberOfMessages")["Attributes"] == {"ApproximateNumberOfMessages": "0"}


def test_the_query_protocol_as_a_get_with_its_signed_query_string(cluster):
    url = cluster.url(cluster.wait_for_leader(30))
    ok(url, "CreateQueue", QueueName="xml-get")
    target = f"{url}/?" + urlencode({"Action": "GetQueueUrl", "QueueName": "xml-get", "Version": "2012-11-05"})
    reply = call("GET", target, headers=signed(target, b"", {}, method="GET"))
    assert reply.status == 200, reply
    root = ET.fromstring(reply.raw)
    assert root.find("q:GetQueueUrlResult/q:QueueUrl", NS).text == f"{url}/{ACCOUNT}/xml-get"
    tampered = target.replace("xml-get", "xml-got")
    reply = call("GET", tampered, headers=signed(target, b"", {}, method="GET"))
    assert reply.status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in reply.raw, reply
    # a queue's URL fetched with no action: AWS's answer, whole
    queue = f"{url}/{ACCOUNT}/xml-get"
    reply = call("GET", queue, headers=signed(queue, b"", {}, method="GET"))
    assert reply.status == 404 and b"<UnknownOperationException/>" in reply.raw, reply
    # the actions that are not on a queue are not taken at its URL
    status, root = query(url, "ListQueues", path=f"/{ACCOUNT}/xml-get")
    assert status == 400 and root.find("q:Error/q:Code", NS).text == "InvalidAction"
    assert root.find("q:Error/q:Message", NS).text == "The action ListQueues is not valid for this endpoint."

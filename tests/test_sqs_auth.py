"""SigV4 on the SQS endpoint, and bad calls: every refusal is SQS's error in
the caller's protocol, never a 500, and changes nothing."""

import datetime
import json

import pytest
from botocore.exceptions import ClientError

from raftq.engine.config import SqsKey
from tests.sqsutil import ADMIN, follower, json_headers, signed, sqs_client, start_sqs_cluster
from tests.wire import call

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_sqs_cluster(tmp_path_factory.mktemp("sqs-auth"))
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def url(cluster):
    return cluster.url(cluster.wait_for_leader(30))


def sqs_call(url: str, action: str, params: dict, **sign) -> tuple[int, dict, object]:
    body = json.dumps(params).encode()
    reply = call("POST", url + "/", raw=body, headers=signed(url + "/", body, json_headers(action), **sign))
    return reply.status, reply.headers, json.loads(reply.raw)


# the JSON types AWS gives the errors common to its query-era APIs (its coral exceptions)
CORAL_TYPES = {"InvalidAction": "UnknownOperationException", "AccessDenied": "AccessDeniedException",
               "InvalidParameterValue": "InvalidParameterValueException",
               "MissingParameter": "MissingRequiredParameterException"}


def refused(status: int, headers, body, code: str, query_code: str | None = None):
    assert status < 500, (status, body)
    assert body["__type"].rsplit("#", 1)[-1] == CORAL_TYPES.get(code, code), body
    assert body["message"]
    assert headers["x-amzn-query-error"].split(";")[0] == (query_code or code)


def queue_depth(sqs, url: str) -> str:
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])[
        "Attributes"]["ApproximateNumberOfMessages"]


def test_an_unsigned_call_or_a_bearer_token_is_refused(url):
    body = b"{}"
    for authorization, code in ((None, "MissingAuthenticationToken"), ("Bearer abc", "IncompleteSignature")):
        headers = json_headers("ListQueues")
        headers["Authorization"] = authorization or ""
        reply = call("POST", url + "/", raw=body, headers=headers)
        refused(reply.status, reply.headers, json.loads(reply.raw), code)
        assert reply.status in (400, 403)


def test_an_unknown_access_key_is_invalid_client_token_id(url):
    stranger = SqsKey("AKIANOBODY0000000001", "whatever-secret-0123456789", "admin")
    status, headers, body = sqs_call(url, "ListQueues", {}, key=stranger)
    assert status == 403
    refused(status, headers, body, "InvalidClientTokenId")


def test_a_wrong_secret_is_signature_does_not_match_and_sends_nothing(url):
    sqs = sqs_client(url)
    queue = sqs.create_queue(QueueName="auth-target")["QueueUrl"]
    forger = sqs_client(url, secret="not-the-secret-at-all-0000", attempts=1)
    with pytest.raises(ClientError) as denied:
        forger.send_message(QueueUrl=queue, MessageBody="forged")
    assert denied.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert queue_depth(sqs, queue) == "0"


def test_a_body_changed_after_signing_is_refused(url):
    sqs = sqs_client(url)
    queue = sqs.create_queue(QueueName="auth-tamper")["QueueUrl"]
    body = json.dumps({"QueueUrl": queue, "MessageBody": "signed"}).encode()
    headers = signed(url + "/", body, json_headers("SendMessage"))
    tampered = body.replace(b"signed", b"forged")
    reply = call("POST", url + "/", raw=tampered, headers=headers)
    refused(reply.status, reply.headers, json.loads(reply.raw), "SignatureDoesNotMatch")
    assert queue_depth(sqs, queue) == "0"


def test_a_call_signed_more_than_15_minutes_ago_is_refused(url, monkeypatch):
    import botocore.auth
    sqs = sqs_client(url)
    queue = sqs.create_queue(QueueName="auth-expired")["QueueUrl"]
    # a client whose clock is 20 minutes slow (or a call captured and replayed later)
    slow = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) - datetime.timedelta(minutes=20)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: slow)
    status, headers, body = sqs_call(url, "SendMessage", {"QueueUrl": queue, "MessageBody": "late"})
    refused(status, headers, body, "RequestExpired")
    monkeypatch.undo()
    assert queue_depth(sqs, queue) == "0"


def test_unknown_actions_and_malformed_bodies_are_sqs_errors(url):
    status, headers, body = sqs_call(url, "LaunchRockets", {})
    refused(status, headers, body, "InvalidAction")
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        reply = call("POST", url + "/", raw=raw, headers=signed(url + "/", raw, json_headers("ListQueues")))
        refused(reply.status, reply.headers, json.loads(reply.raw), "SerializationException")
    status, headers, body = sqs_call(url, "SendMessage", {"QueueUrl": 7, "MessageBody": ["x"]})
    refused(status, headers, body, "InvalidParameterValue")
    sqs_call(url, "CreateQueue", {"QueueName": "refusals"})
    status, headers, body = sqs_call(url, "ReceiveMessage", {"QueueUrl": f"{url}/123456789012/refusals",
                                                             "MaxNumberOfMessages": 11})
    refused(status, headers, body, "InvalidParameterValue")
    status, headers, body = sqs_call(url, "CreateQueue", {})
    refused(status, headers, body, "MissingParameter")
    status, headers, body = sqs_call(url, "CreateQueue", {"QueueName": "bad name!"})
    refused(status, headers, body, "InvalidParameterValue")
    # a query-protocol call with a broken form
    for raw in (b"Action=ListQueues&no-value", b"Action=ListQueues&QueueNamePrefix=\xff",
                b"Action=ListQueues&Attribute.x.Name=a"):
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        reply = call("POST", url + "/", raw=raw, headers=signed(url + "/", raw, headers))
        assert reply.status == 400 and b"<Code>MalformedQueryString</Code>" in reply.raw, reply


def test_a_follower_checks_the_signature_too(cluster):
    forger = sqs_client(cluster.url(follower(cluster)), secret="not-the-secret-at-all-0000", attempts=1)
    with pytest.raises(ClientError) as denied:
        forger.list_queues()
    assert denied.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_without_keys_every_sqs_call_is_refused(tmp_path):
    cluster = start_sqs_cluster(tmp_path, nodes=1, keys=())
    try:
        url = cluster.url("n1")
        for action in ("ListQueues", "CreateQueue"):
            status, headers, body = sqs_call(url, action, {"QueueName": "q"})
            assert status == 403
            refused(status, headers, body, "AccessDenied")
        assert call("GET", url + "/v1/queues").body["queues"] == []
    finally:
        cluster.close()


def test_the_native_api_still_wants_its_bearer_token(url):
    signed_headers = signed(url + "/v1/queues", b"", {}, method="GET")
    assert call("GET", url + "/v1/queues", headers=signed_headers).status == 401
    assert ADMIN.access_key not in call("GET", url + "/v1/queues").raw.decode()

"""What an attacker found at the SQS door (issue 49), each closed: receipts nobody can guess,
authentication before a body is read, SigV4 as strict as AWS's, limits before the work they
bound, answers every XML parser takes, x-sqs-* headers the SQS door's own, forwarding no
client can starve. One 3-node cluster with SQS keys for the module; each test its own queues."""

import base64
import datetime
import hashlib
import json
import socket
import uuid
from urllib.parse import urlsplit

import pytest
from botocore.exceptions import ClientError

from raftq.engine.config import SqsKey
from tests.sqsutil import ACCOUNT, ADMIN, DATA, JSON_TYPE, json_headers, signed, start_sqs_cluster, sqs_client
from tests.wire import call

pytestmark = pytest.mark.timeout(300)


LONG_POLL_CAP = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_sqs_cluster(tmp_path_factory.mktemp("sqs-security"),
                                node_args=("--max-long-polls-per-client", str(LONG_POLL_CAP)))
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
        # as AWS answers a deleted message's handle: nothing tells a forged handle from a stale one
        assert refused.value.response["Error"]["Code"] == "InvalidParameterValue"
        assert "Message does not exist or is not available" in refused.value.response["Error"]["Message"]
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


# ---- authentication before the body --------------------------------------------------------------

FULL_BODY = (4 << 20) - 1       # what the attacker declared, sending none of it


def headers_only(url: str, headers: dict, declared: int = FULL_BODY, sent: bytes = b"") -> bytes:
    """The status line of the answer to a POST that declares `declared` bytes of body and sends
    only `sent` of them, keeping the connection open: a node that reads the body first answers
    only when --body-timeout-s (30 s) runs out, after this socket's 10."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    with socket.create_connection((host, port), timeout=10) as sock:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() not in ("content-length", "host"))
        sock.sendall(f"POST / HTTP/1.1\r\nHost: {host}:{port}\r\n{head}Content-Length: {declared}\r\n\r\n".encode() + sent)
        return sock.recv(65536).split(b"\r\n", 1)[0]


def signed_headers(url: str, action: str = "ListQueues", key=ADMIN, **sign) -> dict:
    """A real signature's headers, for a body that is never sent whole."""
    return signed(url + "/", b"{}", json_headers(action), key, **sign)


def test_a_call_that_fails_its_headers_is_refused_before_its_body_is_read(cluster, monkeypatch):
    import botocore.auth
    url = leader_url(cluster)
    stranger = SqsKey("AKIANOBODY0000000001", "whatever-secret-0123456789", "admin")
    assert headers_only(url, json_headers("ListQueues")).startswith(b"HTTP/1.1 403")        # no signature
    assert headers_only(url, signed_headers(url, key=stranger)).startswith(b"HTTP/1.1 403")   # unknown key
    old = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) - datetime.timedelta(minutes=20)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: old)
    assert headers_only(url, signed_headers(url)).startswith(b"HTTP/1.1 400")                 # expired
    monkeypatch.undo()
    # a call that signs its payload's hash is checked whole before the body: a wrong secret
    body_hash = hashlib.sha256(b"x" * FULL_BODY).hexdigest()
    headers = signed(url + "/", b"{}", {**json_headers("ListQueues"), "X-Amz-Content-SHA256": body_hash},
                     secret="not-the-secret-at-all-0000")
    assert headers_only(url, headers).startswith(b"HTTP/1.1 403")


def test_a_body_cut_short_logs_no_traceback(cluster):
    url = leader_url(cluster)
    node = cluster.wait_for_leader(30)
    before = cluster.log_path(node).read_text().count("Traceback")
    for headers in (signed_headers(url), json_headers("ListQueues"),
                    {"Authorization": f"Bearer {cluster.token}", "Content-Type": "application/json"}):
        host, port = urlsplit(url).hostname, urlsplit(url).port
        path = "/" if "X-Amz-Target" in headers else "/v1/queues/cut-short/messages"
        with socket.create_connection((host, port), timeout=10) as sock:
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() != "host")
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{head}Content-Length: 100000\r\n\r\n".encode() + b"{" * 5000)
    # the node is still there, and what it logged since holds no traceback
    assert sqs_client(url).list_queues() is not None
    assert cluster.log_path(node).read_text().count("Traceback") == before


# ---- SigV4 as strict as AWS's ----------------------------------------------------------------------

def test_the_action_the_host_and_a_date_ahead_must_be_signed_as_aws_wants(cluster, monkeypatch):
    import botocore.auth
    url = leader_url(cluster)
    admin = sqs_client(url)
    queue = admin.create_queue(QueueName=fresh("sig"))["QueueUrl"]
    admin.send_message(QueueUrl=queue, MessageBody="keep me")
    body = json.dumps({"QueueUrl": queue}).encode()
    # signed without X-Amz-Target, which a man in the middle then sets to PurgeQueue
    headers = signed(url + "/", body, {"Content-Type": JSON_TYPE})
    headers["X-Amz-Target"] = "AmazonSQS.PurgeQueue"
    reply = call("POST", url + "/", raw=body, headers=headers)
    assert reply.status == 400 and json.loads(reply.raw)["__type"].endswith("IncompleteSignature"), reply
    # signed for a host that is not the cluster's
    port = urlsplit(url).port
    headers = signed(f"http://sqs.elsewhere.example:{port}/", body, json_headers("PurgeQueue"))
    reply = call("POST", url + "/", raw=body, headers=headers)
    assert reply.status == 403 and json.loads(reply.raw)["__type"].endswith("SignatureDoesNotMatch"), reply
    # dated 10 minutes ahead of the node's clock
    ahead = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) + datetime.timedelta(minutes=10)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: ahead)
    reply = call("POST", url + "/", raw=body, headers=signed(url + "/", body, json_headers("PurgeQueue")))
    monkeypatch.undo()
    assert reply.status == 403 and json.loads(reply.raw)["message"].startswith("Signature not yet current"), reply
    assert admin.get_queue_attributes(QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages"])[
        "Attributes"]["ApproximateNumberOfMessages"] == "1"
    # the same names as the node's own: localhost for 127.0.0.1, and a minute ahead of its clock
    monkeypatch.setattr(botocore.auth, "get_current_datetime",
                        lambda: datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
                        + datetime.timedelta(minutes=1))
    assert sqs_client(f"http://localhost:{port}").list_queues()["ResponseMetadata"]["HTTPStatusCode"] == 200


# ---- limits before the work they bound -----------------------------------------------------------

def parse_cost(body: bytes, headers: dict) -> tuple[str, int]:
    """The SqsError code protocol.parse answers a call with, and the most memory it held doing so."""
    import tracemalloc

    from aiohttp.test_utils import make_mocked_request

    from raftq.api.sqs.errors import SqsError
    from raftq.api.sqs.protocol import parse

    request = make_mocked_request("POST", "/", headers=headers)
    tracemalloc.start()
    try:
        parse(request, body, "request-id")
        code = "none"
    except SqsError as exc:
        code = exc.code
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return code, peak


def test_a_call_of_a_million_fields_or_values_is_refused_before_they_are_parsed():
    # what 1.39 M fields cost a node before (6.9-14.3 s with its loop blocked): each field a tuple
    # of two strings, some 200 MB
    form = b"Action=ListQueues" + b"&a=" * 1_390_000
    code, peak = parse_cost(form, {"Content-Type": "application/x-www-form-urlencoded"})
    assert code == "MalformedQueryString" and peak < len(form) * 3, peak
    values = b"{" + b'"a":[' + b"0," * 2_000_000 + b"0]}"
    code, peak = parse_cost(values, {"X-Amz-Target": "AmazonSQS.ListQueues"})
    assert code == "SerializationException" and peak < len(values), peak
    # a name of a million parts
    code, peak = parse_cost(b"Action=ListQueues&" + b"a." * 1_000_000 + b"a=1",
                            {"Content-Type": "application/x-www-form-urlencoded"})
    assert code == "MalformedQueryString" and peak < 8 << 20, peak


# ---- x-sqs-* headers, XML answers, every byte counted ----------------------------------------

def test_x_sqs_headers_are_the_sqs_doors_own(cluster):
    url, queue = leader_url(cluster), fresh("xsqs")
    for name in ("x-sqs-message-attributes", "X-SQS-Sender-Id", "x-sqs-message-id"):
        poison = {"body": "hi", "headers": {name: "{"}}
        reply = call("POST", f"{url}/v1/queues/{queue}/messages", poison)
        assert reply.status == 400 and "x-sqs-" in reply.body["message"], reply
        reply = call("POST", f"{url}/v1/tx", {"put": [{"queue": queue, "messages": [poison]}]})
        assert reply.status == 400, reply
    assert call("POST", f"{url}/v1/queues/{queue}/messages", {"body": "hi", "headers": {"sqs-like": "{"}}).status == 201
    sqs = sqs_client(url, DATA)
    got = sqs.receive_message(QueueUrl=f"{url}/{ACCOUNT}/{queue}", MessageAttributeNames=["All"],
                              MessageSystemAttributeNames=["All"])["Messages"]
    assert got[0]["Body"] == "hi" and "SenderId" not in got[0]["Attributes"] and "MessageAttributes" not in got[0]


def test_what_an_older_release_stored_never_fails_a_receive():
    """A message a native client put with x-sqs-* headers of its own before they were refused:
    its receive has taken the lease and counted the delivery, so rendering it must not fail."""
    import xml.etree.ElementTree as ET

    from raftq.api.sqs.message_actions import rendered
    from raftq.api.sqs.query import render

    poisoned = [{"x-sqs-message-attributes": "{"}, {"x-sqs-message-attributes": "[1]"},
                {"x-sqs-message-attributes": '{"a": {"DataType": "Binary", "BinaryValue": "not base64!"}}'},
                {"x-sqs-message-attributes": '{"a": {"DataType": "String", "StringValue": "bell\\u0007"}}'},
                {"x-sqs-aws-trace-header": "nul\x00", "x-sqs-sender-id": "\x07", "x-sqs-message-group-id": "\x01"}]
    for headers in poisoned:
        message = {"seq": 1, "receipt": "1:default:1:1:AAAAAAAAAAAAAAAAAAAAAA", "body": "bell\u0007nul\u0000",
                   "headers": headers, "deliveries": 1, "put_at_ms": 1, "first_received_at_ms": 1,
                   "ordering_key": None}
        out = rendered("q", message, {"All"}, ["All"], "1", {1: 1})
        assert base64.b64decode(out["Body"]) == "bell\u0007nul\u0000".encode()
        assert "MessageAttributes" not in out
        ET.fromstring(render("ReceiveMessage", {"Messages": [out]}, "request-id"))


def test_a_body_xml_cannot_hold_is_delivered_in_base64_and_every_answer_parses(cluster):
    import xml.etree.ElementTree as ET
    from urllib.parse import urlencode

    url, queue = leader_url(cluster), fresh("xml")
    assert call("POST", f"{url}/v1/queues/{queue}/messages", {"body": "bell\u0007nul\u0000"}).status == 201
    body = urlencode({"Action": "ReceiveMessage", "Version": "2012-11-05", "QueueUrl": f"{url}/{ACCOUNT}/{queue}",
                      "AttributeName.1": "All", "MessageAttributeName.1": "All"}).encode()
    form = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
    reply = call("POST", url + "/", raw=body, headers=signed(url + "/", body, form))
    root = ET.fromstring(reply.raw)
    (text,) = [e.text for e in root.iter() if e.tag.endswith("}Body")]
    assert base64.b64decode(text) == "bell\u0007nul\u0000".encode()
    # an echoed parameter name XML cannot hold
    body = b"Action=ListQueues&Version=2012-11-05&Attribute.%07.Name=a"
    reply = call("POST", url + "/", raw=body, headers=signed(url + "/", body, form))
    assert reply.status == 400 and ET.fromstring(reply.raw) is not None


def test_the_trace_header_is_xml_text_and_counts_toward_every_size_limit(cluster):
    url = leader_url(cluster)
    admin = sqs_client(url)
    small = admin.create_queue(QueueName=fresh("trace"), Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]
    big = admin.create_queue(QueueName=fresh("trace-big"))["QueueUrl"]

    def trace(value: str) -> dict:
        return {"AWSTraceHeader": {"DataType": "String", "StringValue": value}}
    with pytest.raises(ClientError) as refused:
        admin.send_message(QueueUrl=big, MessageBody="x", MessageSystemAttributes=trace("Root=1\u0007"))
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(ClientError) as refused:
        admin.send_message(QueueUrl=small, MessageBody="x", MessageSystemAttributes=trace("R" * 900_000))
    assert refused.value.response["Error"]["Code"] == "InvalidParameterValue"
    with pytest.raises(ClientError) as refused:
        admin.send_message_batch(QueueUrl=big, Entries=[
            {"Id": str(i), "MessageBody": "x", "MessageSystemAttributes": trace("R" * 380_000)} for i in range(10)])
    assert refused.value.response["Error"]["Code"].endswith("BatchRequestTooLong")
    for queue in (small, big):
        assert admin.get_queue_attributes(QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages"])[
            "Attributes"]["ApproximateNumberOfMessages"] == "0"
    admin.send_message(QueueUrl=small, MessageBody="x", MessageSystemAttributes=trace("Root=1-5759e988-bd862e3fe"))


# ---- forwarding no client can starve ---------------------------------------------------------------

def waiting_on(url: str) -> int:
    """The node's receives waiting for a message (its metrics)."""
    text = call("GET", f"{url}/metrics").raw.decode()
    return sum(int(float(line.split()[-1])) for line in text.splitlines()
               if line.startswith("raftq_long_polls_waiting"))


async def open_call(address: str, url: str, raw: bytes, headers: dict):
    """A call from `address` (a loopback address of its own: a client of its own to the node) to
    `url`, sent now and answered later: (reader, writer)."""
    import asyncio
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port, local_addr=(address, 0))
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() not in ("host", "content-length"))
    writer.write(f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n{head}"
                 f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n".encode() + raw)
    await writer.drain()
    return reader, writer


def test_long_polls_through_a_follower_starve_no_other_call_and_count_by_their_client(cluster):
    import asyncio

    from tests.waiting import wait_until

    leader = cluster.wait_for_leader(30)
    leader_url_, follower_url = cluster.url(leader), cluster.url(next(n for n in cluster.ids if n != leader))
    admin = sqs_client(leader_url_)
    polled = admin.create_queue(QueueName=fresh("polled"))["QueueUrl"]
    other = admin.create_queue(QueueName=fresh("busy"))["QueueUrl"]
    native = fresh("polled-native")
    assert call("PUT", f"{leader_url_}/v1/queues/{native}", {}).status in (200, 201)

    def receive(address: str):
        raw = json.dumps({"QueueUrl": polled, "WaitTimeSeconds": 20}).encode()
        return open_call(address, follower_url + "/", raw, signed(follower_url + "/", raw,
                                                                   json_headers("ReceiveMessage"), DATA))

    def native_receive(address: str):
        raw = json.dumps({"wait_ms": 20_000}).encode()
        return open_call(address, f"{follower_url}/v1/queues/{native}/receive", raw, {
            "Authorization": f"Bearer {cluster.token}", "Content-Type": "application/json", "X-Raftq-Forward": "1"})

    async def scenario():
        # more clients than aiohttp's one pool of 100 held connections, each with one long poll, and
        # one client with as many as it may have waiting (the nodes' --max-long-polls-per-client)
        polls = [await receive(f"127.0.0.{10 + i}") for i in range(110)]
        polls += [await native_receive(f"127.0.1.{10 + i}") for i in range(5)]
        polls += [await receive("127.0.2.1") for _ in range(LONG_POLL_CAP)]
        await asyncio.to_thread(wait_until, lambda: waiting_on(leader_url_) >= len(polls), 60,
                                "every long poll to wait on the leader")
        # its next one is refused at once, by the follower (the leader would count it as its)
        reader, writer = await receive("127.0.2.1")
        status = (await asyncio.wait_for(reader.readline(), 10)).decode()
        writer.close()
        # the others' calls through the same follower go on meanwhile
        sent = await asyncio.to_thread(sqs_client(follower_url, DATA).send_message, QueueUrl=other, MessageBody="hi")
        put = await asyncio.to_thread(call, "POST", f"{follower_url}/v1/queues/{fresh('busy-native')}/messages",
                                      {"body": "hi"}, headers={"X-Raftq-Forward": "1"})
        still_waiting = waiting_on(leader_url_)
        # every long poll ends with a message each (a put of n wakes n of them)
        admin_native = {"messages": [{"body": i} for i in range(5)]}
        call("POST", f"{leader_url_}/v1/queues/{native}/messages", admin_native)
        for start in range(0, 110 + LONG_POLL_CAP, 10):
            admin.send_message_batch(QueueUrl=polled, Entries=[{"Id": str(i), "MessageBody": "wake"}
                                                               for i in range(min(10, 110 + LONG_POLL_CAP - start))])
        answers = []
        for reader, writer in polls:
            answers.append((await asyncio.wait_for(reader.read(), 30)).split(b"\r\n", 1)[0])
            writer.close()
        return status, sent, put, still_waiting, answers

    status, sent, put, still_waiting, answers = asyncio.run(scenario())
    assert " 403 " in status or " 429 " in status, status
    assert sent["MessageId"] and put.status == 201, put
    assert still_waiting >= 110 + 5 + LONG_POLL_CAP
    assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers), answers

"""Differential testing of the SQS API: raftq beside moto's server, the same calls to both.

moto (``moto[server]``) is a maintained SQS emulator checked against AWS. A
``Reference`` pairs a raftq node and a moto server started on 127.0.0.1, sends
each call to both (signed as an SDK signs it, in the JSON 1.0 or the query
protocol), and compares the two answers once each is put in a form that
leaves out what is each server's own (its address, receipt handles, message
ids, request ids, the time): the HTTP status, the error's code, JSON type,
fault and message, and the result's members and values.

Where moto departs from what AWS documents or answers, AWS wins: each
``MotoDeviation`` turns moto's answer into AWS's, with the reference it
rests on. Where raftq departs from AWS on purpose, each ``Deliberate``
difference (the list of docs/sqs.md, "Where raftq differs from AWS") turns
the expected answer into raftq's chosen one. Any other difference counts.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlencode

from tests.sqsutil import ACCOUNT, ADMIN, json_headers, signed
from tests.wire import call

FORM = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
QUERY_NS = "{http://queue.amazonaws.com/doc/2012-11-05/}"


# ---- moto's server, a real process -------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class MotoServer:
    """``python -m moto.server`` on 127.0.0.1, stopped by its PID."""

    def __init__(self, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # AWS refuses a second PurgeQueue within 60 s; moto does when told to
        env = {**os.environ, "MOTO_SQS_ENFORCE_STRICT_QUEUE_PURGE_BEHAVIOUR": "true"}
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                         str(self.port)], stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto's server did not start (see {log_path})") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self._log.close()


# ---- one call, in either protocol -----------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    action: str
    params: dict          # the JSON protocol's input; "@queue:<name>" stands for the queue's URL on each server
    protocol: str = "json"
    path: str = "/"       # "@queue:<name>" posts to the queue's URL (the query protocol names the queue so)
    aws: dict | None = None   # AWS's answer (normalized), for an action moto does not serve



@dataclass
class Answer:
    status: int
    error: dict | None    # code, type (JSON only), fault, message
    result: object        # the JSON result, or the query protocol's XML as nested lists


def _query_fields(prefix: str, value, out: list) -> None:
    """The query protocol's flattened names for a JSON-shaped input member."""
    maps = {"Attributes": ("Attribute", "Name", "Value"), "Tags": ("Tag", "Key", "Value"),
            "tags": ("Tag", "Key", "Value"), "MessageAttributes": ("MessageAttribute", "Name", "Value"),
            "MessageSystemAttributes": ("MessageSystemAttribute", "Name", "Value")}
    # AWS's model names MessageSystemAttributeNames AttributeName on the query protocol's wire
    lists = {"AttributeNames": "AttributeName", "MessageAttributeNames": "MessageAttributeName",
             "MessageSystemAttributeNames": "AttributeName", "TagKeys": "TagKey",
             "AWSAccountIds": "AWSAccountId", "Actions": "ActionName"}
    name = prefix.rsplit(".", 1)[-1]
    head = prefix[: len(prefix) - len(name)]
    if isinstance(value, dict) and name in maps:
        flat, key_name, value_name = maps[name]
        for i, (k, v) in enumerate(value.items(), 1):
            out.append((f"{head}{flat}.{i}.{key_name}", k))
            _query_fields(f"{head}{flat}.{i}.{value_name}", v, out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _query_fields(f"{prefix}.{k}", v, out)
    elif isinstance(value, list) and name in lists:
        for i, v in enumerate(value, 1):
            out.append((f"{head}{lists[name]}.{i}", v))
    elif isinstance(value, list):
        for i, v in enumerate(value, 1):
            _query_fields(f"{prefix}.{i}", v, out)
    elif isinstance(value, bool):
        out.append((prefix, "true" if value else "false"))
    else:
        out.append((prefix, str(value)))


ENTRY_ELEMENTS = {"SendMessageBatch": "SendMessageBatchRequestEntry",
                  "DeleteMessageBatch": "DeleteMessageBatchRequestEntry",
                  "ChangeMessageVisibilityBatch": "ChangeMessageVisibilityBatchRequestEntry"}


def query_form(action: str, params: dict) -> list:
    fields = [("Action", action), ("Version", "2012-11-05")]
    if "MessageSystemAttributeNames" in params and "AttributeNames" in params:    # one list on the wire
        params = {**params, "AttributeNames": params["AttributeNames"] + params["MessageSystemAttributeNames"]}
        del params["MessageSystemAttributeNames"]
    for name, value in params.items():
        if name == "Entries" and isinstance(value, list):
            for i, entry in enumerate(value, 1):
                for k, v in entry.items():
                    _query_fields(f"{ENTRY_ELEMENTS[action]}.{i}.{k}", v, fields)
        else:
            _query_fields(name, value, fields)
    return fields


def _xml_tree(element: ET.Element):
    tag = element.tag.removeprefix(QUERY_NS)
    children = list(element)
    if not children:
        return [tag, element.text or ""]
    return [tag, [_xml_tree(child) for child in children]]


def send(base: str, request: Call, key=ADMIN) -> Answer:
    """One signed call to the server at `base`; its answer as sent."""
    url = base + request.path
    if request.protocol == "json":
        body = json.dumps(request.params).encode()
        reply = call("POST", url, raw=body, headers=signed(url, body, json_headers(request.action), key=key))
        try:
            payload = json.loads(reply.raw) if reply.raw else {}
        except ValueError:     # not an SQS answer at all (moto's 500 page)
            return Answer(reply.status, {"code": None, "type": None, "fault": None, "message": None}, None)
        if reply.status == 200:
            return Answer(200, None, payload)
        query_error = reply.headers.get("x-amzn-query-error", "")
        code, _, fault = query_error.partition(";")
        return Answer(reply.status, {"code": code or None, "type": payload.get("__type"), "fault": fault or None,
                                     "message": payload.get("message", payload.get("Message"))}, None)
    body = urlencode(query_form(request.action, request.params)).encode()
    reply = call("POST", url, raw=body, headers=signed(url, body, dict(FORM), key=key))
    try:
        root = ET.fromstring(reply.raw)
    except ET.ParseError:
        return Answer(reply.status, {"code": None, "type": None, "fault": None, "message": None}, None)
    if reply.status == 200:
        return Answer(200, None, _xml_tree(root))
    error = root.find(f"{QUERY_NS}Error")
    found = {child.tag.removeprefix(QUERY_NS): child.text for child in error}
    return Answer(reply.status, {"code": found.get("Code"), "type": None, "fault": found.get("Type"),
                                 "message": found.get("Message")}, None)


# ---- what is each server's own -------------------------------------------------------------------

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# members whose value each server makes up on its own; compared by their form only
OWN = {"ReceiptHandle": "<receipt handle>", "TaskHandle": "<task handle>", "NextToken": "<next token>",
       "SenderId": "<sender id>", "RequestId": "<request id>"}
SECONDS = {"CreatedTimestamp", "LastModifiedTimestamp"}
MILLISECONDS = {"SentTimestamp", "ApproximateFirstReceiveTimestamp", "StartedTimestamp"}
JSON_TEXT = {"Policy", "RedrivePolicy", "RedriveAllowPolicy"}
# what comes in no documented order: the query protocol's maps, and queue lists
UNORDERED = {"Attribute", "MessageAttribute", "Tag", "QueueUrl"}
UNORDERED_LISTS = {"QueueUrls", "queueUrls"}
CLOSE_S = 120


def _value(name: str | None, value, base: str):
    if isinstance(value, str):
        value = value.replace(base, "<endpoint>")
        if name in OWN:
            return OWN[name]
        if name == "MessageId" and UUID.fullmatch(value):
            return "<message id>"
        if name == "SequenceNumber" and re.fullmatch(r"\d{20}", value):
            return "<sequence number>"
        if name in SECONDS and value.isdigit() and abs(int(value) - time.time()) < CLOSE_S:
            return "<now, s>"
        if name in MILLISECONDS and value.isdigit() and abs(int(value) / 1000 - time.time()) < CLOSE_S:
            return "<now, ms>"
        if name in JSON_TEXT:
            try:
                return json.dumps(json.loads(value), sort_keys=True, separators=(",", ":"))
            except ValueError:
                return value
        return value
    if name in MILLISECONDS and isinstance(value, int) and abs(value / 1000 - time.time()) < CLOSE_S:
        return "<now, ms>"
    return value


def _normal_json(value, base: str, name: str | None = None):
    if isinstance(value, dict):
        if "Name" in value and "Value" in value and len(value) == 2:    # one entry of a query map
            return {"Name": value["Name"], "Value": _value(value["Name"], value["Value"], base)}
        return {k: _normal_json(v, base, k) for k, v in value.items()}
    if isinstance(value, list):
        items = [_normal_json(v, base, name) for v in value]
        return sorted(items, key=repr) if name in UNORDERED_LISTS else items
    return _value(name, value, base)


def _normal_xml(node, base: str, name: str | None = None):
    tag, content = node
    if isinstance(content, str):
        return [tag, _value(tag, content, base)]
    children = [_normal_xml(child, base) for child in content if child[0] != "ResponseMetadata"]
    if tag in ("Attribute",) and len(children) == 2 and children[0][0] == "Name":
        children[1] = [children[1][0], _value(children[0][1], children[1][1], base)]
    ordered = [c for c in children if c[0] not in UNORDERED]
    loose = sorted((c for c in children if c[0] in UNORDERED), key=repr)
    return [tag, ordered + loose]


def normal(answer: Answer, base: str) -> dict:
    """An answer with what is each server's own replaced by its form."""
    if answer.error is not None:
        return {"status": answer.status, "error": dict(answer.error)}
    if isinstance(answer.result, list):
        return {"status": answer.status, "result": _normal_xml(answer.result, base)}
    return {"status": answer.status, "result": _normal_json(answer.result, base)}


# ---- where moto departs from AWS, and where raftq does on purpose ------------------------------------

@dataclass(frozen=True)
class MotoDeviation:
    """moto answers `call` otherwise than AWS: ``fix(call, answer, issued)`` returns AWS's answer
    (normalized), or None when the deviation does not apply; `issued`: the receipt symbols of the
    call that named handles moto had given. ``slips``: moto changes its queue although it refuses
    the call (so what follows on that queue is not AWS's either)."""
    name: str
    aws_reference: str
    fix: Callable[[Call, dict, set], dict | None]
    slips: Callable[[Call], bool] | None = None


@dataclass(frozen=True)
class Deliberate:
    """raftq answers otherwise than AWS on purpose (docs/sqs.md): ``answer`` returns raftq's
    chosen answer (normalized) given AWS's, or None when the difference does not apply."""
    name: str
    answer: Callable[[Call, dict], dict | None]


def _gone(request: Call, expected: dict, issued: set) -> dict:
    return {"status": 400, "error": {
        "code": "AWS.SimpleQueueService.NonExistentQueue",
        "type": "com.amazonaws.sqs#QueueDoesNotExist" if request.protocol == "json" else None, "fault": "Sender",
        "message": "The specified queue does not exist." if request.protocol == "json" else
                   "The specified queue does not exist for this wsdl version."}}


UNSERVED = MotoDeviation("moto-serves-no-move-tasks", "AWS's answers to the message move tasks as LocalStack's "
                         "AWS-validated tests recorded them (tests/aws/services/sqs/test_sqs_move_task.snapshot.json), "
                         "written into the script's calls", lambda request, expected, issued: request.aws)
GONE = MotoDeviation("answers-for-a-deleted-queue", "API reference, DeleteQueue: the queue is deleted; moto answers "
                     "an empty ChangeMessageVisibilityBatch without looking the queue up", _gone)


@dataclass
class Tally:
    compared: int = 0
    same: int = 0
    moto_deviations: dict = field(default_factory=dict)    # name -> count
    deliberate: dict = field(default_factory=dict)         # name -> count
    differ: list = field(default_factory=list)             # (call, raftq's, expected)

    def line(self) -> str:
        return (f"SQS differential: {self.compared} calls compared with moto; {len(self.differ)} differ outside "
                f"the written list; deliberate differences {sum(self.deliberate.values())} "
                f"({', '.join(f'{k}: {v}' for k, v in sorted(self.deliberate.items())) or 'none'}); "
                f"moto's deviations from AWS corrected {sum(self.moto_deviations.values())} "
                f"({', '.join(f'{k}: {v}' for k, v in sorted(self.moto_deviations.items())) or 'none'})")


def binary(data: bytes) -> str:
    """A BinaryValue as both protocols carry it."""
    return base64.b64encode(data).decode()


class Reference:
    """A raftq node and moto's server, the same calls to both. ``resolve`` turns the symbols of
    a call ("@queue:<name>", "@receipt:<name>", "@task") into each server's own values."""

    def __init__(self, raftq_url: str, moto_url: str, deviations: list, deliberate: list):
        self.servers = {"raftq": raftq_url, "moto": moto_url}
        self.deviations = deviations
        self.deliberate = deliberate
        self.tally = Tally()
        self.receipts: dict = {"raftq": {}, "moto": {}}    # queue -> the receipt handles received, newest last
        self.issued: dict = {"raftq": set(), "moto": set()}   # the call's receipt symbols that named a handle
        self.tasks: dict = {"raftq": None, "moto": None}
        self.diverged: set = set()    # queues whose state a deliberate difference made differ
        self.deleted: set = set()     # queues AWS would have deleted (moto may answer for them anyway)

    def resolve(self, server: str, value):
        base = self.servers[server]
        if isinstance(value, str) and value.startswith("@queue:"):
            return f"{base}/{ACCOUNT}/{value[len('@queue:'):]}"
        if isinstance(value, str) and value.startswith("@receipt:"):
            queue, _, which = value[len("@receipt:"):].partition("#")
            handles = self.receipts[server].get(queue, [])
            which = int(which or -1)
            if -len(handles) <= which < len(handles):
                self.issued[server].add(value)
                return handles[which]
            return f"AQEB-never-issued-{queue}-{which}"
        if value == "@task":
            return self.tasks[server] or "never-issued"
        if isinstance(value, dict):
            return {k: self.resolve(server, v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(server, v) for v in value]
        return value

    def _note(self, server: str, request: Call, answer: Answer) -> None:
        """Remember the receipt handles and task handles each server gave."""
        if answer.status != 200:
            return
        queue = _queue_named(request)
        if request.action == "ReceiveMessage" and queue:
            handles = _found(answer.result, "ReceiptHandle")
            if handles:
                self.receipts[server][queue] = handles
        if request.action == "StartMessageMoveTask":
            self.tasks[server] = (_found(answer.result, "TaskHandle") or [None])[0]

    def both(self, request: Call) -> tuple[Answer, Answer]:
        self.issued = {"raftq": set(), "moto": set()}
        answers = []
        for server in ("raftq", "moto"):
            concrete = Call(request.action, self.resolve(server, request.params), request.protocol,
                            self.resolve(server, request.path).removeprefix(self.servers[server]))
            answer = send(self.servers[server], concrete)
            self._note(server, request, answer)
            answers.append(answer)
        return answers[0], answers[1]

    def compare(self, request: Call) -> bool:
        """Send `request` to both; True when raftq answered as AWS would (or as docs/sqs.md says it
        deliberately does). A queue whose state one server changed and the other did not (AWS's
        answer refused what moto did, or raftq refused on purpose) is left out of what follows."""
        raftq, moto = self.both(request)
        queue = _queue_named(request)
        if queue in self.diverged and request.aws is None:
            return True
        got = _page_open(request, self._without_diverged(request, normal(raftq, self.servers["raftq"])))
        moto_said = expected = _page_open(request, self._without_diverged(request, normal(moto, self.servers["moto"])))
        self.tally.compared += 1
        if request.aws is not None:
            self.tally.moto_deviations[UNSERVED.name] = self.tally.moto_deviations.get(UNSERVED.name, 0) + 1
            expected = UNSERVED.fix(request, expected, set())
        for deviation in self.deviations:
            fixed = deviation.fix(request, expected, self.issued["moto"])
            if fixed is not None and fixed != expected:
                self.tally.moto_deviations[deviation.name] = self.tally.moto_deviations.get(deviation.name, 0) + 1
                expected = fixed
            if deviation.slips is not None and deviation.slips(request) and queue:
                self.diverged.add(queue)
        if queue in self.deleted and expected["status"] == 200 and request.action != "CreateQueue":
            self.tally.moto_deviations[GONE.name] = self.tally.moto_deviations.get(GONE.name, 0) + 1
            expected = GONE.fix(request, expected, set())
        self._note_lifetime(request, queue, expected)
        if (moto_said["status"] == 200) != (expected["status"] == 200) and queue:
            self.diverged.add(queue)
        if matches(got, expected):
            self.tally.same += 1
            return True
        for rule in self.deliberate:
            chosen = rule.answer(request, expected)
            if chosen is not None and matches(got, chosen):
                self.tally.deliberate[rule.name] = self.tally.deliberate.get(rule.name, 0) + 1
                if (got["status"] == 200) != (expected["status"] == 200) and queue:
                    self.diverged.add(queue)
                return True
        self.tally.differ.append((request, got, expected))
        if (got["status"] == 200) != (expected["status"] == 200) and queue:
            self.diverged.add(queue)    # counted once: what follows on the queue would be its echo
        return False

    def _note_lifetime(self, request: Call, queue: str | None, expected: dict) -> None:
        if queue and expected["status"] == 200 and request.action == "DeleteQueue":
            self.deleted.add(queue)
        if queue and expected["status"] == 200 and request.action == "CreateQueue":
            self.deleted.discard(queue)

    def _without_diverged(self, request: Call, answer: dict) -> dict:
        """A list of queue URLs without the queues left out of the comparison (and, when the
        list could have held one, without its NextToken: a page of another list)."""
        def keep(url) -> bool:
            return not (isinstance(url, str) and url.rsplit("/", 1)[-1] in self.diverged)

        prefix = request.params.get("QueueNamePrefix") or ""
        result = answer.get("result")
        touched = request.action in ("ListQueues", "ListDeadLetterSourceQueues") and any(
            name.startswith(prefix) for name in self.diverged)
        if touched and "MaxResults" in request.params and answer["status"] == 200:
            answer["result"] = ANY     # a page may have held a queue left out, in another server's place
            return answer
        if isinstance(result, dict):
            for member in ("QueueUrls", "queueUrls"):
                if member in result:
                    result[member] = [u for u in result[member] if keep(u)]
            if touched:
                result.pop("NextToken", None)
        elif isinstance(result, list):
            def prune(node):
                tag, content = node
                if isinstance(content, str):
                    return node
                return [tag, [prune(c) for c in content if not (c[0] == "QueueUrl" and not keep(c[1]))]]
            answer["result"] = prune(result)
        return answer


def _page_open(request: Call, answer: dict) -> dict:
    """AWS documents no order of the queues a list names, so which ones a page of MaxResults
    holds is left open: only how many, and whether a next page follows."""
    result = answer.get("result")
    if "MaxResults" in request.params and isinstance(result, dict):
        for member in ("QueueUrls", "queueUrls"):
            if isinstance(result.get(member), list):
                result[member] = ["<a queue's URL>"] * len(result[member])
    if "MaxResults" in request.params and isinstance(result, list):
        answer["result"] = _urls_open(result)
    return answer


def _urls_open(node):
    tag, content = node
    if isinstance(content, str):
        return [tag, "<a queue's URL>"] if tag == "QueueUrl" else node
    return [tag, [_urls_open(child) for child in content]]


def _found(result, member: str) -> list:
    """Every value of `member` in a JSON result or a query protocol's XML (as nested lists)."""
    if isinstance(result, dict):
        return [v for k, v in result.items() if k == member] + [
            x for v in result.values() for x in _found(v, member)]
    if isinstance(result, list) and len(result) == 2 and isinstance(result[0], str):
        tag, content = result
        return [content] if tag == member and isinstance(content, str) else _found(content, member)
    if isinstance(result, list):
        return [x for v in result for x in _found(v, member)]
    return []


ANY = object()    # what is left open: anything matches it


def matches(got, expected) -> bool:
    """`got` equals `expected`, where a pattern in `expected` (AWS's words with a part left open,
    such as the attribute a message names) matches the whole of `got`'s string, and ANY anything."""
    if expected is ANY or got is ANY:
        return True
    if isinstance(expected, re.Pattern):
        return isinstance(got, str) and expected.fullmatch(got) is not None
    if isinstance(expected, dict):
        return isinstance(got, dict) and got.keys() == expected.keys() and all(
            matches(got[k], v) for k, v in expected.items())
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(map(matches, got, expected))
    return got == expected


def _queue_named(request: Call) -> str | None:
    """The queue a call names (moto takes a URL's last segment for it, whatever the account)."""
    for value in (request.params.get("QueueUrl"), request.path, request.params.get("QueueName")):
        if isinstance(value, str) and value.startswith("@queue:"):
            return value[len("@queue:"):]
        if isinstance(value, str) and "/" in value.strip("/"):
            return value.rstrip("/").rsplit("/", 1)[-1]
    source = request.params.get("SourceArn")
    if isinstance(source, str):
        return source.rsplit(":", 1)[-1]
    name = request.params.get("QueueName")
    return name if isinstance(name, str) else None

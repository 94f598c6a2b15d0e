"""What AWS answers where moto does not, and where raftq answers otherwise on purpose.

``MOTO_DEVIATIONS``: each is a place where moto's answer departs from AWS's,
with the reference for AWS's (the API reference or AWS's model, or AWS's own
answers as recorded by LocalStack's AWS-validated snapshot tests,
tests/aws/services/sqs/test_sqs*.snapshot.json, or as quoted from AWS in bug
reports and AWS's knowledge center); its ``fix`` turns moto's answer into
AWS's. ``DELIBERATE``: raftq's deliberate differences, the list of
docs/sqs.md ("Where raftq differs from AWS"), each turning AWS's answer into
the one raftq gives instead.
"""

from __future__ import annotations

import re

import botocore.session

from tests.sqs_reference import Call, Deliberate, MotoDeviation
from tests.sqsutil import md5_of_attributes

MODEL = botocore.session.get_session().get_service_model("sqs")

ACCOUNT_ID = "123456789012"
CORAL = "com.amazon.coral.service#"
SQS = "com.amazonaws.sqs#"
SNAPSHOT = "AWS's answer recorded by LocalStack's AWS-validated test "
FIFO_ONLY = ("FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit")
# the attributes CreateQueue and SetQueueAttributes take (API reference), FIFO's aside
WRITABLE = ("DelaySeconds", "MaximumMessageSize", "MessageRetentionPeriod", "Policy", "ReceiveMessageWaitTimeSeconds",
            "RedrivePolicy", "VisibilityTimeout", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds",
            "SqsManagedSseEnabled", "RedriveAllowPolicy")
# AWS's documented ranges of the queue attributes (API reference, SetQueueAttributes)
RANGES = {"DelaySeconds": (0, 900), "MaximumMessageSize": (1024, 1048576), "MessageRetentionPeriod": (60, 1209600),
          "ReceiveMessageWaitTimeSeconds": (0, 20), "VisibilityTimeout": (0, 43200),
          "KmsDataKeyReusePeriodSeconds": (60, 86400)}
KNOWN_ACTIONS = frozenset({
    "AddPermission", "CancelMessageMoveTask", "ChangeMessageVisibility", "ChangeMessageVisibilityBatch", "CreateQueue",
    "DeleteMessage", "DeleteMessageBatch", "DeleteQueue", "GetQueueAttributes", "GetQueueUrl",
    "ListDeadLetterSourceQueues", "ListMessageMoveTasks", "ListQueueTags", "ListQueues", "PurgeQueue",
    "ReceiveMessage", "RemovePermission", "SendMessage", "SendMessageBatch", "SetQueueAttributes",
    "StartMessageMoveTask", "TagQueue", "UntagQueue"})

def error(status: int, code: str, json_type: str | None, message) -> dict:
    return {"status": status, "error": {"code": code, "type": json_type, "fault": "Sender", "message": message}}


def _json_type(request: Call, json_type: str) -> str | None:
    return json_type if request.protocol == "json" else None


def _code(expected: dict) -> str | None:
    return (expected.get("error") or {}).get("code")


def _message(expected: dict) -> str:
    message = (expected.get("error") or {}).get("message")
    return message if isinstance(message, str) else ""


def _no_queue(expected: dict) -> bool:
    """AWS checks the required members and finds the queue before it looks at attributes."""
    return _code(expected) in ("AWS.SimpleQueueService.NonExistentQueue", "MissingParameter")


def _fifo(request: Call) -> bool:
    url = request.params.get("QueueUrl") or request.path
    if request.action == "CreateQueue":
        return str((request.params.get("Attributes") or {}).get("FifoQueue", "")).lower() == "true"
    return isinstance(url, str) and url.endswith(".fifo")


def _invalid(request: Call, message) -> dict:
    return error(400, "InvalidParameterValue", _json_type(request, CORAL + "InvalidParameterValueException"), message)


# ---- moto's deviations from AWS ---------------------------------------------------------------------

def coral_types(request: Call, expected: dict, issued: set):
    if (expected.get("error") or {}).get("type") == SQS + "InvalidParameterValue":
        return {**expected, "error": {**expected["error"], "type": CORAL + "InvalidParameterValueException"}}
    return None


def missing_members(request: Call, expected: dict, issued: set):
    operation = MODEL.operation_model(request.action) if request.action in KNOWN_ACTIONS else None
    for member in operation.input_shape.required_members if operation else ():
        if member == "QueueUrl" and request.path != "/":
            continue    # the query protocol names the queue by the URL it posts to
        if operation.input_shape.members[member].type_name in ("list", "map"):
            continue    # empty or absent, as the query protocol cannot tell them apart: the action's to check
        if request.params.get(member) in (None, "") and _message(expected) != (
                f"The request must contain the parameter {member}."):
            return error(400, "MissingParameter", _json_type(request, CORAL + "MissingRequiredParameterException"),
                         f"The request must contain the parameter {member}.")
    return None


def unknown_action(request: Call, expected: dict, issued: set):
    if expected["status"] == 500 and request.action not in KNOWN_ACTIONS:
        return error(400, "InvalidAction", _json_type(request, CORAL + "UnknownOperationException"),
                     f"The action {request.action} is not valid for this endpoint.")
    return None


def empty_body(request: Call, expected: dict, issued: set):
    if request.action == "SendMessage" and request.params.get("MessageBody") == "" and expected["status"] == 200:
        return error(400, "MissingParameter", _json_type(request, CORAL + "MissingRequiredParameterException"),
                     "The request must contain the parameter MessageBody.")
    return None


def standard_name_with_fifo_suffix(request: Call, expected: dict, issued: set):
    name = request.params.get("QueueName")
    if request.action == "CreateQueue" and isinstance(name, str) and name.endswith(".fifo") and not _fifo(request):
        return _invalid(request, "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length")
    return None


def queue_exists_words(request: Call, expected: dict, issued: set):
    if _code(expected) == "QueueAlreadyExists":
        return {**expected, "error": {**expected["error"], "message": re.compile(
            "A queue already exists with the same name and a different value for attribute [A-Za-z]+")}}
    return None


def fifo_attributes_on_standard(request: Call, expected: dict, issued: set):
    if _no_queue(expected):
        return None
    if request.action not in ("CreateQueue", "SetQueueAttributes") or _fifo(request) or _code(expected) == (
            "InvalidParameterValue"):
        return None    # a FIFO queue's, or a name refused first
    for name in request.params.get("Attributes") or {}:
        if name in ("FifoQueue", "ContentBasedDeduplication"):
            message = f"Unknown Attribute {name}."
        elif name in FIFO_ONLY:
            message = f"You can specify the {name} only when FifoQueue is set to true."
        else:
            continue
        return error(400, "InvalidAttributeName", _json_type(request, SQS + "InvalidAttributeName"), message)
    return None


def fifo_type_unchangeable(request: Call, expected: dict, issued: set):
    if _no_queue(expected):
        return None
    value = (request.params.get("Attributes") or {}).get("FifoQueue")
    if request.action == "SetQueueAttributes" and _fifo(request) and value is not None and value != "true":
        return error(400, "InvalidAttributeValue", _json_type(request, SQS + "InvalidAttributeValue"),
                     "Invalid value for the parameter FifoQueue. Reason: Modifying queue type is not supported.")
    return None


def attribute_ranges(request: Call, expected: dict, issued: set):
    if _no_queue(expected):
        return None
    if request.action not in ("CreateQueue", "SetQueueAttributes") or expected["status"] not in (200, 500):
        return None
    for name, value in (request.params.get("Attributes") or {}).items():
        if name in RANGES:
            low, high = RANGES[name]
            if not (value.isdigit() and low <= int(value) <= high):
                return error(400, "InvalidAttributeValue", _json_type(request, SQS + "InvalidAttributeValue"),
                             f"Invalid value for the parameter {name}.")
    return None


def _whole_seconds_xml(node):
    tag, content = node
    if isinstance(content, str):
        return node
    if tag == "Attribute" and len(content) == 2 and content[0][1] in ("CreatedTimestamp", "LastModifiedTimestamp") \
            and re.fullmatch(r"\d{10}\.\d+", content[1][1]):
        return [tag, [content[0], ["Value", "<now, s>"]]]
    return [tag, [_whole_seconds_xml(child) for child in content]]


def whole_seconds(request: Call, expected: dict, issued: set):
    if isinstance(expected.get("result"), list):
        return {**expected, "result": _whole_seconds_xml(expected["result"])}
    attributes = (expected.get("result") or {}).get("Attributes") if isinstance(expected.get("result"), dict) \
        else None
    if not attributes:
        return None
    fixed = dict(attributes)
    for name in ("CreatedTimestamp", "LastModifiedTimestamp"):
        if re.fullmatch(r"\d{10}\.\d+", fixed.get(name, "")):
            fixed[name] = "<now, s>"
    return {**expected, "result": {**expected["result"], "Attributes": fixed}}


def attribute_type_words(request: Call, expected: dict, issued: set):
    found = re.fullmatch(r"The message attribute '(.*)' has an invalid message attribute type, the set of supported "
                         r"type prefixes is Binary, Number, and String\.", _message(expected))
    if found:
        return {**expected, "error": {**expected["error"], "message": (
            f"The type of message (user) attribute '{found.group(1)}' is invalid. You must use only the following "
            "supported type prefixes: Binary, Number, String.")}}
    return None


def empty_attribute_value(request: Call, expected: dict, issued: set):
    if request.action != "SendMessage" or expected["status"] != 200:
        return None
    for name, value in (request.params.get("MessageAttributes") or {}).items():
        kind = str(value.get("DataType", "")).split(".")[0]
        if kind in ("String", "Number") and value.get("StringValue") == "":
            return _invalid(request, f"Message (user) attribute '{name}' must contain a non-empty value of type "
                                     f"'{kind}'.")
    return None


def deduplication_id_on_standard(request: Call, expected: dict, issued: set):
    dedup = request.params.get("MessageDeduplicationId")
    if request.action == "SendMessage" and dedup is not None and not _fifo(request) and expected["status"] == 200:
        return _invalid(request, f"Value {dedup} for parameter MessageDeduplicationId is invalid. Reason: The request "
                                 "include parameter that is not valid for this queue type.")
    return None


RECEIVE_REASONS = {"MaxNumberOfMessages": "Must be between 1 and 10, if provided.",
                   "WaitTimeSeconds": "Must be >= 0 and <= 20, if provided.",
                   "VisibilityTimeout": "Must be >= 0 and <= 43200, if provided."}


def receive_range_words(request: Call, expected: dict, issued: set):
    message = _message(expected)
    if request.action not in ("ReceiveMessage", "ChangeMessageVisibility") or not (
            message.startswith("An error occurred") or message.startswith("Invalid request, maximum visibility")):
        return None
    for name, reason in RECEIVE_REASONS.items():
        if name in message or (name == "VisibilityTimeout" and "visibility" in message):
            return {**expected, "error": {**expected["error"], "message": (
                f"Value {request.params[name]} for parameter {name} is invalid. Reason: {reason}")}}
    return None


def receipt_handle_refusal(request: Call, expected: dict, issued: set):
    handle = re.compile("The input receipt handle '.*' is not a valid receipt handle.")
    if _code(expected) == "ReceiptHandleIsInvalid":
        return {**expected, "status": 404, "error": {**expected["error"], "message": handle}}
    result = expected.get("result")
    if isinstance(result, dict) and result.get("Failed"):
        failed = [{**entry, "Message": handle} if entry.get("Code") == "ReceiptHandleIsInvalid" else entry
                  for entry in result["Failed"]]
        return {**expected, "result": {**result, "Failed": failed}}
    if isinstance(result, list):
        return {**expected, "result": _xml_failed_messages(result, handle)}
    return None


def _xml_failed_messages(node, message):
    """The query protocol's BatchResultErrorEntry elements of a refused receipt, with `message`."""
    tag, content = node
    if isinstance(content, str):
        return node
    if tag == "BatchResultErrorEntry" and ["Code", "ReceiptHandleIsInvalid"] in content:
        return [tag, [["Message", message] if child[0] == "Message" else child for child in content]]
    return [tag, [_xml_failed_messages(child, message) for child in content]]


def remove_permission_words(request: Call, expected: dict, issued: set):
    message = _message(expected)
    if message.endswith("Reason: can't find label on existing policy."):
        return {**expected, "error": {**expected["error"], "message": message.replace(
            "can't find label on existing policy.", "can't find label.")}}
    return None


def unknown_queue_attribute(request: Call, expected: dict, issued: set):
    if _no_queue(expected):
        return None
    if request.action not in ("CreateQueue", "SetQueueAttributes") or expected["status"] not in (200, 500):
        return None
    for name in request.params.get("Attributes") or {}:
        if name not in WRITABLE and name not in FIFO_ONLY:
            return error(400, "InvalidAttributeName", _json_type(request, SQS + "InvalidAttributeName"),
                         f"Unknown Attribute {name}.")
    return None


SEND_RESULT_ORDER = ["MD5OfMessageBody", "MD5OfMessageAttributes", "MD5OfMessageSystemAttributes", "MessageId",
                     "SequenceNumber"]


def _with_member(expected: dict, name: str, value: str) -> dict:
    """A SendMessage result with `name` added: a JSON member, or the XML element in the model's order."""
    result = expected["result"]
    if isinstance(result, dict):
        return {**expected, "result": {**result, name: value}}
    tag, [[inner, children]] = result
    children = sorted([*children, [name, value]], key=lambda child: SEND_RESULT_ORDER.index(child[0]))
    return {**expected, "result": [tag, [[inner, children]]]}


def _has_member(result, name: str) -> bool:
    if isinstance(result, dict):
        return name in result
    return any(child[0] == name for child in result[1][0][1])


def fifo_sequence_number(request: Call, expected: dict, issued: set):
    result = expected.get("result")
    if request.action == "SendMessage" and _fifo(request) and result is not None and \
            not _has_member(result, "SequenceNumber"):
        return _with_member(expected, "SequenceNumber", "<sequence number>")
    return None


RECEIVED_ORDER = ["MessageId", "ReceiptHandle", "MD5OfBody", "Body", "Attribute", "MD5OfMessageAttributes",
                  "MessageAttribute"]


def _xml_sequence_numbers(node):
    """Each Message element of a query protocol's ReceiveMessage result with its SequenceNumber attribute."""
    tag, content = node
    if isinstance(content, str):
        return node
    if tag == "Message":
        attribute = ["Attribute", [["Name", "SequenceNumber"], ["Value", "<sequence number>"]]]
        if attribute in content:
            return node
        ordered = [c for c in content if c[0] != "Attribute"]
        attributes = sorted([c for c in content if c[0] == "Attribute"] + [attribute], key=repr)
        merged = sorted(ordered + attributes, key=lambda c: RECEIVED_ORDER.index(c[0]))
        return [tag, merged]
    return [tag, [_xml_sequence_numbers(child) for child in content]]


def fifo_receive_sequence_number(request: Call, expected: dict, issued: set):
    result = expected.get("result")
    wanted = set(request.params.get("MessageSystemAttributeNames") or []) | set(
        request.params.get("AttributeNames") or [])
    if request.action != "ReceiveMessage" or not _fifo(request) or result is None or not (
            wanted & {"All", "SequenceNumber"}):
        return None
    if isinstance(result, list):
        return {**expected, "result": _xml_sequence_numbers(result)}
    messages = [{**m, "Attributes": {**m.get("Attributes", {}), "SequenceNumber": "<sequence number>"}}
                for m in result.get("Messages", [])]
    return {**expected, "result": {**result, "Messages": messages}} if messages else None


FIFO_ID_FORM = re.compile(r"[\x21-\x7e]{1,128}")


def fifo_id_form(request: Call, expected: dict, issued: set):
    later = ("ContentBasedDeduplication", "MessageGroupId", "not valid for this queue type")
    if request.action != "SendMessage" or not (expected["status"] == 200 or any(
            words in _message(expected) for words in later)):
        return None    # refused by an earlier check (the form of the ids is checked before what the queue needs)
    for name in ("MessageDeduplicationId", "MessageGroupId"):
        value = request.params.get(name)
        if value is not None and not FIFO_ID_FORM.fullmatch(value):
            return _invalid(request, f"Value {value} for parameter {name} is invalid. Reason: {name} can only "
                                     "include alphanumeric and punctuation characters. 1 to 128 in length.")
    return None


def stores_though_attribute_name_refused(request: Call) -> bool:
    """moto checks a message attribute's name only as it answers, once it has stored the message."""
    names = (request.params.get("MessageAttributes") or {}) if request.action == "SendMessage" else {}
    return any(not re.fullmatch(r"[A-Za-z0-9_.-]+", name) for name in names)


def both_kinds_of_encryption(request: Call, expected: dict, issued: set):
    if _no_queue(expected):
        return None
    given = request.params.get("Attributes") or {}
    if request.action in ("CreateQueue", "SetQueueAttributes") and given.get("KmsMasterKeyId") and str(
            given.get("SqsManagedSseEnabled", "")).lower() == "true" and expected["status"] == 200:
        return error(400, "InvalidAttributeName", _json_type(request, SQS + "InvalidAttributeName"),
                     "You can use one type of server-side encryption (SSE) at one time. You can either enable KMS SSE "
                     "or SQS SSE.")
    return None


def batch_without_group(request: Call, expected: dict, issued: set):
    if request.action == "SendMessageBatch" and _code(expected) == "MissingParameter" and _message(expected) == (
            "The request must contain the parameter MessageGroupId."):
        return _invalid(request, _message(expected))
    return None


def max_results_range(request: Call, expected: dict, issued: set):
    limit = request.params.get("MaxResults")
    if request.action in ("ListQueues", "ListDeadLetterSourceQueues") and isinstance(limit, int) and not (
            1 <= limit <= 1000) and expected["status"] == 200:
        return _invalid(request, f"Value {limit} for parameter MaxResults is invalid. Reason: Must be between 1 and "
                                 "1000, if provided.")
    return None


def batch_entry_limit(request: Call, expected: dict, issued: set):
    entries = request.params.get("Entries")
    if request.action.endswith("Batch") and isinstance(entries, list) and len(entries) > 10 and \
            expected["status"] == 200:
        return error(400, "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                     _json_type(request, SQS + "TooManyEntriesInBatchRequest"),
                     f"Maximum number of entries per request are 10. You have sent {len(entries)}.")
    return None


def queue_of_another_account(request: Call, expected: dict, issued: set):
    url = request.params.get("QueueUrl")
    found = re.fullmatch(r"https?://[^/]+/(\d{12})/[^/]+", url) if isinstance(url, str) else None
    if found and found.group(1) != ACCOUNT_ID and _code(expected) != "MissingParameter":
        return error(400, "AWS.SimpleQueueService.NonExistentQueue", _json_type(request, SQS + "QueueDoesNotExist"),
                     "The specified queue does not exist." if request.protocol == "json" else
                     "The specified queue does not exist for this wsdl version.")
    return None


def delay_seconds_range(request: Call, expected: dict, issued: set):
    delay = request.params.get("DelaySeconds")
    if request.action == "SendMessage" and isinstance(delay, int) and delay < 0 and expected["status"] == 200:
        if _fifo(request):    # a FIFO queue takes no delay of a message's own, whatever its value
            return _invalid(request, f"Value {delay} for parameter DelaySeconds is invalid. Reason: The request "
                                     "include parameter that is not valid for this queue type.")
        return _invalid(request, f"Value {delay} for parameter DelaySeconds is invalid. Reason: DelaySeconds must be "
                                 ">= 0 and <= 900.")
    return None


def queue_owner_account(request: Call, expected: dict, issued: set):
    owner = request.params.get("QueueOwnerAWSAccountId")
    if request.action == "GetQueueUrl" and owner not in (None, ACCOUNT_ID) and expected["status"] == 200:
        return error(400, "AWS.SimpleQueueService.NonExistentQueue", _json_type(request, SQS + "QueueDoesNotExist"),
                     "The specified queue does not exist." if request.protocol == "json" else
                     "The specified queue does not exist for this wsdl version.")
    return None


def body_characters(request: Call, expected: dict, issued: set):
    body = request.params.get("MessageBody")
    if request.action == "SendMessage" and isinstance(body, str) and expected["status"] == 200 and not re.fullmatch(
            "[\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*", body):
        return error(400, "InvalidMessageContents", _json_type(request, SQS + "InvalidMessageContents"),
                     "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | #x20 to #xD7FF | "
                     "#xE000 to #xFFFD | #x10000 to #x10FFFF")
    return None


def fifo_queue_name_words(request: Call, expected: dict, issued: set):
    name = request.params.get("QueueName")
    if request.action == "CreateQueue" and _fifo(request) and isinstance(name, str) and not name.endswith(".fifo"):
        return _invalid(request, "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
                                 "underscores, must end with .fifo suffix and be 1 to 80 in length.")
    return None


def trace_header_digest(request: Call, expected: dict, issued: set):
    result = expected.get("result")
    trace = (request.params.get("MessageSystemAttributes") or {}).get("AWSTraceHeader")
    if request.action == "SendMessage" and result is not None and trace and \
            not _has_member(result, "MD5OfMessageSystemAttributes"):
        digest = md5_of_attributes({"AWSTraceHeader": ("String", trace["StringValue"])})
        return _with_member(expected, "MD5OfMessageSystemAttributes", digest)
    return None


def batch_entry_id_form(request: Call, expected: dict, issued: set):
    entries = request.params.get("Entries")
    if request.action in ("DeleteMessageBatch", "ChangeMessageVisibilityBatch") and isinstance(entries, list) and \
            expected["status"] == 200 and any(not re.fullmatch(r"[A-Za-z0-9_-]{1,80}", str(e.get("Id")))
                                              for e in entries):
        return error(400, "AWS.SimpleQueueService.InvalidBatchEntryId",
                     _json_type(request, SQS + "InvalidBatchEntryId"),
                     "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be "
                     "at most 80 letters long.")
    return None


def receive_ranges(request: Call, expected: dict, issued: set):
    if request.action not in ("ReceiveMessage", "ChangeMessageVisibility") or not (
            expected["status"] == 200 or _code(expected) == "ReceiptHandleIsInvalid"):
        return None    # (moto checks the timeout before the receipt, though only for its ceiling)
    for name, (low, high) in {"MaxNumberOfMessages": (1, 10), "WaitTimeSeconds": (0, 20),
                              "VisibilityTimeout": (0, 43200)}.items():
        value = request.params.get(name)
        if isinstance(value, int) and not low <= value <= high:
            return _invalid(request, f"Value {value} for parameter {name} is invalid. Reason: {RECEIVE_REASONS[name]}")
    return None


def reserved_attribute_names(request: Call, expected: dict, issued: set):
    names = request.params.get("MessageAttributes") or {}
    if request.action == "SendMessage" and expected["status"] == 200 and any(
            re.match(r"(aws|amazon)\.|\.|.*\.$", name, re.IGNORECASE) for name in names):
        return _invalid(request, "You can't use message attribute names beginning with 'AWS.' or 'Amazon.'. These "
                                 "strings are reserved for internal use. Additionally, they cannot start or end with "
                                 "'.'.")
    return None


def too_many_message_attributes(request: Call, expected: dict, issued: set):
    given = request.params.get("MessageAttributes") or {}
    if request.action == "SendMessage" and len(given) > 10 and expected["status"] == 200:
        return _invalid(request, f"Number of message attributes [{len(given)}] exceeds the allowed maximum [10].")
    return None


def visibility_batch_ids_distinct(request: Call, expected: dict, issued: set):
    ids = [entry.get("Id") for entry in request.params.get("Entries") or [] if isinstance(entry, dict)]
    if request.action == "ChangeMessageVisibilityBatch" and len(set(ids)) < len(ids) and expected["status"] == 200:
        twice = next(i for n, i in enumerate(ids) if i in ids[:n])
        return error(400, "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                     _json_type(request, SQS + "BatchEntryIdsNotDistinct"), f"Id {twice} repeated.")
    return None


def empty_batch(request: Call, expected: dict, issued: set):
    if request.action == "ChangeMessageVisibilityBatch" and not request.params.get("Entries") and \
            expected["status"] == 200:
        return error(400, "AWS.SimpleQueueService.EmptyBatchRequest", _json_type(request, SQS + "EmptyBatchRequest"),
                     "There should be at least one ChangeMessageVisibilityBatchRequestEntry in the request.")
    return None


GONE_MESSAGE = ("Value {} for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not available for "
                "visibility timeout change.")


def visibility_of_a_gone_message(request: Call, expected: dict, issued: set):
    """moto refuses a handle it gave only once the message is gone; AWS's words for that."""
    if request.action == "ChangeMessageVisibility" and request.params.get("ReceiptHandle") in issued and \
            _code(expected) == "ReceiptHandleIsInvalid":
        return _invalid(request, re.compile(re.escape(GONE_MESSAGE).replace(r"\{\}", ".*")))
    result = expected.get("result")
    if request.action == "ChangeMessageVisibilityBatch" and isinstance(result, dict):
        by_id = {entry.get("Id"): entry.get("ReceiptHandle") for entry in request.params.get("Entries") or []}
        failed = [{**entry, "Code": "InvalidParameterValue", "Message": re.compile(
                      re.escape(GONE_MESSAGE).replace(r"\{\}", ".*"))}
                  if entry.get("Code") == "ReceiptHandleIsInvalid" and by_id.get(entry["Id"]) in issued else entry
                  for entry in result.get("Failed", [])]
        return {**expected, "result": {**result, "Failed": failed}}
    return None


def tag_limits(request: Call, expected: dict, issued: set):
    tags = request.params.get("Tags" if request.action == "TagQueue" else "tags") or {}
    if request.action not in ("TagQueue", "CreateQueue") or expected["status"] != 200:
        return None
    for key, value in tags.items():
        if not 1 <= len(key) <= 128:
            return _invalid(request, "Tag keys must be between 1 and 128 characters in length.")
        if len(value) > 256:
            return _invalid(request, "Tag values must be between 0 and 256 characters in length.")
    return None


def no_empty_attribute_maps(request: Call, expected: dict, issued: set):
    result = expected.get("result")
    if request.action == "ReceiveMessage" and isinstance(result, dict) and any(
            m.get("Attributes") == {} for m in result.get("Messages", [])):
        messages = [{k: v for k, v in m.items() if not (k == "Attributes" and v == {})} for m in result["Messages"]]
        return {**expected, "result": {**result, "Messages": messages}}
    return None


def no_tags_no_map(request: Call, expected: dict, issued: set):
    if request.action == "ListQueueTags" and expected.get("result") == {"Tags": {}}:
        return {**expected, "result": {}}
    return None


def missing_dead_letter_target(request: Call, expected: dict, issued: set):
    message = _message(expected)
    # (moto's query protocol words its refusal as any missing queue's: CreateQueue names no other queue)
    if message.startswith("Could not find DLQ for ") or (
            request.action == "CreateQueue" and _no_queue(expected) and _code(expected) != "MissingParameter"):
        policy = (request.params.get("Attributes") or {}).get("RedrivePolicy")
        if policy is None:
            return None
        return _invalid(request, f"Value {policy} for parameter RedrivePolicy is invalid. Reason: Dead letter target "
                                 "does not exist.")
    return None


MOTO_DEVIATIONS = [
    MotoDeviation("json-type-of-InvalidParameterValue", SNAPSHOT + "(QueryErrorCode InvalidParameterValueException "
                  "is botocore's reading of AWS's __type com.amazon.coral.service#InvalidParameterValueException)",
                  coral_types),
    MotoDeviation("missing-required-member", "API reference: the member is Required; " + SNAPSHOT +
                  "test_send_empty_message: MissingParameter, 'The request must contain the parameter MessageBody.'",
                  missing_members),
    MotoDeviation("500-for-an-unknown-action", "AWS's answer recorded by LocalStack's AWS-validated "
                  "TestSqsQueryApi::test_invalid_action_raises_exception: InvalidAction, 'The action FooBar is not "
                  "valid for this endpoint.'", unknown_action),
    MotoDeviation("empty-message-body-taken", SNAPSHOT + "test_send_empty_message", empty_body),
    MotoDeviation("queue-exists-words", SNAPSHOT + "test_create_queue_with_different_attributes_raises_exception",
                  queue_exists_words),
    MotoDeviation("standard-queue-named-.fifo", "API reference, CreateQueue QueueName: alphanumeric characters, "
                  "hyphens and underscores; a FIFO queue's name ends with .fifo", standard_name_with_fifo_suffix),
    MotoDeviation("fifo-attributes-on-a-standard-queue", SNAPSHOT + "test_create_standard_queue_with_fifo_attribute_"
                  "raises_error, test_set_unsupported_attribute_standard", fifo_attributes_on_standard),
    MotoDeviation("fifo-queue-type-unchangeable", SNAPSHOT + "test_set_unsupported_attribute_fifo",
                  fifo_type_unchangeable),
    MotoDeviation("queue-attribute-ranges", "API reference, SetQueueAttributes: each attribute's range",
                  attribute_ranges),
    MotoDeviation("timestamps-in-whole-seconds", "API reference, GetQueueAttributes: CreatedTimestamp and "
                  "LastModifiedTimestamp in seconds (epoch time); " + SNAPSHOT + "test_create_queue_and_get_"
                  "attributes", whole_seconds),
    MotoDeviation("message-attribute-type-words", "AWS's words quoted in grafana/k6-jslib-aws#65 (2023-10)",
                  attribute_type_words),
    MotoDeviation("empty-message-attribute-value", SNAPSHOT + "test_send_message_with_empty_string_attribute",
                  empty_attribute_value),
    MotoDeviation("fifo-id-form", SNAPSHOT + "test_message_deduplication_id_invalid, test_send_message_to_standard_"
                  "queue_with_invalid_message_group_id", fifo_id_form),
    MotoDeviation("deduplication-id-on-a-standard-queue", "API reference, SendMessage: MessageDeduplicationId "
                  "applies only to FIFO queues; AWS's words quoted in aws/aws-sdk-js#3187 and "
                  "github-aws-runners/terraform-aws-github-runner#1562", deduplication_id_on_standard),
    MotoDeviation("receive-range-words", SNAPSHOT + "test_send_receive_max_number_of_messages, "
                  "test_send_receive_wait_time_seconds", receive_range_words),
    MotoDeviation("receipt-handle-refusal", "AWS's model: ReceiptHandleIsInvalid is 404 (@awsQueryError); AWS "
                  "knowledge center, sqs-receipt-handle-error: 'The input receipt handle '...' is not a valid "
                  "receipt handle.'", receipt_handle_refusal),
    MotoDeviation("remove-permission-words", SNAPSHOT + "test_sqs_permission_lifecycle", remove_permission_words),
    MotoDeviation("unknown-queue-attribute-taken", "API reference, CreateQueue and SetQueueAttributes: the "
                  "attribute names; AWS's words for one it does not take: " + SNAPSHOT +
                  "test_set_unsupported_attribute_standard", unknown_queue_attribute),
    MotoDeviation("fifo-send-without-sequence-number", "API reference, SendMessage: SequenceNumber is returned for "
                  "every message sent to a FIFO queue", fifo_sequence_number),
    MotoDeviation("fifo-receive-without-sequence-number", SNAPSHOT + "test_fifo_message_attributes (every "
                  "message of a FIFO queue has its SequenceNumber)", fifo_receive_sequence_number),
    MotoDeviation("message-stored-though-refused", "API reference, SendMessage: a refused call sends nothing "
                  "(moto checks an attribute name as it answers, after storing the message)", lambda request, expected, issued: None,
                  stores_though_attribute_name_refused),
    MotoDeviation("empty-attributes-map", "AWS leaves out what is empty: " + SNAPSHOT + "test_tag_untag_queue "
                  "(no Tags), test_receive_message_message_attribute_names_filters (no MessageAttributes)",
                  no_empty_attribute_maps),
    MotoDeviation("no-tags-no-map", SNAPSHOT + "test_tag_untag_queue (get-tag-after-untag)", no_tags_no_map),
    MotoDeviation("dead-letter-target-missing", "AWS's words quoted by users: 'Value {...} for parameter "
                  "RedrivePolicy is invalid. Reason: Dead letter target does not exist.' (InvalidParameterValue)",
                  missing_dead_letter_target),
    MotoDeviation("both-kinds-of-encryption", SNAPSHOT + "test_sse_kms_and_sqs_are_mutually_exclusive",
                  both_kinds_of_encryption),
    MotoDeviation("batch-entry-without-its-group", SNAPSHOT + "test_send_batch_missing_message_group_id_for_fifo_"
                  "queue (InvalidParameterValue)", batch_without_group),
    MotoDeviation("max-results-range", "API reference, ListQueues and ListDeadLetterSourceQueues: MaxResults from 1 "
                  "to 1,000", max_results_range),
    MotoDeviation("batch-entry-limit", SNAPSHOT + "test_change_message_visibility_batch_with_too_large_batch, "
                  "test_delete_message_batch_with_too_large_batch", batch_entry_limit),
    MotoDeviation("queue-url-of-another-account", "API reference: a QueueUrl names a queue of the account in it; "
                  "moto reads only its last segment", queue_of_another_account),
    MotoDeviation("delay-seconds-range", "API reference, SendMessage: DelaySeconds from 0 to 900; AWS's words as "
                  "moto gives them above 900", delay_seconds_range),
    MotoDeviation("queue-owner-account", "API reference, GetQueueUrl: QueueOwnerAWSAccountId names the account "
                  "whose queue is asked for", queue_owner_account),
    MotoDeviation("message-body-characters", "API reference, SendMessage: the characters a MessageBody may hold; AWS's "
                  "words as LocalStack reproduces them", body_characters),
    MotoDeviation("fifo-queue-name-words", "AWS's words, as others quote 'the real exception' (elasticmq's "
                  "InvalidQueueNameException)", fifo_queue_name_words),
    MotoDeviation("trace-header-digest", "API reference, SendMessage: MD5OfMessageSystemAttributes", trace_header_digest),
    MotoDeviation("batch-entry-id-form", SNAPSHOT + "test_delete_message_batch_invalid_msg_id", batch_entry_id_form),
    MotoDeviation("receive-ranges", "API reference, ReceiveMessage and ChangeMessageVisibility: the ranges; AWS's "
                  "words recorded by LocalStack's AWS-validated tests", receive_ranges),
    MotoDeviation("reserved-attribute-names", "Developer guide, message attributes: a name cannot start with AWS. or "
                  "Amazon., nor start or end with a period; AWS's words as LocalStack gives them",
                  reserved_attribute_names),
    MotoDeviation("too-many-message-attributes", "Developer guide: a message has up to 10 message attributes",
                  too_many_message_attributes),
    MotoDeviation("empty-visibility-batch", "AWS's model: ChangeMessageVisibilityBatch can answer "
                  "EmptyBatchRequest; AWS's words for the other batches (" + SNAPSHOT + "test_send_message_batch_with_"
                  "empty_list)", empty_batch),
    MotoDeviation("visibility-batch-ids-distinct", "AWS's model: ChangeMessageVisibilityBatch can answer "
                  "BatchEntryIdsNotDistinct; the words as moto gives them for the other batches",
                  visibility_batch_ids_distinct),
    MotoDeviation("visibility-of-a-gone-message", SNAPSHOT.replace("answer recorded by", "answer checked in") +
                  "test_change_visibility_on_deleted_message_raises_invalid_parameter_value",
                  visibility_of_a_gone_message),
    MotoDeviation("tag-limits", "API reference, TagQueue: keys 1 to 128 characters, values up to 256", tag_limits),
]


# ---- raftq's deliberate differences (docs/sqs.md) ------------------------------------------------------

ENCRYPTION_REFUSED = re.compile(r"Invalid value for the parameter (KmsMasterKeyId|SqsManagedSseEnabled)\. Reason: "
                                r"raftq does not encrypt messages at rest .*")


def _unencrypted_xml(node):
    tag, content = node
    if isinstance(content, str):
        return node
    if tag == "Attribute" and content and content[0] == ["Name", "SqsManagedSseEnabled"]:
        return [tag, [content[0], ["Value", "false"]]]
    return [tag, [_unencrypted_xml(child) for child in content
                  if not (child[0] == "Attribute" and str(child[1][0][1]).startswith("Kms"))]]


def unencrypted(request: Call, expected: dict):
    result = expected.get("result")
    if request.action == "GetQueueAttributes" and isinstance(result, list):
        return {**expected, "result": _unencrypted_xml(result)}
    if isinstance(result, dict) and "SqsManagedSseEnabled" in (result.get("Attributes") or {}):
        attributes = {k: v for k, v in result["Attributes"].items() if not k.startswith("Kms")}
        return {**expected, "result": {**result, "Attributes": {**attributes, "SqsManagedSseEnabled": "false"}}}
    given = request.params.get("Attributes") or {}
    if request.action in ("CreateQueue", "SetQueueAttributes") and expected["status"] == 200 and (
            given.get("KmsMasterKeyId") or str(given.get("SqsManagedSseEnabled", "")).lower() == "true"):
        return error(400, "InvalidAttributeValue", _json_type(request, SQS + "InvalidAttributeValue"),
                     ENCRYPTION_REFUSED)
    return None


def attribute_values_checked_first(request: Call, expected: dict):
    if request.action == "CreateQueue" and _code(expected) == "QueueAlreadyExists":
        return error(400, re.compile("InvalidAttributeValue|InvalidAttributeName|InvalidParameterValue"),
                     re.compile(".*"), re.compile(".*"))
    return None


def trace_header_only(request: Call, expected: dict):
    names = set(request.params.get("MessageSystemAttributes") or {})
    if request.action == "SendMessage" and names - {"AWSTraceHeader"}:
        return _invalid(request, re.compile(r"Value .* for parameter MessageSystemAttributes is invalid\. Reason: the "
                                            r"only message system attribute is AWSTraceHeader"))
    return None


def no_queue_policies(request: Call, expected: dict):
    if request.action == "AddPermission" and expected["status"] == 200:
        return error(400, "AWS.SimpleQueueService.UnsupportedOperation", _json_type(request, SQS + "UnsupportedOperation"),
                     re.compile("raftq grants access by the rules of each key.s principal .*"))
    return None


DELIBERATE = [
    Deliberate("no-encryption-at-rest", unencrypted),
    Deliberate("no-queue-policies", no_queue_policies),
    Deliberate("create-queue-checks-values-before-it-compares", attribute_values_checked_first),
    Deliberate("only-the-trace-header-as-a-system-attribute", trace_header_only),
]

"""SQS attributes onto raftq: queue attributes, message attributes and their MD5.

Queue attributes that raftq acts on are its own config: ``VisibilityTimeout``
is ``lease_ms``, ``MessageRetentionPeriod`` is ``ttl_ms``, ``RedrivePolicy``
is ``dead_letter`` with ``max_deliveries``.  The rest the front applies
(``DelaySeconds``, ``MaximumMessageSize``, ``ReceiveMessageWaitTimeSeconds``)
or only keeps and shows (``Policy``, ``RedriveAllowPolicy``, the
timestamps): they live in the queue's ``sqs_attributes``, replicated with
its config.

A message's SQS-only data rides in its headers (HEADER_*): native consumers
see them as headers, and SQS consumers see native messages too (their
MessageId is derived from queue and seq).
"""

import base64
import binascii
import hashlib
import json
import re
import struct

from .errors import SqsError, invalid

# Only the SQS door writes these (the native API refuses them: api/messages.py): a native client
# could otherwise forge a message's SenderId and MessageId, or attributes no receive could render.
HEADER_PREFIX = "x-sqs-"
HEADER_ID = "x-sqs-message-id"
HEADER_ATTRIBUTES = "x-sqs-message-attributes"
HEADER_SENDER = "x-sqs-sender-id"
HEADER_TRACE = "x-sqs-aws-trace-header"
HEADER_DEDUPLICATION = "x-sqs-deduplication-id"
HEADER_GROUP = "x-sqs-message-group-id"

DEFAULT_RETENTION_S = 345_600
DEFAULT_MAX_MESSAGE = 1_048_576
# name -> (lowest, highest, default) in seconds or bytes
NUMERIC = {
    "DelaySeconds": (0, 900, 0),
    "MaximumMessageSize": (1_024, 1_048_576, DEFAULT_MAX_MESSAGE),
    "MessageRetentionPeriod": (60, 1_209_600, DEFAULT_RETENTION_S),
    "ReceiveMessageWaitTimeSeconds": (0, 20, 0),
    "VisibilityTimeout": (0, 43_200, 30),
    "KmsDataKeyReusePeriodSeconds": (60, 86_400, 300),
}
# Server-side encryption: AWS checks them; raftq, which does not encrypt, then refuses any that would
ENCRYPTION = frozenset({"KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "SqsManagedSseEnabled"})
SETTABLE = frozenset(NUMERIC) | ENCRYPTION | {"Policy", "RedrivePolicy", "RedriveAllowPolicy"}
FIFO_ONLY = frozenset({"FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit"})
# A standard queue refuses these as unknown; the other FIFO attributes with AWS's own words
UNKNOWN_ON_STANDARD = frozenset({"FifoQueue", "ContentBasedDeduplication"})
READ_ONLY = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
             "ApproximateNumberOfMessagesDelayed", "CreatedTimestamp", "LastModifiedTimestamp", "QueueArn")
READABLE = frozenset(READ_ONLY) | SETTABLE | FIFO_ONLY
ARN = re.compile(r"arn:aws[a-z-]*:sqs:([a-z0-9-]*):(\d{12}):([A-Za-z0-9_-]{1,80}(?:\.fifo)?)", re.ASCII)
QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}", re.ASCII)


def arn(region: str, account: str, name: str) -> str:
    return f"arn:aws:sqs:{region}:{account}:{name}"


def queue_from_arn(value: str, account: str, parameter: str) -> str:
    parsed = ARN.fullmatch(value) if isinstance(value, str) else None
    if parsed is None or parsed.group(2) != account:
        raise invalid(parameter, value, f"it must be the ARN of a queue of account {account}")
    return parsed.group(3)


# ---- queue attributes -------------------------------------------------------------------------

def invalid_value(name: str, reason: str | None = None) -> SqsError:
    return SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}."
                                             + (f" Reason: {reason}" if reason else ""))


def _number(name: str, value) -> int:
    low, high, _ = NUMERIC[name]
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or not low <= int(value) <= high:
        raise invalid_value(name)
    return int(value)


# FIFO's settings: name -> (allowed values, default)
FIFO_CHOICES = {"ContentBasedDeduplication": (("true", "false"), "false"),
                "DeduplicationScope": (("queue", "messageGroup"), "queue"),
                "FifoThroughputLimit": (("perQueue", "perMessageGroupId"), "perQueue")}


def is_fifo(config: dict) -> bool:
    return (config.get("sqs_attributes") or {}).get("FifoQueue") == "true"


def check_attributes(given: dict, fifo: bool, creating: bool) -> None:
    """Refuse, as AWS does, attribute names SQS does not know or this queue's type does not take."""
    for name in given:
        if name not in SETTABLE | FIFO_ONLY or (not fifo and name in UNKNOWN_ON_STANDARD):
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
        if not fifo and name in FIFO_ONLY:
            raise SqsError("InvalidAttributeName", f"You can specify the {name} only when FifoQueue is set to true.")
        if name == "FifoQueue" and not creating and given[name] != "true":
            raise invalid_value(name, "Modifying queue type is not supported.")


def _encryption(given: dict) -> None:
    """AWS's checks of the encryption attributes."""
    if "KmsDataKeyReusePeriodSeconds" in given:
        _number("KmsDataKeyReusePeriodSeconds", given["KmsDataKeyReusePeriodSeconds"])
    sse = given.get("SqsManagedSseEnabled")
    if sse is not None and sse.lower() not in ("true", "false"):
        raise invalid_value("SqsManagedSseEnabled")
    if given.get("KmsMasterKeyId") and sse is not None and sse.lower() == "true":
        raise SqsError("InvalidAttributeName", "You can use one type of server-side encryption (SSE) at one time. "
                                               "You can either enable KMS SSE or SQS SSE.")


def refuse_encryption(given: dict) -> None:
    """raftq's refusal of attributes that would encrypt, once AWS's checks passed: it keeps
    messages unencrypted (docs/sqs.md), and saying otherwise would be a lie."""
    if given.get("KmsMasterKeyId") or str(given.get("SqsManagedSseEnabled", "")).lower() == "true":
        name = "KmsMasterKeyId" if given.get("KmsMasterKeyId") else "SqsManagedSseEnabled"
        raise invalid_value(name, "raftq does not encrypt messages at rest (docs/sqs.md): a queue's "
                                  "SqsManagedSseEnabled is false and it takes no KmsMasterKeyId.")


def fifo_defaults() -> dict:
    return {"FifoQueue": "true", **{name: default for name, (_, default) in FIFO_CHOICES.items()}}


def config_changes(given: dict, kept: dict, account: str, queue: str, *, creating: bool = False) -> tuple[dict, dict]:
    """(raftq config fields, the new sqs_attributes) for SQS attributes `given`
    on a queue whose sqs_attributes are `kept`. The dead-letter queue's existence
    is the caller's to check (it needs the state)."""
    check_attributes(given, kept.get("FifoQueue") == "true", creating)
    config, kept = {}, dict(kept)
    for name, value in given.items():
        if not isinstance(value, str):
            raise invalid_value(name)
        if name == "VisibilityTimeout":
            config["lease_ms"] = max(1, _number(name, value) * 1000)    # 0: a lease of 1 ms, visible again at once
        elif name == "MessageRetentionPeriod":
            config["ttl_ms"] = _number(name, value) * 1000
        elif name in ENCRYPTION:
            continue
        elif name in NUMERIC:
            kept[name] = str(_number(name, value))
        elif name == "RedrivePolicy":
            config["dead_letter"], config["max_deliveries"] = redrive_policy(value, account, queue)
        elif name == "RedriveAllowPolicy":
            kept[name] = redrive_allow_policy(value)
        elif name == "Policy":
            if value:
                _json_object(name, value)
                kept[name] = value
            else:
                kept.pop(name, None)
        elif name in FIFO_CHOICES:
            if value not in FIFO_CHOICES[name][0]:
                raise invalid_value(name)
            kept[name] = value
    _encryption(given)
    if kept.get("FifoThroughputLimit") == "perMessageGroupId" and kept.get("DeduplicationScope") != "messageGroup":
        raise invalid_value("FifoThroughputLimit", "perMessageGroupId needs DeduplicationScope messageGroup")
    return config, kept


def _json_object(name: str, value: str) -> dict:
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise invalid_value(name)
    return parsed


def invalid_redrive_policy(value: str, reason: str) -> SqsError:
    return invalid("RedrivePolicy", value, reason)


def redrive_policy(value: str, account: str, queue: str) -> tuple[str | None, int | None]:
    """(dead-letter queue, max deliveries); "" (no policy) is (None, None)."""
    if value == "":
        return None, None
    try:
        policy = json.loads(value)
    except ValueError:
        policy = None
    if not isinstance(policy, dict):
        raise SqsError("InvalidParameterValue", "Redrive policy is not a dict or valid json")
    for needed in ("deadLetterTargetArn", "maxReceiveCount"):
        if needed not in policy:
            raise SqsError("InvalidParameterValue", f"Redrive policy does not contain {needed}")
    count = policy["maxReceiveCount"]
    if isinstance(count, str) and count.isascii() and count.isdigit():
        count = int(count)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1000:
        raise invalid_redrive_policy(value, f"Invalid value for maxReceiveCount: {policy['maxReceiveCount']}, valid "
                                            "values are from 1 to 1000 both inclusive.")
    target = ARN.fullmatch(policy["deadLetterTargetArn"]) if isinstance(policy["deadLetterTargetArn"], str) else None
    if target is None or target.group(2) != account:
        raise invalid_redrive_policy(value, "Dead letter target does not exist.")
    if target.group(3) == queue:
        raise invalid_redrive_policy(value, "A queue cannot be its own dead-letter queue.")
    return target.group(3), count


def redrive_allow_policy(value: str) -> str:
    policy = _json_object("RedriveAllowPolicy", value)
    permission = policy.get("redrivePermission")
    if permission not in ("allowAll", "denyAll", "byQueue") or set(policy) - {"redrivePermission", "sourceQueueArns"}:
        raise invalid_value("RedriveAllowPolicy", "redrivePermission must be allowAll, denyAll or byQueue (with "
                                                  "sourceQueueArns)")
    if permission == "byQueue" and not (isinstance(policy.get("sourceQueueArns"), list)
                                        and 1 <= len(policy["sourceQueueArns"]) <= 10):
        raise invalid_value("RedriveAllowPolicy", "byQueue needs 1 to 10 sourceQueueArns")
    return value


def allows_source(allow_policy: str | None, source_arn_name: str, account: str) -> bool:
    """Whether a dead-letter queue's RedriveAllowPolicy lets `source_arn_name` send it dead letters."""
    if not allow_policy:
        return True
    policy = json.loads(allow_policy)
    if policy["redrivePermission"] == "allowAll":
        return True
    if policy["redrivePermission"] == "denyAll":
        return False
    names = set()
    for value in policy["sourceQueueArns"]:
        parsed = ARN.fullmatch(value) if isinstance(value, str) else None
        if parsed is not None and parsed.group(2) == account:
            names.add(parsed.group(3))
    return source_arn_name in names


def render_attributes(info: dict, wanted, region: str, account: str) -> dict:
    """The SQS attributes named in `wanted` (or "All") of a queue whose
    queue_info (config and stats) is `info`."""
    config, stats = info["config"], info["stats"]
    kept = config.get("sqs_attributes") or {}
    default = stats["groups"].get("default", {"depth": 0, "in_flight": 0})
    values = {
        "ApproximateNumberOfMessages": str(default["depth"]),
        "ApproximateNumberOfMessagesNotVisible": str(default["in_flight"]),
        "ApproximateNumberOfMessagesDelayed": str(stats["delayed"]),
        "QueueArn": arn(region, account, info["name"]),
        "VisibilityTimeout": str(config["lease_ms"] // 1000),
        "DelaySeconds": kept.get("DelaySeconds", "0"),
        "MaximumMessageSize": kept.get("MaximumMessageSize", str(DEFAULT_MAX_MESSAGE)),
        "ReceiveMessageWaitTimeSeconds": kept.get("ReceiveMessageWaitTimeSeconds", "0"),
        "SqsManagedSseEnabled": "false",
    }
    if config["ttl_ms"] is not None:
        values["MessageRetentionPeriod"] = str(config["ttl_ms"] // 1000)
    for name in ("CreatedTimestamp", "LastModifiedTimestamp", "Policy", "RedriveAllowPolicy", "FifoQueue",
                 *FIFO_CHOICES):
        if name in kept:
            values[name] = kept[name]
    if config["dead_letter"] is not None and config["max_deliveries"] is not None:
        values["RedrivePolicy"] = json.dumps({"deadLetterTargetArn": arn(region, account, config["dead_letter"]),
                                              "maxReceiveCount": config["max_deliveries"]}, separators=(",", ":"))
    names = wanted or []
    for name in names:
        if name not in READABLE and name != "All":
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
    if "All" in names:
        return values
    return {name: values[name] for name in names if name in values}


def kept_number(config: dict, name: str) -> int:
    return int((config.get("sqs_attributes") or {}).get(name, NUMERIC[name][2]))


# ---- message attributes ----------------------------------------------------------------------

ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}", re.ASCII)
RESERVED_ATTRIBUTE_NAME = re.compile(r"(aws|amazon)\.|\.|.*\.\.|.*\.$", re.ASCII | re.IGNORECASE)
DATA_TYPE = re.compile(r"(String|Number|Binary)(\.[\x21-\x7e]{1,250})?", re.ASCII)
MAX_MESSAGE_ATTRIBUTES = 10
# XML 1.0's characters: what SQS takes in a body or a string attribute
VALID_TEXT = re.compile("[\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")
INVALID_CHARACTERS = ("Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | #x20 to #xD7FF | "
                      "#xE000 to #xFFFD | #x10000 to #x10FFFF")


def is_xml_text(value: str) -> bool:
    return VALID_TEXT.fullmatch(value) is not None


def check_text(value: str, what: str) -> None:
    if not is_xml_text(value):
        raise SqsError("InvalidMessageContents", f"Invalid characters found in {what}: only the characters of "
                                                 "XML 1.0 (#x9, #xA, #xD, #x20 to #xD7FF, #xE000 to #xFFFD, "
                                                 "#x10000 to #x10FFFF) are allowed")


def check_body(body: str) -> None:
    if not VALID_TEXT.fullmatch(body):
        raise SqsError("InvalidMessageContents", INVALID_CHARACTERS)


def check_message_attributes(given) -> tuple[dict, int]:
    """Message attributes as stored and their size as SQS counts it (name, data type and
    value), checked as AWS checks them. Both protocols carry a BinaryValue in base64, and
    so does the stored form."""
    if given is None:
        return {}, 0
    if not isinstance(given, dict):
        raise invalid("MessageAttributes", given, "it must be a map")
    if len(given) > MAX_MESSAGE_ATTRIBUTES:
        raise SqsError("InvalidParameterValue", f"Number of message attributes [{len(given)}] exceeds the allowed "
                                                f"maximum [{MAX_MESSAGE_ATTRIBUTES}].")
    stored, size = {}, 0
    for name, value in given.items():
        if not isinstance(name, str) or not ATTRIBUTE_NAME.fullmatch(name):
            raise SqsError("InvalidParameterValue", f"The message attribute name '{name}' is invalid. Attribute "
                                                    "name can contain A-Z, a-z, 0-9, underscore (_), hyphen (-), "
                                                    "and period (.) characters.")
        if RESERVED_ATTRIBUTE_NAME.match(name):
            raise SqsError("InvalidParameterValue", "You can't use message attribute names beginning with 'AWS.' or "
                                                    "'Amazon.'. These strings are reserved for internal use. "
                                                    "Additionally, they cannot start or end with '.'.")
        if not isinstance(value, dict):
            raise invalid(f"MessageAttributes.{name}", value, "it must have a DataType and a value")
        data_type = value.get("DataType")
        if not data_type:
            raise SqsError("InvalidParameterValue", f"The message attribute '{name}' must contain non-empty message "
                                                    "attribute type.")
        if not isinstance(data_type, str) or not DATA_TYPE.fullmatch(data_type):
            raise SqsError("InvalidParameterValue", f"The type of message (user) attribute '{name}' is invalid. You "
                                                    "must use only the following supported type prefixes: Binary, "
                                                    "Number, String.")
        if value.get("StringListValues") or value.get("BinaryListValues"):
            raise SqsError("UnsupportedOperation", "StringListValues and BinaryListValues are reserved by SQS and "
                                                   "not implemented")
        kind = data_type.split(".", 1)[0]
        empty = SqsError("InvalidParameterValue", f"Message (user) attribute '{name}' must contain a non-empty "
                                                  f"value of type '{kind}'.")
        if kind == "Binary":
            raw = decode_base64(value.get("BinaryValue"), f"MessageAttributes.{name}.BinaryValue") \
                if value.get("BinaryValue") else b""
            if not raw:
                raise empty
            stored[name] = {"DataType": data_type, "BinaryValue": base64.b64encode(raw).decode()}
            length = len(raw)
        else:
            text = value.get("StringValue")
            if not isinstance(text, str) or not text:
                raise empty
            if not VALID_TEXT.fullmatch(text):
                raise SqsError("InvalidParameterValue", INVALID_CHARACTERS)
            if kind == "Number" and not _is_number(text):
                raise SqsError("InvalidParameterValue", f"Can't cast the value of message (user) attribute '{name}' "
                                                        "to a number.")
            stored[name] = {"DataType": data_type, "StringValue": text}
            length = len(text.encode())
        size += len(name.encode()) + len(data_type.encode()) + length
    return stored, size


def stored_attributes(headers: dict) -> dict:
    """The message attributes a message's headers carry, as the SQS door stored them; none when
    what is there is not that (a message an older release let a native client put with
    x-sqs-message-attributes of its own)."""
    raw = headers.get(HEADER_ATTRIBUTES)
    if raw is None:
        return {}
    try:
        stored = json.loads(raw)
        if not isinstance(stored, dict):
            return {}
        checked, _ = check_message_attributes(stored)
    except (ValueError, SqsError):
        return {}
    return checked


NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)


def _is_number(text: str) -> bool:
    if not NUMBER.fullmatch(text):
        return False
    digits = re.sub(r"[eE].*", "", text).lstrip("+-").replace(".", "").lstrip("0")
    try:
        value = float(text)
    except ValueError:
        return False
    return len(digits) <= 38 and (value == 0 or 1e-128 <= abs(value) <= 1e126)


def md5_of_attributes(attributes: dict) -> str:
    """MD5OfMessageAttributes as AWS computes it (and every SDK checks it): for
    each attribute by name, length-prefixed name, type, a transport byte and
    the length-prefixed value."""
    digest = hashlib.md5()
    for name in sorted(attributes):
        value = attributes[name]
        for part in (name.encode(), value["DataType"].encode()):
            digest.update(struct.pack(">I", len(part)) + part)
        if "BinaryValue" in value:
            raw = base64.b64decode(value["BinaryValue"])
            digest.update(b"\x02" + struct.pack(">I", len(raw)) + raw)
        else:
            raw = value["StringValue"].encode()
            digest.update(b"\x01" + struct.pack(">I", len(raw)) + raw)
    return digest.hexdigest()


def md5_of_text(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def select_attributes(stored: dict, wanted) -> dict:
    """The message attributes a receive asked for: All, * or .*, names, or prefixes ending in .*"""
    if not wanted or not stored:
        return {}
    if any(pattern in ("All", "*", ".*") for pattern in wanted):
        return dict(stored)
    prefixes = tuple(pattern[:-2] for pattern in wanted if pattern.endswith(".*"))
    return {name: value for name, value in stored.items() if name in wanted or name.startswith(prefixes)}


def decode_base64(value, parameter: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise invalid(parameter, value, "it is not base64") from None

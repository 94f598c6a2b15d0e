"""The SQS actions on messages: send, receive, delete and change visibility, alone or in batches."""

import base64
import hashlib
import re
import time
import uuid

import orjson

from .. import commands
from ..errors import ApiError
from ..forwarding import client_of
from ..keys import GROUP, SETTINGS
from ..receipts import Opened, well_formed
from . import attributes as attrs
from .errors import SqsError, invalid, missing
from .context import Context, from_native, integer, local_info, queue_of, string_list, write


MAX_BATCH = 10
MAX_BATCH_BYTES = 1_048_576
BATCH_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
SYSTEM_ATTRIBUTES = ("SenderId", "SentTimestamp", "ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp",
                     "AWSTraceHeader")
FIFO_SYSTEM_ATTRIBUTES = ("SequenceNumber", "MessageDeduplicationId", "MessageGroupId")


def _system_attributes(params: dict) -> tuple[dict, int]:
    given = params.get("MessageSystemAttributes") or {}
    if not isinstance(given, dict) or set(given) - {"AWSTraceHeader"}:
        raise invalid("MessageSystemAttributes", given, "the only message system attribute is AWSTraceHeader")
    if not given:
        return {}, 0
    value = given["AWSTraceHeader"]
    if not isinstance(value, dict) or value.get("DataType") != "String" or not isinstance(
            value.get("StringValue"), str) or not value["StringValue"]:
        raise invalid("MessageSystemAttributes.AWSTraceHeader", value, "it must be a String")
    trace = value["StringValue"]
    attrs.check_text(trace, "message system attribute AWSTraceHeader")
    # it is stored and delivered with the message: its bytes count toward the message's size
    return {"AWSTraceHeader": {"DataType": "String", "StringValue": trace}}, len(trace.encode())


FIFO_ID = re.compile(r"[\x21-\x7e]{1,128}", re.ASCII)


def _fifo_id(params: dict, name: str) -> str | None:
    value = params.get(name)
    if value is not None and (not isinstance(value, str) or not FIFO_ID.fullmatch(value)):
        raise invalid(name, value, "it is 1 to 128 letters, digits and punctuation")
    return value


def _message(ctx: Context, params: dict, info: dict) -> tuple[dict, dict, int]:
    """(the raftq message, the SQS reply's fields, its size: body, attributes and
    AWSTraceHeader) for one SendMessage or batch entry."""
    body = params.get("MessageBody")
    if body is None or body == "":
        raise missing("MessageBody")
    if not isinstance(body, str):
        raise invalid("MessageBody", body, "it must be a string")
    attrs.check_text(body, "the message body")
    fifo = attrs.is_fifo(info["config"])
    group, dedup = _fifo_id(params, "MessageGroupId"), _fifo_id(params, "MessageDeduplicationId")
    if not fifo and dedup is not None:
        raise invalid("MessageDeduplicationId", dedup, "the request includes a parameter that is not valid for "
                                                       "this queue type (standard)")
    if fifo and group is None:
        raise missing("MessageGroupId")
    if fifo and params.get("DelaySeconds") is not None:
        raise invalid("DelaySeconds", params["DelaySeconds"], "the request includes a parameter that is not valid "
                                                              "for this queue type (FIFO: set the queue's DelaySeconds)")
    message_attributes, size = attrs.check_message_attributes(params.get("MessageAttributes"))
    system, system_size = _system_attributes(params)
    size += len(body.encode()) + system_size
    limit = min(attrs.kept_number(info["config"], "MaximumMessageSize"), ctx.app[SETTINGS].max_message_bytes)
    if size > limit:
        raise invalid("MessageBody", "...", f"Message must be shorter than {limit} bytes (body, attributes and "
                                            "AWSTraceHeader)")
    delay = integer(params, "DelaySeconds", 0, 900, attrs.kept_number(info["config"], "DelaySeconds"))
    message = {"body": body}
    if fifo:
        kept = info["config"]["sqs_attributes"]
        if dedup is None:
            if kept.get("ContentBasedDeduplication") != "true":
                raise invalid("MessageDeduplicationId", "", "The queue should either have ContentBasedDeduplication "
                                                            "enabled or MessageDeduplicationId provided explicitly")
            dedup = hashlib.sha256(body.encode()).hexdigest()
        # raftq's idempotent id: a duplicate within the window stores nothing and
        # answers the first one's seq; its MessageId follows from the id, so it is the first's too
        message["id"] = f"{len(group)}:{group}:{dedup}" if kept.get("DeduplicationScope") == "messageGroup" else dedup
        message["ordering_key"] = group
        message_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"raftq-sqs:{info['name']}:"
                                                        f"{kept.get('CreatedTimestamp')}:{message['id']}"))
    else:
        message_id = str(uuid.uuid4())
    headers = {attrs.HEADER_ID: message_id, attrs.HEADER_SENDER: ctx.signer.key.access_key}
    if dedup is not None:
        headers[attrs.HEADER_DEDUPLICATION] = dedup
    if group is not None and not fifo:
        headers[attrs.HEADER_GROUP] = group     # a standard queue's group orders nothing (SQS's fair queues)
    reply = {"MessageId": message_id, "MD5OfMessageBody": attrs.md5_of_text(body)}
    if message_attributes:
        headers[attrs.HEADER_ATTRIBUTES] = orjson.dumps(message_attributes).decode()
        reply["MD5OfMessageAttributes"] = attrs.md5_of_attributes(message_attributes)
    if system:
        headers[attrs.HEADER_TRACE] = system["AWSTraceHeader"]["StringValue"]
        reply["MD5OfMessageSystemAttributes"] = attrs.md5_of_attributes(system)
    message["headers"] = headers
    if delay:
        message["delay_ms"] = delay * 1000
    return message, reply, size


def _put(name: str, messages: list) -> dict:
    return {"op": "put", "queue": name, "messages": messages, "auto_create": False}


def _sequence_number(seq: int) -> str:
    return str(seq).zfill(20)


async def send_message(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    info = await local_info(ctx, name)
    message, reply, _ = _message(ctx, params, info)
    stored = (await write(ctx, _put(name, [message])))["messages"]
    if attrs.is_fifo(info["config"]):
        reply["SequenceNumber"] = _sequence_number(stored[0]["seq"])
    return reply


def _entries(params: dict) -> list:
    entries = params.get("Entries")
    if not entries:
        raise SqsError("EmptyBatchRequest", "There should be at least one entry in the request.")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise invalid("Entries", entries, "it must be a list of entries")
    if len(entries) > MAX_BATCH:
        raise SqsError("TooManyEntriesInBatchRequest", f"Maximum number of entries per request are {MAX_BATCH}. "
                                                       f"You have sent {len(entries)}.")
    ids = []
    for entry in entries:
        entry_id = entry.get("Id")
        if not isinstance(entry_id, str) or not 1 <= len(entry_id) <= 80 or not set(entry_id) <= BATCH_ID_CHARS:
            raise SqsError("InvalidBatchEntryId", "A batch entry id can only contain alphanumeric characters, "
                                                  "hyphens and underscores. It can be at most 80 letters long.")
        ids.append(entry_id)
    if len(set(ids)) != len(ids):
        raise SqsError("BatchEntryIdsNotDistinct", "Two or more batch entries in the request have the same Id.")
    return entries


def _entry_bytes(entry: dict) -> int:
    """What a batch entry that was refused on its own weighs toward the batch's cap: the strings
    of its body, attributes and system attributes, whatever their shape."""
    total, left = 0, [entry.get(field) for field in ("MessageBody", "MessageAttributes", "MessageSystemAttributes")]
    while left:      # a loop, not recursion: the JSON may nest as deep as orjson takes
        value = left.pop()
        if isinstance(value, str):
            total += len(value.encode())
        elif isinstance(value, dict):
            left.extend(value)
            left.extend(value.values())
        elif isinstance(value, list):
            left.extend(value)
    return total


def _failed(entry_id: str, error: SqsError) -> dict:
    return {"Id": entry_id, "SenderFault": error.sender_fault, "Code": error.code, "Message": error.message}


async def send_message_batch(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    entries = _entries(params)
    info = await local_info(ctx, name)
    messages, replies, failed, total = [], [], [], 0
    for entry in entries:
        try:
            message, reply, size = _message(ctx, entry, info)
        except SqsError as exc:
            failed.append(_failed(entry["Id"], exc))
            total += _entry_bytes(entry)
            continue
        total += size
        messages.append(message)
        replies.append({"Id": entry["Id"], **reply})
    if total > MAX_BATCH_BYTES:
        raise SqsError("BatchRequestTooLong", f"Batch requests cannot be longer than {MAX_BATCH_BYTES} bytes "
                                              f"(bodies, attributes and AWSTraceHeaders). You have sent {total} "
                                              "bytes.")
    if messages:
        stored = (await write(ctx, _put(name, messages)))["messages"]
        if attrs.is_fifo(info["config"]):
            for reply, result in zip(replies, stored):
                reply["SequenceNumber"] = _sequence_number(result["seq"])
    return {"Successful": replies, "Failed": failed}


def body_text(body) -> str:
    """A stored body as SQS text: raftq's native puts may hold bytes or JSON data, and text that is
    not XML 1.0's (a NUL, a bell; the SQS door refuses such a body, the native API takes it).
    Bytes are their UTF-8 text; JSON data its JSON text; and what is not XML text after that, its
    UTF-8 in base64, on either protocol alike."""
    if isinstance(body, bytes):
        try:
            text = body.decode()
        except UnicodeDecodeError:
            return base64.b64encode(body).decode()
    else:
        text = body if isinstance(body, str) else orjson.dumps(body).decode()
    return text if attrs.is_xml_text(text) else base64.b64encode(text.encode()).decode()


def rendered(name: str, message: dict, wanted_system: set, wanted_attributes: list, received_at: str) -> dict:
    """One received message as ReceiveMessage answers it. Whatever its headers hold (a message
    stored by an older release, whose native API let a client set x-sqs-* headers), this raises
    nothing: the receive has leased it already."""
    headers = message["headers"] or {}
    body = body_text(message["body"])
    message_id = headers.get(attrs.HEADER_ID) or str(uuid.uuid5(uuid.NAMESPACE_URL, f"raftq:{name}:{message['seq']}"))
    out = {"MessageId": message_id, "ReceiptHandle": message["receipt"], "MD5OfBody": attrs.md5_of_text(body),
           "Body": body}
    system = {"SentTimestamp": str(message["put_at_ms"]), "ApproximateReceiveCount": str(message["deliveries"]),
              # None only for a message first received before raftq kept that time
              "ApproximateFirstReceiveTimestamp": str(message.get("first_received_at_ms") or received_at)}
    if attrs.HEADER_SENDER in headers:
        system["SenderId"] = headers[attrs.HEADER_SENDER]
    if attrs.HEADER_TRACE in headers:
        system["AWSTraceHeader"] = headers[attrs.HEADER_TRACE]
    group = message.get("ordering_key") or headers.get(attrs.HEADER_GROUP)
    if group is not None:
        system["MessageGroupId"] = group
    if attrs.HEADER_DEDUPLICATION in headers:
        system["MessageDeduplicationId"] = headers[attrs.HEADER_DEDUPLICATION]
    if message.get("ordering_key") is not None:
        system["SequenceNumber"] = _sequence_number(message["seq"])
    chosen = {k: v for k, v in system.items() if "All" in wanted_system or k in wanted_system}
    if chosen:
        out["Attributes"] = chosen
    selected = attrs.select_attributes(attrs.stored_attributes(headers), wanted_attributes)
    if selected:
        out["MD5OfMessageAttributes"] = attrs.md5_of_attributes(selected)
        out["MessageAttributes"] = selected
    return out


async def receive_message(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    count = integer(params, "MaxNumberOfMessages", 1, 10, 1)
    visibility = integer(params, "VisibilityTimeout", 0, 43_200)
    wait = integer(params, "WaitTimeSeconds", 0, 20)
    if wait is None:
        wait = attrs.kept_number((await local_info(ctx, name))["config"], "ReceiveMessageWaitTimeSeconds")
    wanted_system = set(string_list(params, "AttributeNames")) | set(string_list(params, "MessageSystemAttributeNames"))
    unknown = wanted_system - set(SYSTEM_ATTRIBUTES) - set(FIFO_SYSTEM_ATTRIBUTES) - {"All"}
    if unknown:
        raise SqsError("InvalidAttributeName", f"Unknown Attribute {sorted(unknown)[0]}.")
    wanted_attributes = string_list(params, "MessageAttributeNames")
    command = {"op": "receive", "queue": name, "group": "default", "max": count,
               "lease_ms": None if visibility is None else max(1, visibility * 1000)}
    try:
        committed = await commands.receive_waiting(ctx.app, ctx.request[GROUP], command, wait,
                                                 client=client_of(ctx.request))
    except ApiError as exc:
        raise from_native(exc) from None
    result = committed.result
    if "error" in result:
        raise from_native(ApiError(result["error"], result.get("message", "")))
    received_at = str(int(time.time() * 1000))
    if not result["messages"]:
        return {}     # AWS leaves out an empty list
    return {"Messages": [rendered(name, m, wanted_system, wanted_attributes, received_at)
                         for m in result["messages"]]}


def _receipt(handle) -> str:
    if not isinstance(handle, str) or not handle:
        raise missing("ReceiptHandle")
    if not well_formed(handle):
        raise SqsError("ReceiptHandleIsInvalid", f"The input receipt handle {handle!r} is not a valid receipt handle.")
    return handle


async def _settle(ctx: Context, command: dict) -> list:
    """The receipts of `command` that named no lease that still holds (or whose MAC does not hold)."""
    opened = Opened(ctx.app)
    try:
        result = (await commands.write(ctx.request, {**command, "receipts": opened.open(command["queue"],
                                                                                      command["receipts"])})).result
        return opened.given(result["stale"])
    except ApiError as exc:
        if exc.code == "stale_receipt":
            return opened.given(exc.details.get("stale", []))
        raise from_native(exc) from None


async def delete_message(ctx: Context, params: dict) -> dict:
    # A receipt whose lease has ended deletes nothing and is not an error: SQS's
    # own rule (the message may have been received again since).
    await _settle(ctx, {"op": "ack", "queue": queue_of(ctx, params), "receipts": [_receipt(params.get("ReceiptHandle"))]})
    return {}


async def delete_message_batch(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    good, failed = [], []
    for entry in _entries(params):
        try:
            good.append((entry["Id"], _receipt(entry.get("ReceiptHandle"))))
        except SqsError as exc:
            failed.append(_failed(entry["Id"], exc))
    if good:
        await _settle(ctx, {"op": "ack", "queue": name, "receipts": [r for _, r in good]})
    return {"Successful": [{"Id": i} for i, _ in good], "Failed": failed}


def _visibility_command(name: str, receipts: list, seconds: int) -> dict:
    if seconds == 0:
        return {"op": "nack", "queue": name, "receipts": receipts}
    return {"op": "extend", "queue": name, "receipts": receipts, "lease_ms": seconds * 1000}


def _not_in_flight(handle: str) -> SqsError:
    return SqsError("MessageNotInflight", f"The message of receipt handle {handle!r} is not in flight (its "
                                          "visibility timeout ended, or it was deleted).")


async def change_message_visibility(ctx: Context, params: dict) -> dict:
    handle = _receipt(params.get("ReceiptHandle"))
    seconds = integer(params, "VisibilityTimeout", 0, 43_200)
    if seconds is None:
        raise missing("VisibilityTimeout")
    if await _settle(ctx, _visibility_command(queue_of(ctx, params), [handle], seconds)):
        raise _not_in_flight(handle)
    return {}


async def change_message_visibility_batch(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    by_timeout: dict[int, list] = {}
    failed = []
    for entry in _entries(params):
        try:
            handle = _receipt(entry.get("ReceiptHandle"))
            seconds = integer(entry, "VisibilityTimeout", 0, 43_200)
            if seconds is None:
                raise missing("VisibilityTimeout")
        except SqsError as exc:
            failed.append(_failed(entry["Id"], exc))
            continue
        by_timeout.setdefault(seconds, []).append((entry["Id"], handle))
    done = []
    for seconds, batch in by_timeout.items():
        stale = set(await _settle(ctx, _visibility_command(name, [h for _, h in batch], seconds)))
        for entry_id, handle in batch:
            if handle in stale:
                failed.append(_failed(entry_id, _not_in_flight(handle)))
            else:
                done.append({"Id": entry_id})
    return {"Successful": done, "Failed": failed}

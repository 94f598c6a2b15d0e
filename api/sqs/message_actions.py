"""The SQS actions on messages: send, receive, delete and change visibility, alone or in batches."""

import base64
import binascii
import hashlib
import time
import uuid

import orjson

from .. import commands
from ..errors import ApiError
from ..forwarding import client_of
from ..keys import GROUP, GROUPS, SETTINGS
from ..receipt_mode import MODE
from ..receipts import RECEIPTS, Opened, well_formed
from . import attributes as attrs
from . import validation
from .errors import SqsError, invalid, missing
from .context import Context, from_native, local_info, queue_of, read, string_list, write


MAX_BATCH = validation.MAX_BATCH
MAX_BATCH_BYTES = 1_048_576
SYSTEM_ATTRIBUTES = ("SenderId", "SentTimestamp", "ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp",
                     "AWSTraceHeader")
FIFO_SYSTEM_ATTRIBUTES = ("SequenceNumber", "MessageDeduplicationId", "MessageGroupId")


def _system_attributes(params: dict) -> dict:
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


def _size_refusal(limit: int, in_batch: bool) -> SqsError:
    # AWS's words differ between a send and a batch's entry
    verb = "cannot be validated" if in_batch else "are invalid"
    return SqsError("InvalidParameterValue", f"One or more parameters {verb}. Reason: Message must be shorter than "
                                             f"{limit} bytes.")


def _message(ctx: Context, params: dict, info: dict, in_batch: bool = False) -> tuple[dict, dict, int]:
    """(the raftq message, the SQS reply's fields, its size: body, attributes and
    AWSTraceHeader) for one SendMessage or batch entry, checked in AWS's order."""
    body = params.get("MessageBody")
    if body is None or body == "":
        raise missing("MessageBody")
    if not isinstance(body, str):
        raise invalid("MessageBody", body, "it must be a string")
    message_attributes, size = attrs.check_message_attributes(params.get("MessageAttributes"))
    size += len(body.encode())
    limit = min(attrs.kept_number(info["config"], "MaximumMessageSize"), ctx.app[SETTINGS].max_message_bytes)
    if size > limit:
        raise _size_refusal(limit, in_batch)
    attrs.check_body(body)
    system, system_size = _system_attributes(params)
    # the trace header is stored and delivered with the message: raftq counts it toward the size
    # (AWS does not; docs/sqs.md)
    size += system_size
    if size > limit:
        raise _size_refusal(limit, in_batch)
    dedup = validation.fifo_id(params, "MessageDeduplicationId")
    group = validation.fifo_id(params, "MessageGroupId")
    fifo = attrs.is_fifo(info["config"])
    if not fifo and dedup is not None:
        raise invalid("MessageDeduplicationId", dedup, "The request include parameter that is not valid for this "
                                                       "queue type.")
    if fifo and params.get("DelaySeconds") not in (None, 0, "0"):
        # a FIFO queue's delay is the queue's; an explicit 0 is taken
        raise invalid("DelaySeconds", params["DelaySeconds"], "The request include parameter that is not valid for "
                                                              "this queue type.")
    delay = validation.integer(params, "DelaySeconds", attrs.kept_number(info["config"], "DelaySeconds"))
    message = {"body": body}
    if fifo:
        kept = info["config"]["sqs_attributes"]
        if group is None:
            raise missing("MessageGroupId")
        if dedup is None:
            if kept.get("ContentBasedDeduplication") != "true":
                raise SqsError("InvalidParameterValue", "The queue should either have ContentBasedDeduplication "
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
    # the members in the order of AWS's model, which the query protocol's XML follows
    reply = {"MD5OfMessageBody": attrs.md5_of_text(body)}
    if message_attributes:
        headers[attrs.HEADER_ATTRIBUTES] = orjson.dumps(message_attributes).decode()
        reply["MD5OfMessageAttributes"] = attrs.md5_of_attributes(message_attributes)
    if system:
        headers[attrs.HEADER_TRACE] = system["AWSTraceHeader"]["StringValue"]
        reply["MD5OfMessageSystemAttributes"] = attrs.md5_of_attributes(system)
    reply["MessageId"] = message_id
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


def _loose_size(entry: dict) -> int:
    """An entry's size as AWS sums a batch before it checks any entry: body, and each
    attribute's name, type and value; and, as raftq counts it, its AWSTraceHeader."""
    size = len(str(entry.get("MessageBody") or "").encode())
    system = entry.get("MessageSystemAttributes")
    trace = system.get("AWSTraceHeader") if isinstance(system, dict) else None
    if isinstance(trace, dict):
        size += len(str(trace.get("StringValue") or "").encode())
    attributes = entry.get("MessageAttributes")
    for name, value in (attributes.items() if isinstance(attributes, dict) else ()):
        size += len(str(name).encode())
        if isinstance(value, dict):
            for field in ("DataType", "StringValue"):
                size += len(str(value.get(field) or "").encode())
            try:
                size += len(base64.b64decode(value.get("BinaryValue") or b"", validate=True))
            except (binascii.Error, ValueError, TypeError):
                size += len(str(value.get("BinaryValue")).encode())
    return size


def _send_entries(params: dict, info: dict) -> list:
    """SendMessageBatch's entries, refused whole as AWS refuses them: the batch's own checks,
    on a FIFO queue an entry without the ids it needs, and more than 1 MiB in all."""
    entries = validation.batch_entries("SendMessageBatch", params)
    if attrs.is_fifo(info["config"]):
        content_based = info["config"]["sqs_attributes"].get("ContentBasedDeduplication") == "true"
        for entry in entries:
            if not entry.get("MessageGroupId"):
                raise SqsError("InvalidParameterValue", "The request must contain the parameter MessageGroupId.")
            if not content_based and not entry.get("MessageDeduplicationId"):
                raise SqsError("InvalidParameterValue", "The queue should either have ContentBasedDeduplication "
                                                        "enabled or MessageDeduplicationId provided explicitly")
    total = sum(_loose_size(entry) for entry in entries)
    if total > MAX_BATCH_BYTES:
        raise SqsError("BatchRequestTooLong", f"Batch requests cannot be longer than {MAX_BATCH_BYTES} bytes. "
                                              f"You have sent {total} bytes.")
    return entries


def _failed(entry_id: str, error: SqsError) -> dict:
    return {"Id": entry_id, "SenderFault": error.sender_fault, "Code": error.query_code, "Message": error.message}


async def send_message_batch(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    info = await local_info(ctx, name)
    entries = _send_entries(params, info)
    messages, replies, failed = [], [], []
    for entry in entries:
        try:
            message, reply, _ = _message(ctx, entry, info, in_batch=True)
        except SqsError as exc:
            failed.append(_failed(entry["Id"], exc))
            continue
        messages.append(message)
        replies.append({"Id": entry["Id"], "MessageId": reply.pop("MessageId"), **reply})
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


def rendered(name: str, message: dict, wanted_system: set, wanted_attributes: list, received_at: str,
             walls: dict) -> dict:
    """One received message as ReceiveMessage answers it, its timestamps the wall times `walls`
    maps their log times to. Whatever its headers hold (a message stored by an older release,
    whose native API let a client set x-sqs-* headers), this raises nothing: the receive has
    leased it already."""
    headers = message["headers"] or {}
    body = body_text(message["body"])
    message_id = headers.get(attrs.HEADER_ID) or str(uuid.uuid5(uuid.NAMESPACE_URL, f"raftq:{name}:{message['seq']}"))
    out = {"MessageId": message_id, "ReceiptHandle": message["receipt"], "MD5OfBody": attrs.md5_of_text(body),
           "Body": body}
    first_received = message.get("first_received_at_ms")
    system = {"SentTimestamp": str(walls[message["put_at_ms"]]), "ApproximateReceiveCount": str(message["deliveries"]),
              # None only for a message first received before raftq kept that time
              "ApproximateFirstReceiveTimestamp": str(walls[first_received] if first_received else received_at)}
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
    info = await local_info(ctx, name)
    count = validation.integer(params, "MaxNumberOfMessages", 1)
    wait = validation.integer(params, "WaitTimeSeconds", attrs.kept_number(info["config"],
                                                                           "ReceiveMessageWaitTimeSeconds"))
    visibility = validation.integer(params, "VisibilityTimeout")
    # names SQS does not know are ignored, as AWS ignores them
    wanted_system = set(string_list(params, "AttributeNames")) | set(string_list(params, "MessageSystemAttributeNames"))
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
    walls = await _wall_times(ctx, result["messages"])
    return {"Messages": [rendered(name, m, wanted_system, wanted_attributes, received_at, walls)
                         for m in result["messages"]]}


async def _wall_times(ctx: Context, messages: list) -> dict:
    """The wall time of each log time the messages' timestamps show (statemachine/wall.py): log
    time lags the wall clock by every time the whole cluster was down, AWS's timestamps do not."""
    times = sorted({t for m in messages for t in (m["put_at_ms"], m.get("first_received_at_ms")) if t})
    walls, _ = await ctx.app[GROUPS].engines[ctx.request[GROUP]].read("wall_times", times)
    return dict(zip(times, walls))


def _receipt(handle) -> str:
    if not isinstance(handle, str) or not handle:
        raise missing("ReceiptHandle")
    if not well_formed(handle):
        raise SqsError("ReceiptHandleIsInvalid", f"The input receipt handle '{handle}' is not a valid receipt handle.")
    return handle


def _expired(handle: str) -> SqsError:
    return invalid("ReceiptHandle", handle, "The receipt handle has expired.")


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


def _stale_refused(info: dict) -> bool:
    """Whether a receipt whose lease has ended is refused (a FIFO queue's, as AWS's) rather than
    taken with nothing done (a standard queue's: SQS's rule, the message may have been received
    again since)."""
    return attrs.is_fifo(info["config"])


async def delete_message(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    info = await local_info(ctx, name)
    handle = _receipt(params.get("ReceiptHandle"))
    if await _settle(ctx, {"op": "ack", "queue": name, "receipts": [handle]}) and _stale_refused(info):
        raise _expired(handle)
    return {}


async def delete_message_batch(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    info = await local_info(ctx, name)
    good, failed = [], []
    for entry in validation.batch_entries("DeleteMessageBatch", params):
        try:
            good.append((entry["Id"], _receipt(entry.get("ReceiptHandle"))))
        except SqsError as exc:
            failed.append(_failed(entry["Id"], exc))
    done = []
    if good:
        stale = set(await _settle(ctx, {"op": "ack", "queue": name, "receipts": [r for _, r in good]}))
        refused = _stale_refused(info)
        for entry_id, handle in good:
            if refused and handle in stale:
                failed.append(_failed(entry_id, _expired(handle)))
            else:
                done.append({"Id": entry_id})
    return {"Successful": done, "Failed": failed}


def _visibility_command(name: str, receipts: list, seconds: int) -> dict:
    if seconds == 0:   # visible at once, as on AWS: a delay of its own, whatever the queue's back-off
        return {"op": "nack", "queue": name, "receipts": receipts, "delay_ms": 0}
    return {"op": "extend", "queue": name, "receipts": receipts, "lease_ms": seconds * 1000}


def _gone(handle: str) -> SqsError:
    return invalid("ReceiptHandle", handle, "Message does not exist or is not available for visibility timeout change.")


async def _visibility_refusal(ctx: Context, name: str, info: dict, handle: str) -> SqsError | None:
    """AWS's answer to a visibility change whose receipt names no lease that holds: a message
    gone (deleted, or moved) is refused; one still in the queue is not, on a standard queue (its
    visibility timeout ended, and the change does nothing), and is expired, on a FIFO queue."""
    inside = ctx.app[RECEIPTS].open(name, handle, unsealed_too=ctx.app[MODE].mixed)
    if inside is None:
        # its MAC does not hold: it names no message of this queue
        return _gone(handle)
    seq = int(inside.split(":")[2])
    held = await read(ctx, "browse", name, "default", seq, 1)
    if not any(message["seq"] == seq for message in held["messages"]):
        return _gone(handle)
    return _expired(handle) if _stale_refused(info) else None


async def change_message_visibility(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    info = await local_info(ctx, name)
    seconds = validation.integer(params, "VisibilityTimeout")
    handle = _receipt(params.get("ReceiptHandle"))
    if await _settle(ctx, _visibility_command(name, [handle], seconds)):
        refusal = await _visibility_refusal(ctx, name, info, handle)
        if refusal is not None:
            raise refusal
    return {}


async def change_message_visibility_batch(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    info = await local_info(ctx, name)
    by_timeout: dict[int, list] = {}
    failed = []
    for entry in validation.batch_entries("ChangeMessageVisibilityBatch", params):
        try:
            handle = _receipt(entry.get("ReceiptHandle"))
            seconds = validation.integer(entry, "VisibilityTimeout")
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
            refusal = await _visibility_refusal(ctx, name, info, handle) if handle in stale else None
            if refusal is not None:
                failed.append(_failed(entry_id, refusal))
            else:
                done.append({"Id": entry_id})
    return {"Successful": done, "Failed": failed}

"""The SQS actions, each onto raftq's operations through the log.

Every action names the queues it touches (its ``Action.target``), which
choose the Raft group that serves it (issue 24); it runs on that group's
leader (service.py forwards there; ListQueues gathers over the groups), and goes through
the same calls as the native API: ``commands.write`` for a change (answered once
a majority has it in its fsynced journal), ``commands.leader_read`` for a read
confirmed by a majority, ``commands.receive_waiting`` for a long poll.  SQS's
names onto raftq's: a queue is a queue (its ``default`` consumer group), a
visibility timeout a lease, a receipt handle a receipt, DeleteMessage an ack,
ChangeMessageVisibility an extend (or a nack at 0), PurgeQueue a commit of the
group's cursor past the last message.
"""

import base64
import hashlib
import re
import time
import uuid
from dataclasses import dataclass
from typing import Awaitable, Callable
from urllib.parse import urlsplit

import orjson
from aiohttp import web

from statemachine.queue import parse_receipt
from wire_format import is_name

from .. import commands, gather, leader
from ..errors import ApiError
from ..keys import GROUP, GROUPS, SETTINGS
from . import attributes as attrs
from .errors import SqsError, invalid, missing
from .sigv4 import Signer

MAX_BATCH = 10
MAX_BATCH_BYTES = 1_048_576
MAX_LIST = 1_000
BATCH_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
SYSTEM_ATTRIBUTES = ("SenderId", "SentTimestamp", "ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp",
                     "AWSTraceHeader")
FIFO_SYSTEM_ATTRIBUTES = ("SequenceNumber", "MessageDeduplicationId", "MessageGroupId")
NO_QUEUE = "The specified queue does not exist."


@dataclass(frozen=True)
class Context:
    request: web.Request
    signer: Signer

    @property
    def app(self) -> web.Application:
        return self.request.app

    @property
    def account(self) -> str:
        return self.app[SETTINGS].sqs.account

    def queue_url(self, name: str) -> str:
        return f"{self.request.scheme}://{self.request.host}/{self.account}/{name}"

    def arn(self, name: str) -> str:
        return attrs.arn(self.signer.region, self.account, name)


# ---- calls into raftq, their refusals as SQS errors ---------------------------------------------

NATIVE = {"not_found": ("QueueDoesNotExist", NO_QUEUE), "queue_full": ("OverLimit", None),
          "limit_reached": ("OverLimit", None), "too_many_waiters": ("OverLimit", None),
          "bad_request": ("InvalidParameterValue", None), "too_large": ("InvalidParameterValue", None),
          "conflict": ("QueueNameExists", None), "no_quorum": ("ServiceUnavailable", None),
          "timeout": ("ServiceUnavailable", None)}


def from_native(exc: ApiError) -> SqsError:
    code, message = NATIVE.get(exc.code, ("InternalError", None))
    return SqsError(code, message or exc.message)


async def write(ctx: Context, command: dict):
    try:
        return (await commands.write(ctx.request, command)).result
    except ApiError as exc:
        raise from_native(exc) from None


async def read(ctx: Context, query: str, *args):
    try:
        result = await commands.leader_read(ctx.app, ctx.request[GROUP], query, *args)
    except ApiError as exc:
        raise from_native(exc) from None
    if isinstance(result, dict) and "error" in result:
        raise from_native(ApiError(result["error"], result.get("message", "")))
    return result


async def local_info(ctx: Context, name: str) -> dict:
    """A queue's config and stats as this (leading) node has applied them: no
    round to the majority, for what a send or receive needs of its settings.
    A queue it does not find is looked for again by a confirmed read: a leader
    just elected may not have applied the entry that created it yet."""
    result, _ = await ctx.app[GROUPS].engines[ctx.request[GROUP]].read("queue_info", name)
    if "error" in result:
        return await read(ctx, "queue_info", name)
    return result


# ---- parameters -----------------------------------------------------------------------------------

def required(params: dict, name: str):
    value = params.get(name)
    if value is None or value == "":
        raise missing(name)
    return value


def text(params: dict, name: str, default=None):
    value = params.get(name, default)
    if value is not None and not isinstance(value, str):
        raise invalid(name, value, "it must be a string")
    return value


def integer(params: dict, name: str, low: int, high: int, default=None):
    """An integer parameter: JSON numbers, or the query protocol's digit strings."""
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, str) and value.strip().lstrip("-").isascii() and value.strip().lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise invalid(name, value, f"it must be an integer from {low} to {high}")
    return value


def string_list(params: dict, name: str) -> list:
    value = params.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid(name, value, "it must be a list of strings")
    return value


def string_map(params: dict, name: str) -> dict:
    value = params.get(name) or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise invalid(name, value, "it must map strings to strings")
    return value


def queue_of(ctx: Context, params: dict) -> str:
    """The queue a QueueUrl names (any node's address: only the path counts)."""
    url = text(params, "QueueUrl")
    if not url:
        raise missing("QueueUrl")
    parts = urlsplit(url).path.strip("/").split("/")
    if len(parts) != 2 or not parts[0].isdigit() or not parts[1]:
        raise SqsError("InvalidAddress", f"{url!r} is not a queue URL (http://<node>/<account>/<queue>)")
    if parts[0] != ctx.account or not attrs.QUEUE_NAME.fullmatch(parts[1].removesuffix(".fifo")):
        raise SqsError("QueueDoesNotExist", f"{NO_QUEUE} ({url!r} names no queue of account {ctx.account})")
    return parts[1]


def checked_name(name: str, fifo: bool) -> str:
    if not isinstance(name, str) or not attrs.QUEUE_NAME.fullmatch(name.removesuffix(".fifo")) or len(name) > 80:
        raise invalid("QueueName", name, "a queue name is 1 to 80 letters, digits, '-' and '_' (and a FIFO "
                                         "queue's ends with .fifo)")
    if name.endswith(".fifo") != fifo:
        raise invalid("QueueName", name, "a FIFO queue (FifoQueue=true) has a name ending with .fifo, and only "
                                         "a FIFO queue has")
    return name


def now_s() -> str:
    return str(int(time.time()))


# ---- queues ---------------------------------------------------------------------------------------------

async def _check_dead_letter(ctx: Context, config: dict, source: str, fifo: bool) -> None:
    target = config.get("dead_letter")
    if target is None:
        return
    try:
        info = await read(ctx, "queue_info", target)
    except SqsError as exc:
        if exc.code != "QueueDoesNotExist":
            raise
        raise SqsError("InvalidParameterValue", "Value for parameter RedrivePolicy is invalid. Reason: Dead "
                                                "letter target does not exist.") from None
    if attrs.is_fifo(info["config"]) != fifo:
        raise SqsError("InvalidParameterValue", "Value for parameter RedrivePolicy is invalid. Reason: the "
                                                "dead-letter queue of a FIFO queue must be a FIFO queue, and that "
                                                "of a standard queue a standard queue.")
    allow = (info["config"].get("sqs_attributes") or {}).get("RedriveAllowPolicy")
    if not attrs.allows_source(allow, source, ctx.account):
        raise SqsError("InvalidParameterValue", f"Value for parameter RedrivePolicy is invalid. Reason: the "
                                                f"RedriveAllowPolicy of {target} does not allow {source}.")


def _tags(params: dict, name: str) -> dict:
    tags = string_map(params, name)
    if len(tags) > 50 or not all(1 <= len(k) <= 128 and len(v) <= 256 for k, v in tags.items()):
        raise invalid(name, "...", "a queue has at most 50 tags, keys of 1 to 128 and values of at most 256 "
                                   "characters")
    return tags


def _matches(info: dict, given: dict, ctx: Context) -> bool:
    """Whether an existing queue already has every attribute `given` (CreateQueue's idempotency)."""
    shown = attrs.render_attributes(info, ["All"], ctx.signer.region, ctx.account)
    for name, value in given.items():
        if name == "FifoQueue":
            if (value == "true") != attrs.is_fifo(info["config"]):
                return False
        elif name == "RedrivePolicy" and value:
            target, count = attrs.redrive_policy(value, ctx.account, info["name"])
            if (info["config"]["dead_letter"], info["config"]["max_deliveries"]) != (target, count):
                return False
        elif name in attrs.NUMERIC:
            if str(int(value)) != shown.get(name):
                return False
        elif shown.get(name, "") != value:
            return False
    return True


def _creation(ctx: Context, params: dict) -> tuple[str, dict, bool, dict]:
    """CreateQueue's queue name, attributes, whether it is a FIFO queue, and the raftq config they
    make; refused here when any is invalid, which the call's routing checks before it may place
    the name in a Raft group."""
    given = string_map(params, "Attributes")
    if given.get("FifoQueue", "false") not in ("true", "false"):
        raise SqsError("InvalidAttributeValue", "Invalid value for the parameter FifoQueue: it must be true or false")
    fifo = given.get("FifoQueue") == "true"
    name = checked_name(required(params, "QueueName"), fifo)
    tags = _tags(params, "tags")
    config, kept = attrs.config_changes(given, attrs.fifo_defaults() if fifo else {}, ctx.account, name,
                                        creating=True)
    config.setdefault("ttl_ms", attrs.DEFAULT_RETENTION_S * 1000)
    config["sqs_attributes"] = kept
    if tags:
        config["tags"] = tags
    return name, given, fifo, config


async def create_queue(ctx: Context, params: dict) -> dict:
    name, given, fifo, config = _creation(ctx, params)
    config["sqs_attributes"]["CreatedTimestamp"] = config["sqs_attributes"]["LastModifiedTimestamp"] = now_s()
    try:
        info = await read(ctx, "queue_info", name)
    except SqsError as exc:
        if exc.code != "QueueDoesNotExist":
            raise
        await _check_dead_letter(ctx, config, name, fifo)
        try:
            await write(ctx, {"op": "create_queue", "queue": name, "config": config})
            return {"QueueUrl": ctx.queue_url(name)}
        except SqsError as exc:
            if exc.code != "QueueNameExists":
                raise
        info = await read(ctx, "queue_info", name)    # created by another call meanwhile
    if not _matches(info, given, ctx):
        raise SqsError("QueueNameExists", f"A queue already exists with the same name ({name}) and a different "
                                          "value for an attribute")
    return {"QueueUrl": ctx.queue_url(name)}


async def get_queue_url(ctx: Context, params: dict) -> dict:
    name = required(params, "QueueName")
    owner = text(params, "QueueOwnerAWSAccountId")
    if not isinstance(name, str) or (owner is not None and owner != ctx.account):
        raise SqsError("QueueDoesNotExist", NO_QUEUE)
    await read(ctx, "queue_info", name)
    return {"QueueUrl": ctx.queue_url(name)}


def _page(params: dict, names: list) -> tuple[list, str | None]:
    """One page of sorted `names` after NextToken, up to MaxResults (all up to 1000 without it)."""
    limit = integer(params, "MaxResults", 1, MAX_LIST)
    token = text(params, "NextToken")
    if token:
        try:
            after = base64.urlsafe_b64decode(token.encode()).decode()
        except (ValueError, UnicodeDecodeError):
            raise invalid("NextToken", token, "it is not a token this API gave") from None
        names = [n for n in names if n > after]
    if limit is None:
        return names[:MAX_LIST], None
    more = len(names) > limit
    names = names[:limit]
    return names, base64.urlsafe_b64encode(names[-1].encode()).decode() if more else None


async def list_queues(ctx: Context, params: dict) -> dict:
    prefix = text(params, "QueueNamePrefix") or ""

    async def here(group: int) -> dict:
        return await commands.leader_read(ctx.app, group, "list_queues")

    async def there(address: str, group: int) -> dict:
        # the node's own credentials: the caller's signature is for this node's endpoint and call
        return await gather.ask(ctx.app, "GET", f"{ctx.app[SETTINGS].scheme}://{address}/v1/queues",
                                {"group": str(group)}, leader.node_authorization(ctx.app), group)
    try:
        answers = await gather.per_group(ctx.request, here, leader=True, there=there)
    except ApiError as exc:
        raise from_native(exc) from None
    names = sorted(q["name"] for answer in answers.values() for q in answer["queues"] if q["name"].startswith(prefix))
    page, token = _page(params, names)
    result = {"QueueUrls": [ctx.queue_url(n) for n in page]} if page else {}    # AWS leaves out an empty list
    if token:
        result["NextToken"] = token
    return result


async def delete_queue(ctx: Context, params: dict) -> dict:
    await write(ctx, {"op": "delete_queue", "queue": queue_of(ctx, params)})
    return {}


async def get_queue_attributes(ctx: Context, params: dict) -> dict:
    info = await read(ctx, "queue_info", queue_of(ctx, params))
    return {"Attributes": attrs.render_attributes(info, string_list(params, "AttributeNames"),
                                                  ctx.signer.region, ctx.account)}


async def set_queue_attributes(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    given = string_map(params, "Attributes")
    info = await read(ctx, "queue_info", name)
    config, kept = attrs.config_changes(given, info["config"].get("sqs_attributes") or {}, ctx.account, name)
    await _check_dead_letter(ctx, config, name, attrs.is_fifo(info["config"]))
    kept["LastModifiedTimestamp"] = now_s()
    await write(ctx, {"op": "patch_queue", "queue": name, "config": {**config, "sqs_attributes": kept}})
    return {}


PURGE_INTERVAL_S = 60
LAST_PURGE = "LastPurgeTimestamp"     # in sqs_attributes; not an attribute SQS shows


async def purge_queue(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    info = await read(ctx, "queue_info", name)
    kept = dict(info["config"].get("sqs_attributes") or {})
    if int(now_s()) - int(kept.get(LAST_PURGE, 0)) < PURGE_INTERVAL_S:
        raise SqsError("PurgeQueueInProgress", f"Only one PurgeQueue operation on {name} is allowed every "
                                               f"{PURGE_INTERVAL_S} seconds.")
    last = info["stats"]["last_seq"]
    if last is not None:
        await write(ctx, {"op": "commit", "queue": name, "group": "default", "seq": last})
    kept[LAST_PURGE] = now_s()
    await write(ctx, {"op": "patch_queue", "queue": name, "config": {"sqs_attributes": kept}})
    return {}


async def tag_queue(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    given = _tags(params, "Tags")
    info = await read(ctx, "queue_info", name)
    tags = {**(info["config"].get("tags") or {}), **given}
    if len(tags) > 50:
        raise invalid("Tags", "...", "a queue has at most 50 tags")
    await write(ctx, {"op": "patch_queue", "queue": name, "config": {"tags": tags}})
    return {}


async def untag_queue(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    keys = set(string_list(params, "TagKeys"))
    info = await read(ctx, "queue_info", name)
    tags = {k: v for k, v in (info["config"].get("tags") or {}).items() if k not in keys}
    await write(ctx, {"op": "patch_queue", "queue": name, "config": {"tags": tags or None}})
    return {}


async def list_queue_tags(ctx: Context, params: dict) -> dict:
    info = await read(ctx, "queue_info", queue_of(ctx, params))
    tags = info["config"].get("tags")
    return {"Tags": tags} if tags else {}


async def _sources(ctx: Context, name: str) -> list:
    """The queues whose dead letters go to `name`, sorted."""
    names = []
    for queue in (await read(ctx, "list_queues"))["queues"]:
        result, _ = await ctx.app[GROUPS].engines[ctx.request[GROUP]].read("queue_info", queue["name"])
        if "error" not in result and result["config"]["dead_letter"] == name:
            names.append(queue["name"])
    return sorted(names)


async def list_dead_letter_source_queues(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    await read(ctx, "queue_info", name)
    page, token = _page(params, await _sources(ctx, name))
    result = {"queueUrls": [ctx.queue_url(n) for n in page]}
    if token:
        result["NextToken"] = token
    return result


# ---- messages ------------------------------------------------------------------------------------------

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
    return {"AWSTraceHeader": {"DataType": "String", "StringValue": value["StringValue"]}}, 0


FIFO_ID = re.compile(r"[\x21-\x7e]{1,128}", re.ASCII)


def _fifo_id(params: dict, name: str) -> str | None:
    value = params.get(name)
    if value is not None and (not isinstance(value, str) or not FIFO_ID.fullmatch(value)):
        raise invalid(name, value, "it is 1 to 128 letters, digits and punctuation")
    return value


def _message(ctx: Context, params: dict, info: dict) -> tuple[dict, dict, int]:
    """(the raftq message, the SQS reply's fields, its size as SQS counts it: body
    and attributes) for one SendMessage or batch entry."""
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
    system, _ = _system_attributes(params)
    size += len(body.encode())
    limit = min(attrs.kept_number(info["config"], "MaximumMessageSize"), ctx.app[SETTINGS].max_message_bytes)
    if size > limit:
        raise invalid("MessageBody", "...", f"Message must be shorter than {limit} bytes (body and attributes)")
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
            total += len(str(entry.get("MessageBody", "")).encode())
            continue
        total += size
        messages.append(message)
        replies.append({"Id": entry["Id"], **reply})
    if total > MAX_BATCH_BYTES:
        raise SqsError("BatchRequestTooLong", f"Batch requests cannot be longer than {MAX_BATCH_BYTES} bytes "
                                              f"(bodies and attributes). You have sent {total} bytes.")
    if messages:
        stored = (await write(ctx, _put(name, messages)))["messages"]
        if attrs.is_fifo(info["config"]):
            for reply, result in zip(replies, stored):
                reply["SequenceNumber"] = _sequence_number(result["seq"])
    return {"Successful": replies, "Failed": failed}


def _body_text(body) -> str:
    """A stored body as SQS text: raftq's native puts may hold bytes or JSON data."""
    if isinstance(body, str):
        return body
    if isinstance(body, bytes):
        try:
            return body.decode()
        except UnicodeDecodeError:
            return base64.b64encode(body).decode()
    return orjson.dumps(body).decode()


def _rendered(ctx: Context, name: str, message: dict, wanted_system: set, wanted_attributes: list,
              received_at: str) -> dict:
    headers = message["headers"] or {}
    body = _body_text(message["body"])
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
    stored = orjson.loads(headers[attrs.HEADER_ATTRIBUTES]) if attrs.HEADER_ATTRIBUTES in headers else {}
    selected = attrs.select_attributes(stored, wanted_attributes)
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
                                                 client=ctx.request.remote)
    except ApiError as exc:
        raise from_native(exc) from None
    result = committed.result
    if "error" in result:
        raise from_native(ApiError(result["error"], result.get("message", "")))
    received_at = str(int(time.time() * 1000))
    if not result["messages"]:
        return {}     # AWS leaves out an empty list
    return {"Messages": [_rendered(ctx, name, m, wanted_system, wanted_attributes, received_at)
                         for m in result["messages"]]}


def _receipt(handle) -> str:
    if not isinstance(handle, str) or not handle:
        raise missing("ReceiptHandle")
    if parse_receipt(handle) is None:
        raise SqsError("ReceiptHandleIsInvalid", f"The input receipt handle {handle!r} is not a valid receipt handle.")
    return handle


async def _settle(ctx: Context, command: dict) -> list:
    """The receipts of `command` that named no lease that still holds."""
    try:
        return (await commands.write(ctx.request, command)).result["stale"]
    except ApiError as exc:
        if exc.code == "stale_receipt":
            return exc.details.get("stale", command["receipts"])
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


# ---- message move tasks: the native redrive -----------------------------------------------------------

MOVE_TASKS = "MessageMoveTasks"     # the dead-letter queue's recent tasks, in its sqs_attributes
KEPT_TASKS = 10
REDRIVE_STEP = 1_000


async def _dead_letter_source(ctx: Context, params: dict) -> tuple[str, dict]:
    source_arn = required(params, "SourceArn")
    name = attrs.queue_from_arn(source_arn, ctx.account, "SourceArn")
    info = await read(ctx, "queue_info", name)
    if await _sources(ctx, name):
        return name, info
    raise invalid("SourceArn", source_arn, "Source queue must be configured as a Dead Letter Queue.")


def _tasks(info: dict) -> list:
    return orjson.loads((info["config"].get("sqs_attributes") or {}).get(MOVE_TASKS, "[]"))


async def start_message_move_task(ctx: Context, params: dict) -> dict:
    name, info = await _dead_letter_source(ctx, params)
    if params.get("DestinationArn") is not None:
        raise SqsError("UnsupportedOperation", "raftq moves dead letters back to the queues they came from; "
                                               "a DestinationArn is not supported")
    if params.get("MaxNumberOfMessagesPerSecond") is not None:
        raise SqsError("UnsupportedOperation", "raftq moves dead letters as fast as the log takes them; "
                                               "MaxNumberOfMessagesPerSecond is not supported")
    handle = base64.urlsafe_b64encode(f"{name}:{uuid.uuid4()}".encode()).decode()
    task = {"TaskHandle": handle, "Status": "COMPLETED", "SourceArn": params["SourceArn"],
            "ApproximateNumberOfMessagesToMove": info["stats"]["depth"], "ApproximateNumberOfMessagesMoved": 0,
            "StartedTimestamp": int(time.time() * 1000)}
    # The move runs to its end here, one redrive (an atomic log entry) at a
    # time; each has an id, so a retried step is not applied twice.
    step = 0
    while True:
        try:
            moved = (await write(ctx, {"op": "redrive", "queue": name, "max": REDRIVE_STEP,
                                       "id": f"{handle}:{step}"}))["moved"]
        except SqsError as exc:
            task.update(Status="FAILED", FailureReason=exc.message)
            break
        task["ApproximateNumberOfMessagesMoved"] += moved
        step += 1
        if moved < REDRIVE_STEP:
            break
    current = await read(ctx, "queue_info", name)
    kept = dict(current["config"].get("sqs_attributes") or {})
    kept[MOVE_TASKS] = orjson.dumps([task, *_tasks(current)][:KEPT_TASKS]).decode()
    await write(ctx, {"op": "patch_queue", "queue": name, "config": {"sqs_attributes": kept}})
    return {"TaskHandle": handle}


async def list_message_move_tasks(ctx: Context, params: dict) -> dict:
    source_arn = required(params, "SourceArn")
    name = attrs.queue_from_arn(source_arn, ctx.account, "SourceArn")
    limit = integer(params, "MaxResults", 1, KEPT_TASKS, 1)
    tasks = _tasks(await read(ctx, "queue_info", name))[:limit]
    # a handle is only shown for a running task (SQS's rule); raftq's have all ended
    return {"Results": [{k: v for k, v in t.items() if k != "TaskHandle"} for t in tasks]}


def _task_queue(handle) -> str:
    """The dead-letter queue a message move task's handle names."""
    try:
        name = base64.urlsafe_b64decode(handle.encode()).decode().split(":", 1)[0]
    except (AttributeError, ValueError, UnicodeDecodeError):
        name = None
    if name is None or not is_name(name):
        raise SqsError("ResourceNotFoundException", "no such message move task")
    return name


async def cancel_message_move_task(ctx: Context, params: dict) -> dict:
    handle = required(params, "TaskHandle")
    name = _task_queue(handle)
    try:
        tasks = _tasks(await read(ctx, "queue_info", name))
    except SqsError:
        tasks = []
    if not any(t["TaskHandle"] == handle for t in tasks):
        raise SqsError("ResourceNotFoundException", "no such message move task")
    raise SqsError("ResourceNotFoundException", "the task is not running: raftq runs a move to its end "
                                                "within StartMessageMoveTask, so there is nothing to cancel")


# ---- what raftq does not do ----------------------------------------------------------------------------

async def permissions(ctx: Context, params: dict) -> dict:
    raise SqsError("UnsupportedOperation", "raftq grants access by the role of each key in cluster.toml "
                                           "([[sqs.keys]] role = admin or data), not by queue policies: "
                                           "AddPermission and RemovePermission change nothing and are refused")


# ---- which Raft group serves a call --------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """The queues a call touches, which choose the Raft group that serves it; `creating`: a
    name the catalog has not placed yet is placed now (with the others, in one group), except
    those of `existing`, which must be placed already (else `unknown`, and nothing is placed)."""
    queues: list
    creating: bool = False
    existing: tuple = ()
    unknown: tuple = ("QueueDoesNotExist", NO_QUEUE)    # the error when a queue is not in the catalog


def _named_by_url(ctx: Context, params: dict) -> Target:
    return Target([queue_of(ctx, params)])


def _named(ctx: Context, params: dict) -> Target:
    name = required(params, "QueueName")
    if not isinstance(name, str) or not is_name(name):
        raise SqsError("QueueDoesNotExist", NO_QUEUE)
    return Target([name])


def _dead_letter_named(ctx: Context, given: dict, name: str) -> list:
    """The dead-letter queue that the RedrivePolicy among `given` names, as a list of none or one."""
    policy = given.get("RedrivePolicy")
    target = attrs.redrive_policy(policy, ctx.account, name)[0] if isinstance(policy, str) else None
    return [] if target is None else [target]


def _configured(ctx: Context, params: dict) -> Target:
    """A queue and the dead-letter queue its RedrivePolicy names: one group (as the native API's
    config), which a new queue joins."""
    name = queue_of(ctx, params)
    return Target([name, *_dead_letter_named(ctx, string_map(params, "Attributes"), name)], creating=True,
                  existing=(name,))


def _created(ctx: Context, params: dict) -> Target:
    name, given, _, _ = _creation(ctx, params)
    return Target([name, *_dead_letter_named(ctx, given, name)], creating=True)


def _named_by_source_arn(ctx: Context, params: dict) -> Target:
    return Target([attrs.queue_from_arn(required(params, "SourceArn"), ctx.account, "SourceArn")])


def _named_by_task(ctx: Context, params: dict) -> Target:
    return Target([_task_queue(required(params, "TaskHandle"))],
                  unknown=("ResourceNotFoundException", "no such message move task"))


@dataclass(frozen=True)
class Action:
    handler: Callable[[Context, dict], Awaitable[dict]]
    # the queues that choose the group serving the call; None: served by the node that takes the
    # call (it gathers over the groups, or names no queue)
    target: Callable[[Context, dict], Target] | None = _named_by_url
    admin: bool = False       # needs a key of role admin


ACTIONS = {
    "CreateQueue": Action(create_queue, _created, admin=True),
    "DeleteQueue": Action(delete_queue, admin=True),
    "GetQueueUrl": Action(get_queue_url, _named),
    "ListQueues": Action(list_queues, None),
    "GetQueueAttributes": Action(get_queue_attributes),
    "SetQueueAttributes": Action(set_queue_attributes, _configured, admin=True),
    "PurgeQueue": Action(purge_queue, admin=True),
    "TagQueue": Action(tag_queue, admin=True),
    "UntagQueue": Action(untag_queue, admin=True),
    "ListQueueTags": Action(list_queue_tags),
    # a dead-letter queue's sources live in its group (a redrive policy across groups is refused)
    "ListDeadLetterSourceQueues": Action(list_dead_letter_source_queues),
    "SendMessage": Action(send_message),
    "SendMessageBatch": Action(send_message_batch),
    "ReceiveMessage": Action(receive_message),
    "DeleteMessage": Action(delete_message),
    "DeleteMessageBatch": Action(delete_message_batch),
    "ChangeMessageVisibility": Action(change_message_visibility),
    "ChangeMessageVisibilityBatch": Action(change_message_visibility_batch),
    "AddPermission": Action(permissions, None, admin=True),
    "RemovePermission": Action(permissions, None, admin=True),
    "StartMessageMoveTask": Action(start_message_move_task, _named_by_source_arn, admin=True),
    "ListMessageMoveTasks": Action(list_message_move_tasks, _named_by_source_arn),
    "CancelMessageMoveTask": Action(cancel_message_move_task, _named_by_task, admin=True),
}

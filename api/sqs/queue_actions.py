"""The SQS actions on queues: create, look up, list, attributes, purge, tags, dead-letter sources."""

import base64


from .. import commands, gather, leader
from ..errors import ApiError
from ..keys import GROUP, GROUPS, SETTINGS
from . import attributes as attrs
from . import validation
from .errors import SqsError, invalid, missing
from .context import (NO_QUEUE, Context, from_native, now_s, queue_of, read, required, string_list, string_map, text,
                      write)


MAX_LIST = 1_000
MAX_TAGS = 50


async def _check_dead_letter(ctx: Context, config: dict, given: dict, source: str, fifo: bool) -> None:
    target = config.get("dead_letter")
    if target is None:
        return
    policy = given["RedrivePolicy"]
    try:
        info = await read(ctx, "queue_info", target)
    except SqsError as exc:
        if exc.code != "QueueDoesNotExist":
            raise
        raise attrs.invalid_redrive_policy(policy, "Dead letter target does not exist.") from None
    if attrs.is_fifo(info["config"]) != fifo:
        raise SqsError("InvalidParameterCombination", "Fifo queues cannot use non fifo dead letter queues" if fifo
                       else "Standard queues cannot use fifo dead letter queues")
    allow = (info["config"].get("sqs_attributes") or {}).get("RedriveAllowPolicy")
    if not attrs.allows_source(allow, source, ctx.account):
        raise attrs.invalid_redrive_policy(policy, f"The RedriveAllowPolicy of {target} does not allow {source}.")


def _tags(params: dict, name: str, queue: str) -> dict:
    tags = string_map(params, name)
    if len(tags) > MAX_TAGS:
        raise SqsError("InvalidParameterValue", f"Too many tags added for queue {queue}.")
    for key, value in tags.items():
        if not 1 <= len(key) <= 128:
            raise SqsError("InvalidParameterValue", "Tag keys must be between 1 and 128 characters in length.")
        if len(value) > 256:
            raise SqsError("InvalidParameterValue", "Tag values must be between 0 and 256 characters in length.")
    return tags


def _differing(info: dict, given: dict, ctx: Context) -> str | None:
    """The first attribute `given` that an existing queue does not have (CreateQueue's idempotency)."""
    shown = attrs.render_attributes(info, ["All"], ctx.signer.region, ctx.account)
    for name, value in given.items():
        if name == "FifoQueue":
            same = (value.lower() == "true") == attrs.is_fifo(info["config"])
        elif name == "RedrivePolicy" and value:
            target, count = attrs.redrive_policy(value, ctx.account, info["name"])
            same = (info["config"]["dead_letter"], info["config"]["max_deliveries"]) == (target, count)
        elif name in attrs.NUMERIC:
            same = str(int(value)) == shown.get(name, str(attrs.NUMERIC[name][2]))
        elif name in attrs.ENCRYPTION:
            same = True     # refused for a new queue; an existing one is unencrypted as asked
        else:
            same = shown.get(name, "") == value
        if not same:
            return name
    return None


def creation(ctx: Context, params: dict) -> tuple[str, dict, bool, dict]:
    """CreateQueue's queue name, attributes, whether it is a FIFO queue, and the raftq config they
    make; refused here when any is invalid, which the call's routing checks before it may place
    the name in a Raft group."""
    given = string_map(params, "Attributes")
    fifo = given.get("FifoQueue", "").lower() == "true"
    name = validation.queue_name(required(params, "QueueName"), fifo)
    config, kept = attrs.config_changes(given, attrs.fifo_defaults() if fifo else {}, ctx.account, name,
                                        creating=True)
    tags = _tags(params, "tags", name)
    attrs.refuse_encryption(given)
    config.setdefault("ttl_ms", attrs.DEFAULT_RETENTION_S * 1000)
    config["sqs_attributes"] = kept
    if tags:
        config["tags"] = tags
    return name, given, fifo, config


async def create_queue(ctx: Context, params: dict) -> dict:
    name, given, fifo, config = creation(ctx, params)
    config["sqs_attributes"]["CreatedTimestamp"] = config["sqs_attributes"]["LastModifiedTimestamp"] = now_s()
    try:
        info = await read(ctx, "queue_info", name)
    except SqsError as exc:
        if exc.code != "QueueDoesNotExist":
            raise
        await _check_dead_letter(ctx, config, given, name, fifo)
        try:
            await write(ctx, {"op": "create_queue", "queue": name, "config": config})
            return {"QueueUrl": ctx.queue_url(name)}
        except SqsError as exc:
            if exc.code != "QueueNameExists":
                raise
        info = await read(ctx, "queue_info", name)    # created by another call meanwhile
    differing = _differing(info, given, ctx)
    if differing is not None:
        raise SqsError("QueueNameExists", "A queue already exists with the same name and a different value for "
                                          f"attribute {differing}")
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
    limit = validation.integer(params, "MaxResults")
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
    names = sorted(q["name"] for answer in answers.values() for q in answer["queues"]
                   if q["name"].startswith(prefix) and ctx.may_see(q["name"]))
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
    shown = attrs.render_attributes(info, string_list(params, "AttributeNames"), ctx.signer.region, ctx.account)
    return {"Attributes": shown} if shown else {}    # AWS leaves out an empty map


async def set_queue_attributes(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    given = string_map(params, "Attributes")
    info = await read(ctx, "queue_info", name)
    config, kept = attrs.config_changes(given, info["config"].get("sqs_attributes") or {}, ctx.account, name)
    await _check_dead_letter(ctx, config, given, name, attrs.is_fifo(info["config"]))
    attrs.refuse_encryption(given)
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
    info = await read(ctx, "queue_info", name)
    if not params.get("Tags"):
        raise missing("Tags")
    given = _tags(params, "Tags", name)
    tags = {**(info["config"].get("tags") or {}), **given}
    if len(tags) > MAX_TAGS:
        raise SqsError("InvalidParameterValue", f"Too many tags added for queue {name}.")
    await write(ctx, {"op": "patch_queue", "queue": name, "config": {"tags": tags}})
    return {}


async def untag_queue(ctx: Context, params: dict) -> dict:
    name = queue_of(ctx, params)
    info = await read(ctx, "queue_info", name)
    keys = set(string_list(params, "TagKeys"))
    if not keys:
        raise SqsError("InvalidParameterValue", "Tag keys must be between 1 and 128 characters in length.")
    tags = {k: v for k, v in (info["config"].get("tags") or {}).items() if k not in keys}
    await write(ctx, {"op": "patch_queue", "queue": name, "config": {"tags": tags or None}})
    return {}


async def list_queue_tags(ctx: Context, params: dict) -> dict:
    info = await read(ctx, "queue_info", queue_of(ctx, params))
    tags = info["config"].get("tags")
    return {"Tags": tags} if tags else {}


async def dead_letter_sources(ctx: Context, name: str) -> list:
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
    page, token = _page(params, [source for source in await dead_letter_sources(ctx, name) if ctx.may_see(source)])
    result = {"queueUrls": [ctx.queue_url(n) for n in page]}
    if token:
        result["NextToken"] = token
    return result

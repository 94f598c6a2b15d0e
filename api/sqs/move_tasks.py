"""The SQS message move tasks: the native redrive of a dead-letter queue's messages back to their sources."""

import base64
import time
import uuid

import orjson

from raftq.wire_format import is_name

from . import attributes as attrs
from . import validation
from .errors import SqsError
from .context import Context, read, required, write
from .queue_actions import dead_letter_sources


MOVE_TASKS = "MessageMoveTasks"     # the dead-letter queue's recent tasks, in its sqs_attributes
KEPT_TASKS = 10
REDRIVE_STEP = 1_000


NO_SOURCE = ("ResourceNotFoundException", "The resource that you specified for the SourceArn parameter doesn't exist.")
ARN_FORMAT = "You must use this format to specify the SourceArn: arn:<partition>:<service>:<region>:<account-id>:" \
             "<resource-id>"


def source_queue(params: dict, account: str) -> str:
    """The queue a SourceArn names; an ARN of another account names no queue here."""
    parsed = attrs.ARN.fullmatch(required(params, "SourceArn")) if isinstance(params["SourceArn"], str) else None
    if parsed is None:
        raise SqsError("InvalidParameterValue", ARN_FORMAT)
    if parsed.group(2) != account:
        raise SqsError(*NO_SOURCE)
    return parsed.group(3)


async def _source_info(ctx: Context, name: str) -> dict:
    try:
        return await read(ctx, "queue_info", name)
    except SqsError as exc:
        if exc.code == "QueueDoesNotExist":
            raise SqsError(*NO_SOURCE) from None
        raise


async def _dead_letter_source(ctx: Context, params: dict) -> tuple[str, dict]:
    name = source_queue(params, ctx.account)
    info = await _source_info(ctx, name)
    if await dead_letter_sources(ctx, name):
        return name, info
    raise SqsError("InvalidParameterValue", "Source queue must be configured as a Dead Letter Queue.")


def _tasks(info: dict) -> list:
    return orjson.loads((info["config"].get("sqs_attributes") or {}).get(MOVE_TASKS, "[]"))


async def start_message_move_task(ctx: Context, params: dict) -> dict:
    name, info = await _dead_letter_source(ctx, params)
    if params.get("DestinationArn") is not None:
        if not isinstance(params["DestinationArn"], str) or not attrs.ARN.fullmatch(params["DestinationArn"]):
            raise SqsError("InvalidParameterValue", ARN_FORMAT.replace("SourceArn", "DestinationArn"))
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
    name = source_queue(params, ctx.account)
    limit = validation.integer(params, "MaxResults", 1, high=KEPT_TASKS)
    tasks = _tasks(await _source_info(ctx, name))[:limit]
    # a handle is only shown for a running task (SQS's rule); raftq's have all ended
    return {"Results": [{k: v for k, v in t.items() if k != "TaskHandle"} for t in tasks]}


def task_queue(handle) -> str:
    """The dead-letter queue a message move task's handle names."""
    try:
        name = base64.urlsafe_b64decode(handle.encode()).decode().split(":", 1)[0]
    except (AttributeError, ValueError, UnicodeDecodeError):
        name = None
    if name is None or not is_name(name):
        raise SqsError("InvalidParameterValue", "Value for parameter TaskHandle is invalid.")
    return name


async def cancel_message_move_task(ctx: Context, params: dict) -> dict:
    handle = required(params, "TaskHandle")
    name = task_queue(handle)
    try:
        tasks = _tasks(await read(ctx, "queue_info", name))
    except SqsError:
        tasks = []
    if not any(t["TaskHandle"] == handle for t in tasks):
        raise SqsError("ResourceNotFoundException", "Task does not exist.")
    raise SqsError("ResourceNotFoundException", "the task is not running: raftq runs a move to its end "
                                                "within StartMessageMoveTask, so there is nothing to cancel")

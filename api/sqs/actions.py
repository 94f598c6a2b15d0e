"""The SQS actions, each onto raftq's operations through the log: which handler serves each
(``ACTIONS``; the handlers are in queue_actions.py, message_actions.py and move_tasks.py, on the
calls of context.py) and which Raft group serves it.

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

from dataclasses import dataclass
from typing import Awaitable, Callable


from raftq.wire_format import is_name

from . import attributes as attrs
from .errors import SqsError, missing
from .context import NO_QUEUE, Context, local_info, queue_of, required, string_list, string_map
from .message_actions import (change_message_visibility, change_message_visibility_batch, delete_message,
                              delete_message_batch, receive_message, send_message, send_message_batch)
from .move_tasks import (NO_SOURCE, cancel_message_move_task, list_message_move_tasks, source_queue,
                         start_message_move_task, task_queue)
from .queue_actions import (create_queue, creation, delete_queue, get_queue_attributes, get_queue_url,
                            list_dead_letter_source_queues, list_queue_tags, list_queues, purge_queue,
                            set_queue_attributes, tag_queue, untag_queue)


# ---- queue policies, which raftq does not keep -----------------------------------------------------

MAX_POLICY_ACTIONS = 7
# What AddPermission may grant: the actions on a queue that a queue's policy can give another account
GRANTABLE = frozenset({"*", "ChangeMessageVisibility", "DeleteMessage", "GetQueueAttributes", "GetQueueUrl",
                       "ListDeadLetterSourceQueues", "PurgeQueue", "ReceiveMessage", "SendMessage"})


async def add_permission(ctx: Context, params: dict) -> dict:
    """AWS's checks, then a refusal: access is each key's principal's rules, not queue policies."""
    await local_info(ctx, queue_of(ctx, params))
    accounts = string_list(params, "AWSAccountIds")
    actions = string_list(params, "Actions")
    if not actions:
        raise SqsError("MissingParameter", "The request must contain the parameter Actions.")
    if not accounts:
        raise SqsError("InvalidParameterValue", "Value [] for parameter PrincipalId is invalid. Reason: Unable to "
                                                "verify.")
    if len(actions) > MAX_POLICY_ACTIONS:
        raise SqsError("OverLimit", f"{len(actions)} Actions were found, maximum allowed is {MAX_POLICY_ACTIONS}.")
    for action in actions:
        if action not in GRANTABLE:
            raise SqsError("InvalidParameterValue", f"Value SQS:{action} for parameter ActionName is invalid. "
                                                    "Reason: Only the queue owner is allowed to invoke this action.")
    raise SqsError("UnsupportedOperation", "raftq grants access by the rules of each key's principal (a "
                                           "role's, or its own: docs/sqs.md), not by queue policies: "
                                           "AddPermission changes nothing and is refused")


async def remove_permission(ctx: Context, params: dict) -> dict:
    """A queue of raftq has no permission labels (AddPermission adds none): AWS's answer to a label
    that a queue's policy does not hold."""
    await local_info(ctx, queue_of(ctx, params))
    label = params["Label"]
    raise SqsError("InvalidParameterValue", f"Value {label} for parameter Label is invalid. Reason: can't find "
                                            "label.")


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
    """The dead-letter queue that the RedrivePolicy among `given` names, as a list of none or one
    (none for a policy the action will refuse, once it found the queue, as AWS does)."""
    policy = given.get("RedrivePolicy")
    try:
        target = attrs.redrive_policy(policy, ctx.account, name)[0] if isinstance(policy, str) else None
    except SqsError:
        target = None
    return [] if target is None else [target]


def _configured(ctx: Context, params: dict) -> Target:
    """A queue and the dead-letter queue its RedrivePolicy names: one group (as the native API's
    config), which a new queue joins."""
    name = queue_of(ctx, params)
    return Target([name, *_dead_letter_named(ctx, string_map(params, "Attributes"), name)], creating=True,
                  existing=(name,))


def _created(ctx: Context, params: dict) -> Target:
    name, given, _, _ = creation(ctx, params)
    return Target([name, *_dead_letter_named(ctx, given, name)], creating=True)


def _named_by_source_arn(ctx: Context, params: dict) -> Target:
    return Target([source_queue(params, ctx.account)], unknown=NO_SOURCE)


def _named_by_task(ctx: Context, params: dict) -> Target:
    return Target([task_queue(required(params, "TaskHandle"))], unknown=NO_SOURCE)


@dataclass(frozen=True)
class Action:
    handler: Callable[[Context, dict], Awaitable[dict]]
    # the queues that choose the group serving the call; None: served by the node that takes the
    # call (it gathers over the groups, or names no queue)
    target: Callable[[Context, dict], Target] | None = _named_by_url
    on_queue_url: bool = True  # may be posted to a queue's URL (AWS takes only the actions on a queue there)
    required: tuple = ()


QUEUE = ("QueueUrl",)
# each action's required members (AWS's model), checked before anything else as AWS checks them;
# a required list or map is the action's to check (the query protocol cannot tell empty from absent)
ACTIONS = {
    "CreateQueue": Action(create_queue, _created, on_queue_url=False, required=("QueueName",)),
    "DeleteQueue": Action(delete_queue, required=QUEUE),
    "GetQueueUrl": Action(get_queue_url, _named, required=("QueueName",)),
    "ListQueues": Action(list_queues, None, on_queue_url=False),
    "GetQueueAttributes": Action(get_queue_attributes, required=QUEUE),
    "SetQueueAttributes": Action(set_queue_attributes, _configured, required=QUEUE),
    "PurgeQueue": Action(purge_queue, required=QUEUE),
    "TagQueue": Action(tag_queue, required=QUEUE),
    "UntagQueue": Action(untag_queue, required=QUEUE),
    "ListQueueTags": Action(list_queue_tags, required=QUEUE),
    # a dead-letter queue's sources live in its group (a redrive policy across groups is refused)
    "ListDeadLetterSourceQueues": Action(list_dead_letter_source_queues, required=QUEUE),
    "SendMessage": Action(send_message, required=("QueueUrl", "MessageBody")),
    "SendMessageBatch": Action(send_message_batch, required=QUEUE),
    "ReceiveMessage": Action(receive_message, required=QUEUE),
    "DeleteMessage": Action(delete_message, required=("QueueUrl", "ReceiptHandle")),
    "DeleteMessageBatch": Action(delete_message_batch, required=QUEUE),
    "ChangeMessageVisibility": Action(change_message_visibility,
                                      required=("QueueUrl", "ReceiptHandle", "VisibilityTimeout")),
    "ChangeMessageVisibilityBatch": Action(change_message_visibility_batch, required=QUEUE),
    "AddPermission": Action(add_permission, required=("QueueUrl", "Label")),
    "RemovePermission": Action(remove_permission, required=("QueueUrl", "Label")),
    "StartMessageMoveTask": Action(start_message_move_task, _named_by_source_arn,
                                   required=("SourceArn",)),
    "ListMessageMoveTasks": Action(list_message_move_tasks, _named_by_source_arn, required=("SourceArn",)),
    "CancelMessageMoveTask": Action(cancel_message_move_task, _named_by_task, required=("TaskHandle",)),
}


def check_required(action: Action, params: dict) -> None:
    """AWS's first check of a call: each required member is there (an empty string is not)."""
    for name in action.required:
        if params.get(name) is None or params.get(name) == "":
            raise missing(name)

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
from .errors import SqsError
from .context import NO_QUEUE, Context, queue_of, required, string_map
from .message_actions import (change_message_visibility, change_message_visibility_batch, delete_message,
                              delete_message_batch, receive_message, send_message, send_message_batch)
from .move_tasks import cancel_message_move_task, list_message_move_tasks, start_message_move_task, task_queue
from .queue_actions import (create_queue, creation, delete_queue, get_queue_attributes, get_queue_url,
                            list_dead_letter_source_queues, list_queue_tags, list_queues, purge_queue,
                            set_queue_attributes, tag_queue, untag_queue)


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
    name, given, _, _ = creation(ctx, params)
    return Target([name, *_dead_letter_named(ctx, given, name)], creating=True)


def _named_by_source_arn(ctx: Context, params: dict) -> Target:
    return Target([attrs.queue_from_arn(required(params, "SourceArn"), ctx.account, "SourceArn")])


def _named_by_task(ctx: Context, params: dict) -> Target:
    return Target([task_queue(required(params, "TaskHandle"))],
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

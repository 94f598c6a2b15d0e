"""What each SQS action needs of its key's principal (docs/sqs.md, "Keys and principals"): one of
raftq's actions (statemachine/rules.py) on every queue the call names (its ``Target``: a queue
and the dead-letter queue its RedrivePolicy names, a move task's dead-letter queue), checked
before the call is forwarded or anything is placed or written. A refusal is AccessDenied naming
the action and the queue, counted as every door's are (api/principals.py).

GetQueueUrl needs any action on the queue (a producer asks for the URL it sends to); ListQueues
and ListDeadLetterSourceQueues list only the queues the principal has an action on; a message
move task moves only the dead letters whose source the principal may redrive to.
"""

from aiohttp import web

from raftq.statemachine.rules import ADMIN, BROWSE, PUT, RECEIVE, REDRIVE

from ..principals import PRINCIPAL, PRINCIPALS, denial, may_touch
from .errors import SqsError

ANY = "any"         # any action on the queue
NEEDS = {
    "CreateQueue": ADMIN, "DeleteQueue": ADMIN, "SetQueueAttributes": ADMIN, "PurgeQueue": ADMIN,
    "TagQueue": ADMIN, "UntagQueue": ADMIN, "AddPermission": ADMIN, "RemovePermission": ADMIN,
    "GetQueueUrl": ANY, "ListQueues": ANY,
    "GetQueueAttributes": BROWSE, "ListQueueTags": BROWSE, "ListDeadLetterSourceQueues": BROWSE,
    "ListMessageMoveTasks": BROWSE,
    "SendMessage": PUT, "SendMessageBatch": PUT,
    "ReceiveMessage": RECEIVE, "DeleteMessage": RECEIVE, "DeleteMessageBatch": RECEIVE,
    "ChangeMessageVisibility": RECEIVE, "ChangeMessageVisibilityBatch": RECEIVE,
    "StartMessageMoveTask": REDRIVE, "CancelMessageMoveTask": REDRIVE,
}


def authorize(request: web.Request, action: str, queues) -> None:
    """AccessDenied unless the call's principal may do what SQS's `action` needs on each of `queues`
    (none: on some queue)."""
    principal = request[PRINCIPAL]
    needs = NEEDS[action]
    if needs == ANY:
        for queue in queues:
            if not may_touch(principal, queue):
                request.app[PRINCIPALS].refused(request, principal, ANY, queue)
                raise SqsError("AccessDenied", f"principal {principal.name!r} has no action on queue {queue!r} "
                                               f"({action})")
        return
    refused = denial(request.app, request, principal, needs, queues or [None])
    if refused is not None:
        where = f" on queue {refused[1]!r}" if refused[1] is not None else " on any queue"
        raise SqsError("AccessDenied", f"principal {principal.name!r} may not {needs}{where} ({action} needs it)")

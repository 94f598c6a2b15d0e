"""Results of applying a command.

A command never raises: every replica must reach the same verdict from the
same input, so a refusal is a value.  Successful results are plain dicts; a
refusal is a dict with ``error`` (one of the codes below) and ``message``.
"""

BAD_REQUEST = "bad_request"
NOT_FOUND = "not_found"
CONFLICT = "conflict"
STALE_RECEIPT = "stale_receipt"
QUEUE_FULL = "queue_full"
TOO_LARGE = "too_large"
LIMIT_REACHED = "limit_reached"
INTERNAL = "internal"
# Issue 47: a put past the cluster's --max-stored-bytes (and, at the fronts, a node's disk below its watermark).
INSUFFICIENT_STORAGE = "insufficient_storage"
# Issue 52: a queue the command's principal may not touch (the patterns it carries), and a
# principal's quota that the command would pass (quotas.py).
FORBIDDEN = "forbidden"
QUOTA_EXCEEDED = "quota_exceeded"
# Issue 24: a command for a queue another Raft group owns, and a request whose queues span groups.
WRONG_GROUP = "wrong_group"
CROSS_GROUP = "cross_group"

ERROR_CODES = frozenset({BAD_REQUEST, NOT_FOUND, CONFLICT, STALE_RECEIPT, QUEUE_FULL, TOO_LARGE,
                         LIMIT_REACHED, INTERNAL, WRONG_GROUP, CROSS_GROUP, INSUFFICIENT_STORAGE, FORBIDDEN,
                         QUOTA_EXCEEDED})


def error(code: str, message: str, **details) -> dict:
    return {"error": code, "message": message, **details}


def is_error(result) -> bool:
    return isinstance(result, dict) and "error" in result

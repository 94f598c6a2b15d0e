"""AWS's checks of an SQS call's parameters, in AWS's order and with AWS's words.

Programs match on the code and people (and tests) on the text, so each refusal
here is the one AWS gives: the texts AWS's answers carry (recorded from AWS by
others' test suites, or quoted in bug reports against AWS), else those of moto,
which tracks them. docs/sqs.md lists the few deliberate differences.

What an action checks, in order: the queue it names exists (its routing,
service.py), then its batch (``batch_entries``), then each parameter as below.
"""

import re

from .errors import SqsError, invalid, missing

QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}", re.ASCII)
FIFO_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,75}\.fifo", re.ASCII)
BATCH_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}", re.ASCII)
# MessageGroupId, MessageDeduplicationId: letters, digits and punctuation
FIFO_ID = re.compile(r"[\x21-\x7e]{1,128}", re.ASCII)
MAX_BATCH = 10


def queue_name(name, fifo: bool) -> str:
    """CreateQueue's QueueName: 1 to 80 of [A-Za-z0-9_-], a FIFO queue's ending with .fifo (in the 80)."""
    if fifo:
        if not isinstance(name, str) or not FIFO_QUEUE_NAME.fullmatch(name):
            raise SqsError("InvalidParameterValue", "The name of a FIFO queue can only include alphanumeric "
                                                    "characters, hyphens, or underscores, must end with .fifo suffix "
                                                    "and be 1 to 80 in length.")
    elif not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise SqsError("InvalidParameterValue", "Can only include alphanumeric characters, hyphens, or underscores. "
                                                "1 to 80 in length")
    return name


def batch_entries(action: str, params: dict) -> list:
    """A batch call's entries, refused whole as AWS refuses them: none, more than 10, an entry
    id that is not 1 to 80 of [A-Za-z0-9_-], the same id twice."""
    entries = params.get("Entries")
    if not entries:
        raise SqsError("EmptyBatchRequest", f"There should be at least one {action}RequestEntry in the request.")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise invalid("Entries", entries, "it must be a list of entries")
    if len(entries) > MAX_BATCH:
        raise SqsError("TooManyEntriesInBatchRequest", f"Maximum number of entries per request are {MAX_BATCH}. "
                                                       f"You have sent {len(entries)}.")
    seen = set()
    for entry in entries:
        entry_id = entry.get("Id")
        if entry_id is None:
            raise missing(f"{action}RequestEntry.Id")
        if not isinstance(entry_id, str) or not BATCH_ENTRY_ID.fullmatch(entry_id):
            raise SqsError("InvalidBatchEntryId", "A batch entry id can only contain alphanumeric characters, "
                                                  "hyphens and underscores. It can be at most 80 letters long.")
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def fifo_id(params: dict, name: str) -> str | None:
    """MessageGroupId or MessageDeduplicationId, when given: 1 to 128 letters, digits and punctuation."""
    value = params.get(name)
    if value is not None and (not isinstance(value, str) or not FIFO_ID.fullmatch(value)):
        raise invalid(name, value, f"{name} can only include alphanumeric and punctuation characters. 1 to 128 "
                                   "in length.")
    return value


# An integer parameter's range and AWS's reason when a value is outside it
RANGES = {
    "MaxNumberOfMessages": (1, 10, "Must be between 1 and 10, if provided."),
    "WaitTimeSeconds": (0, 20, "Must be >= 0 and <= 20, if provided."),
    "VisibilityTimeout": (0, 43_200, "Must be >= 0 and <= 43200, if provided."),
    "DelaySeconds": (0, 900, "DelaySeconds must be >= 0 and <= 900."),
    "MaxResults": (1, 1_000, "Must be between 1 and 1000, if provided."),
}


def integer(params: dict, name: str, default=None, *, high: int | None = None):
    """An integer parameter (a JSON number, or the query protocol's digits), in its RANGES
    (`high`: a lower ceiling, with AWS's reason naming it)."""
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, str):
        digits = value.strip()
        if digits.lstrip("-").isascii() and digits.lstrip("-").isdigit():
            value = int(digits)
    low, top, reason = RANGES[name]
    if high is not None:
        top, reason = high, f"Must be between {low} and {high}, if provided."
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= top:
        raise invalid(name, value, reason)
    return value

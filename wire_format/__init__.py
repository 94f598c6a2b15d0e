"""What the clients and the nodes agree on, at the bottom of the house: the rule
every name follows, and how a byte body travels in JSON.

It imports nothing of the project, so the state machine (which refuses a name
outside the rule on every replica), the fronts (which refuse it at the edge)
and the clients (the Spark connector checks its options with it) share one
rule without the clients depending on the state machine or the other way
round (docs/architecture.md).
"""

import base64
import re

# Names travel in URL paths: no "." or ".." (a client or proxy collapses them),
# and no leading "-" (read as an option on a command line).
NAME_PATTERN = "[A-Za-z0-9_][A-Za-z0-9._-]{0,127}"
_NAME = re.compile(NAME_PATTERN)


def is_name(value) -> bool:
    """Whether `value` may name a queue, a group, a node or a producer."""
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


def with_body_b64(message: dict) -> dict:
    """`message` as JSON carries it: a byte body becomes base64 text under
    ``body_b64`` (in a copy); any other message is returned as it is."""
    if not isinstance(message.get("body"), (bytes, bytearray)):
        return message
    message = dict(message)
    message["body_b64"] = base64.b64encode(message.pop("body")).decode()
    return message

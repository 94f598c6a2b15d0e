"""What the clients and the nodes agree on, at the bottom of the house: the rule
every name follows (and the patterns that stand for names), and how a byte body
travels in JSON.

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


# A queue-name pattern (a principal's rules, docs/security.md): a name in which "*" may stand
# anywhere for any run of characters, itself included ("orders-*", "*-dlq", "*"). It begins as
# a name begins, so every pattern can match some name; at most MAX_PATTERN_STARS stars keep a
# match linear in practice.
PATTERN_PATTERN = r"[A-Za-z0-9_*][A-Za-z0-9._*-]{0,127}"
_PATTERN = re.compile(PATTERN_PATTERN)
MAX_PATTERN_STARS = 8


def is_pattern(value) -> bool:
    """Whether `value` is a queue-name pattern."""
    return isinstance(value, str) and _PATTERN.fullmatch(value) is not None \
        and value.count("*") <= MAX_PATTERN_STARS


def pattern_matches(pattern: str, name: str) -> bool:
    """Whether `name` is one of the names `pattern` stands for: its literal characters in order,
    each "*" any run of characters (a glob with only "*"). The usual two-pointer walk: a star
    remembers where it stood, and a mismatch later lets it take one more character."""
    p = n = 0
    star, resume = -1, 0
    while n < len(name):
        if p < len(pattern) and pattern[p] == "*":
            star, resume = p, n
            p += 1
        elif p < len(pattern) and pattern[p] == name[n]:
            p += 1
            n += 1
        elif star >= 0:
            p, resume = star + 1, resume + 1
            n = resume
        else:
            return False
    return all(c == "*" for c in pattern[p:])


def with_body_b64(message: dict) -> dict:
    """`message` as JSON carries it: a byte body becomes base64 text under
    ``body_b64`` (in a copy); any other message is returned as it is."""
    if not isinstance(message.get("body"), (bytes, bytearray)):
        return message
    message = dict(message)
    message["body_b64"] = base64.b64encode(message.pop("body")).decode()
    return message

"""What a principal may do: rules of actions on queue-name patterns (docs/security.md).

A rule is ``{"actions": [...], "queues": [patterns]}``; a request is allowed only if some rule
of its principal names the request's action and a pattern matching each queue it names
(``allows``). There is no rule that denies: nothing is allowed that no rule allows.

The queue actions are checked on every queue a request names; ``metrics`` (reading the
cluster's figures and state) and ``cluster`` (changing the cluster: membership, leadership,
verification, credentials) name no queue, and a rule holding only them needs no patterns.

The bootstrap tokens of cluster.toml (and the SQS keys of a role) act as fixed rules
(``ROLE_RULES``), so a route checks one thing whoever calls it.

Pure: the fronts check requests with it, the state machine validates rules with it and checks
the queues only its state knows (a redrive's sources, a stage commit's stages) against the
patterns a command carries.
"""

from __future__ import annotations

from raftq.wire_format import PATTERN_PATTERN, is_pattern, pattern_matches

from .results import BAD_REQUEST, error

PUT, RECEIVE, BROWSE, ADMIN, REDRIVE, PRODUCERS = "put", "receive", "browse", "admin", "redrive", "producers"
METRICS, CLUSTER = "metrics", "cluster"
QUEUE_ACTIONS = (PUT, RECEIVE, BROWSE, ADMIN, REDRIVE, PRODUCERS)
CLUSTER_ACTIONS = (METRICS, CLUSTER)
ACTIONS = QUEUE_ACTIONS + CLUSTER_ACTIONS
MAX_RULES = 64
MAX_PATTERNS = 64

EVERY_QUEUE = ("*",)
# admin: everything; data: a queue's messages, groups and staged writes; metrics: the figures
ROLE_RULES = {
    "admin": ({"actions": list(ACTIONS), "queues": list(EVERY_QUEUE)},),
    "data": ({"actions": [PUT, RECEIVE, BROWSE, PRODUCERS], "queues": list(EVERY_QUEUE)},),
    "metrics": ({"actions": [METRICS], "queues": list(EVERY_QUEUE)},),
}


def normalized(rules: list) -> list:
    """`rules` (valid) as kept: a rule's actions in ACTIONS' order, each once, and its patterns
    once each, in their order; a rule of cluster actions only without patterns holds every queue."""
    kept = []
    for rule in rules:
        actions = [action for action in ACTIONS if action in rule["actions"]]
        queues = list(dict.fromkeys(rule.get("queues") or EVERY_QUEUE))
        kept.append({"actions": actions, "queues": queues})
    return kept


def check_rules(rules) -> dict | None:
    """None when `rules` are rules a principal may hold, else a bad_request naming what is wrong."""
    if not isinstance(rules, list) or len(rules) > MAX_RULES:
        return error(BAD_REQUEST, f"rules must be a list of at most {MAX_RULES} rules")
    for index, rule in enumerate(rules):
        if not isinstance(rule, dict) or not set(rule) <= {"actions", "queues"} or "actions" not in rule:
            return error(BAD_REQUEST, f"rule {index} must be an object with actions and queues")
        actions = rule["actions"]
        if not isinstance(actions, list) or not actions or not all(a in ACTIONS for a in actions):
            return error(BAD_REQUEST, f"rule {index}: actions must be a non-empty list of "
                                      f"{', '.join(ACTIONS)}")
        queues = rule.get("queues")
        if queues is None and any(action in QUEUE_ACTIONS for action in actions):
            return error(BAD_REQUEST, f"rule {index} names queue actions: it needs queues (patterns such "
                                      "as \"orders-*\", or \"*\" for every queue)")
        if queues is not None and (not isinstance(queues, list) or not 1 <= len(queues) <= MAX_PATTERNS
                                   or not all(is_pattern(q) for q in queues)):
            return error(BAD_REQUEST, f"rule {index}: queues must be a list of 1 to {MAX_PATTERNS} patterns, "
                                      f"each matching {PATTERN_PATTERN} with at most 8 '*' (any run of "
                                      "characters)")
    return None


def allows(rules, action: str, queue: str | None = None) -> bool:
    """Whether some rule allows `action` on `queue` (a cluster action: names no queue)."""
    for rule in rules:
        if action in rule["actions"] and (queue is None or any(pattern_matches(p, queue) for p in rule["queues"])):
            return True
    return False


def patterns(rules, action: str) -> list:
    """The patterns of every rule allowing `action`: the queues it is allowed on."""
    return list(dict.fromkeys(p for rule in rules if action in rule["actions"] for p in rule["queues"]))


def any_pattern_matches(given: list, queue: str) -> bool:
    return any(pattern_matches(p, queue) for p in given)

"""The rules a command must satisfy before it can be applied.

The HTTP layer calls these before anything enters the log, to answer a
client with a precise ``bad_request``; the state machine calls them again
when it applies the command, so that a malformed entry (an older node, a bug,
a hand-written log) is refused identically on every replica instead of
half-applied.  Each function returns ``None`` or an error result; the op
table (``machine.OPS``) names each command's validator, and
``check_command`` runs it.
"""

from raftq.wire_format import NAME_PATTERN, is_name, is_pattern

from .backoff import MAX_FACTOR, full_policy
from .ready import PRIORITIES
from .principals import QUOTAS
from .results import BAD_REQUEST, error
from .rules import MAX_PATTERNS, MAX_RULES, check_rules

MAX_BATCH = 10_000
MAX_RECEIVE = 1_000
MAX_WAIT_MS = 30_000
# Durations are bounded so that `now + duration` stays an exact small integer
# in every encoding the log and the snapshots use (about 31 years).
MAX_DURATION_MS = 1 << 40
MAX_LOG_TIME_MS = 1 << 53        # a log time (about the epoch's milliseconds), exact as a double too

QUEUE_DEFAULTS = {
    "lease_ms": 30_000,
    "max_deliveries": None,
    "dead_letter": None,
    "ttl_ms": None,
    "max_length": None,
    "max_bytes": None,
    "overflow": "reject",
    "dedup_window_ms": 300_000,
    # Redelivery back-off (backoff.py): {"initial_ms", "factor", "max_ms", "jitter"}, or None
    "backoff": None,
    # Keeping what every group is done with, for a replay (retention.py)
    "retention_ms": None,
    "retention_bytes": None,
    # Labels a queue carries for its owner (the SQS API's TagQueue), and the
    # SQS queue attributes that raftq keeps but does not act on in the state
    # machine (docs/sqs.md): both plain string maps, replaced whole by a patch.
    "tags": None,
    "sqs_attributes": None,
}
# The SQS API's own bounds on tags; attributes hold at most a policy document each.
STRING_MAPS = {"tags": (50, 128, 256), "sqs_attributes": (32, 64, 32_768)}   # entries, key, value chars
OVERFLOW_POLICIES = ("reject", "drop_oldest")
GROUP_STARTS = ("earliest", "latest")
MAX_RATE_LIMIT = 1_000_000       # deliveries a second a group may be limited to


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_name(value, what: str):
    if not is_name(value):
        return error(BAD_REQUEST, f"{what} must match {NAME_PATTERN}")
    return None


def check_duration(value, what: str, *, minimum: int = 0, optional: bool = False):
    if value is None and optional:
        return None
    if not is_int(value) or not minimum <= value <= MAX_DURATION_MS:
        return error(BAD_REQUEST, f"{what} must be an integer number of milliseconds >= {minimum}")
    return None


def check_queue_config(config):
    """A queue config, every field optional; unknown fields are refused, not ignored."""
    if not isinstance(config, dict):
        return error(BAD_REQUEST, "queue config must be an object")
    unknown = sorted(set(config) - set(QUEUE_DEFAULTS), key=str)
    if unknown:
        return error(BAD_REQUEST, f"unknown queue config field(s): {', '.join(map(str, unknown))}")
    for field, value in config.items():
        if field == "lease_ms":
            problem = check_duration(value, field, minimum=1)
        elif field in ("max_deliveries", "max_length", "max_bytes", "ttl_ms", "retention_ms", "retention_bytes"):
            problem = check_duration(value, field, minimum=1, optional=True)
        elif field == "backoff":
            problem = check_backoff(value)
        elif field == "dedup_window_ms":
            problem = check_duration(value, field)
        elif field == "dead_letter":
            problem = None if value is None else check_name(value, "dead_letter")
        elif field in STRING_MAPS:
            problem = check_string_map(value, field, *STRING_MAPS[field])
        else:  # overflow
            problem = None if value in OVERFLOW_POLICIES else error(
                BAD_REQUEST, "overflow must be 'reject' or 'drop_oldest'")
        if problem:
            return problem
    return None


def check_string_map(value, what: str, max_entries: int, max_key: int, max_value: int):
    if value is None:
        return None
    if (not isinstance(value, dict) or len(value) > max_entries
            or not all(isinstance(k, str) and 1 <= len(k) <= max_key and isinstance(v, str)
                       and len(v) <= max_value for k, v in value.items())):
        return error(BAD_REQUEST, f"{what} must map at most {max_entries} names of 1 to {max_key} characters "
                                  f"to strings of at most {max_value} characters")
    return None


BACKOFF_FIELDS = ("initial_ms", "factor", "max_ms", "jitter")


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def check_backoff(policy):
    """A back-off policy (backoff.py), every field optional, or None."""
    if policy is None:
        return None
    if not isinstance(policy, dict) or set(policy) - set(BACKOFF_FIELDS):
        return error(BAD_REQUEST, f"backoff must be null or an object of {', '.join(BACKOFF_FIELDS)}")
    for field in ("initial_ms", "max_ms"):
        if field in policy:
            problem = check_duration(policy[field], f"backoff.{field}", minimum=1)
            if problem:
                return problem
    factor, jitter = policy.get("factor", 2), policy.get("jitter", 0)
    if not is_number(factor) or not 1 <= factor <= MAX_FACTOR:
        return error(BAD_REQUEST, f"backoff.factor must be a number from 1 to {MAX_FACTOR}")
    if not is_number(jitter) or not 0 <= jitter <= 1:
        return error(BAD_REQUEST, "backoff.jitter must be a number from 0 to 1 (the share of a delay drawn off)")
    full = full_policy(policy)
    if full["max_ms"] < full["initial_ms"]:
        return error(BAD_REQUEST, "backoff.max_ms must be at least backoff.initial_ms")
    return None


def full_config(partial: dict) -> dict:
    """Defaults overlaid with the given fields, in one canonical key order; a back-off policy
    with every field."""
    config = {field: partial.get(field, default) for field, default in QUEUE_DEFAULTS.items()}
    config["backoff"] = full_policy(config["backoff"])
    return config


def is_plain(value, depth: int = 0) -> bool:
    """JSON-shaped data: what a body may hold besides raw bytes at its top."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return not isinstance(value, int) or isinstance(value, bool) or -(1 << 63) <= value < (1 << 64)
    if depth >= 64:
        return False
    if isinstance(value, list):
        return all(is_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v, depth + 1) for k, v in value.items())
    return False


MESSAGE_FIELDS = frozenset({"body", "key", "id", "headers", "ttl_ms", "delay_ms", "ordering_key", "priority"})
MAX_ORDERING_KEY = 128


def check_message(message, index: int):
    if not isinstance(message, dict):
        return error(BAD_REQUEST, f"message {index} must be an object")
    if not MESSAGE_FIELDS.issuperset(message):
        unknown = set(message) - MESSAGE_FIELDS
        return error(BAD_REQUEST, f"message {index} has unknown field(s): {', '.join(sorted(map(str, unknown)))}")
    if "body" not in message:
        return error(BAD_REQUEST, f"message {index} has no body")
    if not isinstance(message["body"], bytes) and not is_plain(message["body"]):
        return error(BAD_REQUEST, f"message {index}: body must be JSON data or bytes")
    for field in ("key", "id"):
        value = message.get(field)
        if value is not None and (not isinstance(value, str) or not 1 <= len(value) <= 1024):
            return error(BAD_REQUEST, f"message {index}: {field} must be a string of 1 to 1024 characters")
    ordering_key = message.get("ordering_key")
    if ordering_key is not None and (not isinstance(ordering_key, str)
                                     or not 1 <= len(ordering_key) <= MAX_ORDERING_KEY):
        return error(BAD_REQUEST, f"message {index}: ordering_key must be a string of 1 to {MAX_ORDERING_KEY} "
                                  "characters")
    headers = message.get("headers")
    if headers is not None:
        if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            return error(BAD_REQUEST, f"message {index}: headers must map strings to strings")
    for field in ("ttl_ms", "delay_ms"):
        value = message.get(field)
        if value is not None:   # (most messages have neither: no error text is built for them)
            problem = check_duration(value, f"message {index}: {field}", minimum=1 if field == "ttl_ms" else 0)
            if problem:
                return problem
    if "priority" in message and (not is_int(message["priority"]) or not 0 <= message["priority"] < PRIORITIES):
        return error(BAD_REQUEST, f"message {index}: priority must be an integer from 0 to {PRIORITIES - 1}")
    return None


def check_messages(messages):
    if not isinstance(messages, list) or not messages:
        return error(BAD_REQUEST, "messages must be a non-empty list")
    if len(messages) > MAX_BATCH:
        return error(BAD_REQUEST, f"a batch holds at most {MAX_BATCH} messages")
    for index, message in enumerate(messages):
        problem = check_message(message, index)
        if problem:
            return problem
    return None


def check_receipts(receipts):
    if not isinstance(receipts, list) or not receipts or len(receipts) > MAX_BATCH:
        return error(BAD_REQUEST, f"receipts must be a list of 1 to {MAX_BATCH} receipts")
    if not all(isinstance(r, str) and 0 < len(r) <= 300 for r in receipts):
        return error(BAD_REQUEST, "every receipt must be a string that raftq issued")
    return None


def _check_limit(value, what: str):
    """A cap the leader puts in a command (None: no cap, as in entries older than the cap)."""
    if value is not None and (not is_int(value) or value < 0):
        return error(BAD_REQUEST, f"{what} must be a non-negative integer")
    return None


def _check_dedup_budget(cmd):
    return _check_limit(cmd.get("dedup_max_bytes"), "dedup_max_bytes")


def _check_max_queues(cmd):
    return _check_limit(cmd.get("max_queues"), "max_queues")


def _check_stored_bytes_cap(cmd):
    return _check_limit(cmd.get("max_stored_bytes"), "max_stored_bytes")


def check_put(cmd):
    return (check_name(cmd.get("queue"), "queue name") or check_messages(cmd.get("messages"))
            or _check_dedup_budget(cmd) or _check_max_queues(cmd) or _check_stored_bytes_cap(cmd))


def check_receive(cmd):
    problem = check_name(cmd.get("queue"), "queue name") or check_name(cmd.get("group"), "group name")
    if problem:
        return problem
    count = cmd.get("max")
    if not is_int(count) or not 1 <= count <= MAX_RECEIVE:
        return error(BAD_REQUEST, f"max must be an integer from 1 to {MAX_RECEIVE}")
    return check_duration(cmd.get("lease_ms"), "lease_ms", minimum=1, optional=True)


def check_ack(cmd):
    return check_name(cmd.get("queue"), "queue name") or check_receipts(cmd.get("receipts"))


def check_nack(cmd):
    return check_ack(cmd) or check_duration(cmd.get("delay_ms"), "delay_ms", optional=True)


def check_extend(cmd):
    return check_ack(cmd) or check_duration(cmd.get("lease_ms"), "lease_ms", minimum=1, optional=True)


def check_delete_queue(cmd):
    return check_name(cmd.get("queue"), "queue name")


def check_configure_queue(cmd):
    """create_queue and patch_queue: a name and a config."""
    return check_delete_queue(cmd) or check_queue_config(cmd.get("config")) or _check_max_queues(cmd)


def check_group(cmd):
    """delete_group: a queue and a group name."""
    return check_name(cmd.get("queue"), "queue name") or check_name(cmd.get("group"), "group name")


def check_position(position, what: str):
    """Where a group starts, or is moved to: earliest, latest, {"seq": n} or {"time_ms": t}."""
    if position in GROUP_STARTS:
        return None
    if isinstance(position, dict) and len(position) == 1:
        (field, value), = position.items()
        if field == "seq" and is_int(value) and value >= 0:
            return None
        if field == "time_ms" and is_int(value) and value >= 0:
            return None
    return error(BAD_REQUEST, f"{what} must be 'earliest', 'latest', {{\"seq\": n}} or {{\"time_ms\": t}} "
                              "(n and t non-negative integers)")


def check_add_group(cmd):
    return (check_group(cmd) or _check_limit(cmd.get("max_groups"), "max_groups")
            or check_position(cmd.get("start", "earliest"), "start"))


def check_seek_group(cmd):
    return check_group(cmd) or check_position(cmd.get("to"), "to")


PATCH_GROUP_FIELDS = frozenset({"paused", "until_ms", "for_ms", "rate_limit"})


def check_patch_group(cmd):
    """patch_group: pause (until a log time, for a while, or until resumed), resume, rate limit."""
    problem = check_group(cmd)
    if problem:
        return problem
    fields = PATCH_GROUP_FIELDS.intersection(cmd)
    if not {"paused", "rate_limit"} & fields:
        return error(BAD_REQUEST, "a group's patch sets paused, rate_limit or both")
    paused = cmd.get("paused")
    if "paused" in cmd and not isinstance(paused, bool):
        return error(BAD_REQUEST, "paused must be true or false")
    timed = fields & {"until_ms", "for_ms"}
    if timed and paused is not True:
        return error(BAD_REQUEST, "until_ms and for_ms go with paused: true")
    if len(timed) > 1:
        return error(BAD_REQUEST, "a pause ends at until_ms or after for_ms, not both")
    if "for_ms" in cmd:
        problem = check_duration(cmd["for_ms"], "for_ms", minimum=1)
        if problem:
            return problem
    if "until_ms" in cmd and not (is_int(cmd["until_ms"]) and 0 <= cmd["until_ms"] <= MAX_LOG_TIME_MS):
        return error(BAD_REQUEST, "until_ms must be a log time: an integer number of milliseconds")
    rate = cmd.get("rate_limit")
    if rate is not None and (not is_int(rate) or not 1 <= rate <= MAX_RATE_LIMIT):
        return error(BAD_REQUEST, f"rate_limit must be null or an integer from 1 to {MAX_RATE_LIMIT} "
                                  "(deliveries a second)")
    return None


def check_commit(cmd):
    problem = check_group(cmd)
    if not problem and (not is_int(cmd.get("seq")) or cmd["seq"] < 0):
        return error(BAD_REQUEST, "seq must be a non-negative integer")
    return problem


def check_tx(cmd):
    acks, puts = cmd.get("ack", []), cmd.get("put", [])
    if not isinstance(acks, list) or not isinstance(puts, list) or not (acks or puts):
        return error(BAD_REQUEST, "a transaction needs a non-empty 'ack' or 'put' list")
    for part in acks:
        problem = (error(BAD_REQUEST, "each ack must be an object") if not isinstance(part, dict)
                   else check_name(part.get("queue"), "queue name") or check_receipts(part.get("receipts")))
        if problem:
            return problem
    total = 0
    for part in puts:
        problem = (error(BAD_REQUEST, "each put must be an object") if not isinstance(part, dict)
                   else check_name(part.get("queue"), "queue name") or check_messages(part.get("messages")))
        if problem:
            return problem
        total += len(part["messages"])
    if total > MAX_BATCH:
        return error(BAD_REQUEST, f"a transaction puts at most {MAX_BATCH} messages")
    return _check_dedup_budget(cmd) or _check_max_queues(cmd) or _check_stored_bytes_cap(cmd)


def check_redrive(cmd):
    problem = check_name(cmd.get("queue"), "queue name") or (
        cmd.get("from_queue") is not None and check_name(cmd["from_queue"], "from_queue"))
    if problem:
        return problem
    count = cmd.get("max")
    if count is not None and (not is_int(count) or not 1 <= count <= MAX_BATCH):
        return error(BAD_REQUEST, f"max must be an integer from 1 to {MAX_BATCH}")
    request_id = cmd.get("id")
    if request_id is not None and (not isinstance(request_id, str) or not 1 <= len(request_id) <= 1024):
        return error(BAD_REQUEST, "id must be a string of 1 to 1024 characters")
    return None


def check_tick(cmd):
    """tick: the leader's wall clock, read with now_ms, when it is given (wall.py)."""
    wall = cmd.get("wall_ms")
    if wall is not None and (not is_int(wall) or wall < 0):
        return error(BAD_REQUEST, "wall_ms must be a non-negative integer")
    return None


def check_remove_member(cmd):
    return check_name(cmd.get("id"), "node id")


def check_set_member(cmd):
    problem = check_remove_member(cmd)
    if problem:
        return problem
    for field in ("raft_addr", "http_addr"):
        if not isinstance(cmd.get(field), str) or not cmd[field]:
            return error(BAD_REQUEST, f"{field} must be a non-empty string")
    return None


def check_checkpoint(cmd):
    token = cmd.get("token")
    if not isinstance(token, str) or not 0 < len(token) <= 64:
        return error(BAD_REQUEST, "a checkpoint needs a token of 1 to 64 characters")
    return None


MAX_STAGE_CHUNK = 1 << 20
MAX_COMMIT_PARTS = 100_000
MAX_BATCH_ID = (1 << 63) - 1


def check_token(value, what: str):
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        return error(BAD_REQUEST, f"{what} must be a string of 1 to 64 characters")
    return None


def check_int(value, what: str, low: int, high: int):
    if not is_int(value) or not low <= value <= high:
        return error(BAD_REQUEST, f"{what} must be an integer from {low} to {high}")
    return None


STAGE_CAP_NAMES = frozenset({"stages", "bytes", "producer_stages", "producer_bytes", "producer_messages"})


def check_stage_caps(caps):
    if caps is None:
        return None
    if not isinstance(caps, dict) or not STAGE_CAP_NAMES.issuperset(caps):
        return error(BAD_REQUEST, f"caps must be an object of {', '.join(sorted(STAGE_CAP_NAMES))}")
    for name, value in caps.items():
        problem = _check_limit(value, f"caps.{name}")
        if problem:
            return problem
    return None


def check_stage(cmd):
    return (check_name(cmd.get("producer"), "producer id") or check_token(cmd.get("token"), "token")
            or check_int(cmd.get("chunk"), "chunk", 0, MAX_STAGE_CHUNK)
            or check_name(cmd.get("queue"), "queue name") or check_messages(cmd.get("messages"))
            or check_duration(cmd.get("ttl_ms"), "ttl_ms", minimum=1, optional=True)
            or check_stage_caps(cmd.get("caps")))


def check_stage_commit(cmd):
    problem = (check_name(cmd.get("producer"), "producer id")
               or check_int(cmd.get("batch"), "batch", 0, MAX_BATCH_ID)
               or check_duration(cmd.get("retain_ms"), "retain_ms", minimum=1, optional=True)
               or _check_max_queues(cmd) or _check_limit(cmd.get("max_producers"), "max_producers")
               or _check_stored_bytes_cap(cmd))
    if problem:
        return problem
    parts = cmd.get("parts")
    if not isinstance(parts, list) or len(parts) > MAX_COMMIT_PARTS:
        return error(BAD_REQUEST, f"parts must be a list of at most {MAX_COMMIT_PARTS} stages")
    for part in parts:
        if not isinstance(part, dict) or set(part) != {"token", "chunks"}:
            return error(BAD_REQUEST, "each part must be an object with token and chunks")
        problem = (check_token(part["token"], "a part's token")
                   or check_int(part["chunks"], "a part's chunks", 0, MAX_STAGE_CHUNK + 1))
        if problem:
            return problem
    if len({part["token"] for part in parts}) != len(parts):
        return error(BAD_REQUEST, "a commit names each stage once")
    return None


def check_stage_abort(cmd):
    problem = check_name(cmd.get("producer"), "producer id")
    if problem:
        return problem
    tokens = cmd.get("tokens")
    if not isinstance(tokens, list) or len(tokens) > MAX_COMMIT_PARTS:
        return error(BAD_REQUEST, f"tokens must be a list of at most {MAX_COMMIT_PARTS} tokens")
    for token in tokens:
        problem = check_token(token, "every token")
        if problem:
            return problem
    return None


def check_drop_producer(cmd):
    return check_name(cmd.get("producer"), "producer id")


# A relocation's moves, at most: its entry is packed like any other (engine/relocation.py
# sends far fewer), and each move is checked and looked for once per replica.
MAX_RELOCATED = 100_000
# The largest offset and length a reference may hold: rows.py keeps them as 4-byte values.
MAX_REFERENCE = (1 << 32) - 1
BODY_KINDS = (0, 1, 2)     # bodies.py: BYTES, TEXT, JSON


def _check_reference(move: list, at: int):
    """`move[at:]`: the reference a relocation moves from (index, offset, length, kind) and the
    body's bytes, as many as the reference's length."""
    index, offset, length, kind, body = move[at:]
    if not (is_int(index) and index >= 1 and is_int(offset) and 0 <= offset <= MAX_REFERENCE and is_int(length)
            and 0 <= length <= MAX_REFERENCE and is_int(kind) and kind in BODY_KINDS
            and isinstance(body, bytes) and len(body) == length):
        return error(BAD_REQUEST, "each move names a body reference (index >= 1, offset, length, kind) and "
                                  "carries that many bytes")
    return None


def check_relocate(cmd):
    """relocate: the stored messages (queue, [[seq, reference..., bytes], ...]) and staged ones
    ([token, chunk, position, reference..., bytes]) whose bodies move into this entry."""
    queues, stages = cmd.get("queues", []), cmd.get("stages", [])
    if not isinstance(queues, list) or not isinstance(stages, list):
        return error(BAD_REQUEST, "queues and stages must be lists")
    count = len(stages)
    for part in queues:
        if not isinstance(part, list) or len(part) != 2 or not isinstance(part[1], list):
            return error(BAD_REQUEST, "each of queues must be [queue name, moves]")
        problem = check_name(part[0], "queue name")
        if problem:
            return problem
        count += len(part[1])
        for move in part[1]:
            if not isinstance(move, list) or len(move) != 6 or not is_int(move[0]) or move[0] < 1:
                return error(BAD_REQUEST, "each move of a queue must be [seq >= 1, index, offset, length, kind, bytes]")
            problem = _check_reference(move, 1)
            if problem:
                return problem
    for move in stages:
        if not isinstance(move, list) or len(move) != 8:
            return error(BAD_REQUEST, "each move of a stage must be [token, chunk, position, index, offset, length, "
                                      "kind, bytes]")
        problem = (check_token(move[0], "a stage's token") or check_int(move[1], "chunk", 0, MAX_STAGE_CHUNK)
                   or check_int(move[2], "position", 0, MAX_BATCH) or _check_reference(move, 3))
        if problem:
            return problem
    if count > MAX_RELOCATED:
        return error(BAD_REQUEST, f"a relocation moves at most {MAX_RELOCATED} bodies")
    return None


MAX_ASSIGNED_TOGETHER = MAX_BATCH


def _check_queue_names(cmd, field: str):
    """`field`: a list of 1 to MAX_ASSIGNED_TOGETHER queue names."""
    names = cmd.get(field)
    if not isinstance(names, list) or not 1 <= len(names) <= MAX_ASSIGNED_TOGETHER:
        return error(BAD_REQUEST, f"{field} must be a list of 1 to {MAX_ASSIGNED_TOGETHER} queue names")
    for name in names:
        problem = check_name(name, "queue name")
        if problem:
            return problem
    return None


def check_assign(cmd):
    """assign: 1 to MAX_ASSIGNED_TOGETHER queue names, under a cap on the catalog."""
    return _check_queue_names(cmd, "queues") or _check_limit(cmd.get("max_names"), "max_names")


def check_raft_group(cmd):
    """The Raft group a front routed the command for (issue 24), when it says."""
    group = cmd.get("raft_group")
    if group is not None and (not is_int(group) or group < 0):
        return error(BAD_REQUEST, "raft_group must be a non-negative integer")
    return None


def check_catalog_index(cmd):
    """The index of group 0's log at which the view that routed the command read the catalog
    (release.py), when it says."""
    index = cmd.get("catalog_index")
    if index is not None and (not is_int(index) or index < 0):
        return error(BAD_REQUEST, "catalog_index must be a non-negative integer")
    return None


def check_names(cmd):
    """retire_names: 1 to MAX_ASSIGNED_TOGETHER queue names."""
    return _check_queue_names(cmd, "names")


def check_release_names(cmd):
    """release_names: a group and the names it retires, and (a release taken in turn) the
    group's fence when its releaser read them."""
    group = cmd.get("group")
    if not is_int(group) or group < 0:
        return error(BAD_REQUEST, "group must be a non-negative integer")
    fence = cmd.get("fence")
    if fence is not None and (not is_int(fence) or fence < 0):
        return error(BAD_REQUEST, "fence must be a non-negative integer")
    return check_names(cmd)


def check_names_released(cmd):
    """names_released: the names group 0 released, the index of its entry that did, and
    whether that release was taken in turn."""
    index = cmd.get("index")
    if not is_int(index) or index < 0:
        return error(BAD_REQUEST, "index must be a non-negative integer")
    if not isinstance(cmd.get("in_turn", False), bool):
        return error(BAD_REQUEST, "in_turn must be true or false")
    return check_names(cmd)


def check_now(cmd):
    """What every command carries besides its op: the leader's log time."""
    now = cmd.get("now_ms")
    if not is_int(now) or now < 0:
        return error(BAD_REQUEST, "now_ms must be a non-negative integer")
    return None


def check_record_members(cmd):
    """record_members: each group but group 0's members, distinct node ids (how many groups
    the machine checks: it knows the group count)."""
    groups = cmd.get("groups")
    if not isinstance(groups, list) or not groups:
        return error(BAD_REQUEST, "groups must be a non-empty list of member lists")
    for members in groups:
        if not isinstance(members, list) or not members:
            return error(BAD_REQUEST, "each group's members must be a non-empty list of node ids")
        for member in members:
            problem = check_name(member, "node id")
            if problem:
                return problem
        if len(set(members)) != len(members):
            return error(BAD_REQUEST, "a group's members are distinct node ids")
    return None


def check_replica_move(cmd):
    """replica_move: a group g > 0 and two different node ids, its member leaving and the one joining."""
    group = cmd.get("group")
    if not is_int(group) or group < 1:
        return error(BAD_REQUEST, "group must be a positive integer (group 0 spans every node)")
    for field in ("source", "target"):
        problem = check_name(cmd.get(field), f"{field} node id")
        if problem:
            return problem
    if cmd["source"] == cmd["target"]:
        return error(BAD_REQUEST, "a replica moves to another node than its own")
    return None


# What the SQS API takes as an access key id (engine/config.py's rule for cluster.toml alike),
# and the roles a key acts as
SQS_ACCESS_KEY_CHARS = (16, 128)
SQS_ROLES = ("admin", "data")
MAX_SEALED_SECRET_BYTES = 512


def check_sqs_key_remove(cmd):
    """sqs_key_remove: an access key id of 16 to 128 letters and digits."""
    access_key = cmd.get("access_key")
    low, high = SQS_ACCESS_KEY_CHARS
    if not isinstance(access_key, str) or not low <= len(access_key) <= high or not access_key.isascii() \
            or not access_key.isalnum():
        return error(BAD_REQUEST, f"access_key must be {low} to {high} letters and digits")
    return None


def check_sqs_key_add(cmd):
    """sqs_key_add: an access key id, its role, and its secret as the front sealed it."""
    problem = check_sqs_key_remove(cmd)
    if problem:
        return problem
    if cmd.get("role") not in SQS_ROLES:
        return error(BAD_REQUEST, "role must be admin or data")
    return _check_sealed(cmd.get("sealed"))


def _check_sealed(sealed):
    if not isinstance(sealed, bytes) or not 0 < len(sealed) <= MAX_SEALED_SECRET_BYTES:
        return error(BAD_REQUEST, f"sealed must be 1 to {MAX_SEALED_SECRET_BYTES} bytes")
    return None


# ---- principals (principals.py, quotas.py, rules.py) ------------------------------------------
TOKEN_HASH_BYTES = 32
MAX_QUOTA = 1 << 62
MAX_BY_CHARS = 256


def check_quotas(quotas, what: str = "quotas"):
    if not isinstance(quotas, dict) or not set(quotas) <= set(QUOTAS) \
            or not all(is_int(v) and 0 <= v <= MAX_QUOTA for v in quotas.values()):
        return error(BAD_REQUEST, f"{what} must map some of {', '.join(QUOTAS)} to integers from 0 to {MAX_QUOTA}")
    return None


def check_acting_principal(cmd):
    """What a command of a principal carries (every op may): its name and its quotas, as the
    front read them, and the queues it may touch that only the state names (``allowed_queues``:
    a redrive's sources, a stage commit's stages)."""
    principal = cmd.get("principal")
    if principal is not None and not is_name(principal):
        return error(BAD_REQUEST, f"principal must match {NAME_PATTERN}")
    if cmd.get("quotas") is not None:
        problem = check_quotas(cmd["quotas"])
        if problem:
            return problem
    allowed = cmd.get("allowed_queues")
    if allowed is not None and (not isinstance(allowed, list) or len(allowed) > MAX_RULES * MAX_PATTERNS
                                or not all(is_pattern(p) for p in allowed)):
        return error(BAD_REQUEST, "allowed_queues must be a list of queue-name patterns")
    return None


def _check_by(cmd):
    by = cmd.get("by")
    if by is not None and (not isinstance(by, str) or not 1 <= len(by) <= MAX_BY_CHARS):
        return error(BAD_REQUEST, f"by must be a string of 1 to {MAX_BY_CHARS} characters")
    return None


def _check_token_hash(value):
    if value is not None and (not isinstance(value, bytes) or len(value) != TOKEN_HASH_BYTES):
        return error(BAD_REQUEST, f"token_hash must be {TOKEN_HASH_BYTES} bytes")
    return None


def _check_sealed_key(key):
    if key is None:
        return None
    if not isinstance(key, dict) or set(key) != {"access_key", "sealed"}:
        return error(BAD_REQUEST, "sqs_key must be an object with access_key and sealed")
    return check_sqs_key_remove(key) or _check_sealed(key["sealed"])


def check_principal_remove(cmd):
    """principal_remove: the principal's name, and who removes it."""
    return check_name(cmd.get("name"), "principal name") or _check_by(cmd)


def check_principal_add(cmd):
    """principal_add: a name, rules, quotas, and credentials as the front made them: a token's
    hash and an SQS key's sealed secret, at least one of them."""
    problem = (check_principal_remove(cmd) or check_rules(cmd.get("rules"))
               or check_quotas(cmd.get("quotas", {})) or _check_token_hash(cmd.get("token_hash"))
               or _check_sealed_key(cmd.get("sqs_key")))
    if problem:
        return problem
    if cmd.get("token_hash") is None and cmd.get("sqs_key") is None:
        return error(BAD_REQUEST, "a principal needs a token or an SQS key")
    return None


def check_principal_update(cmd):
    """principal_update: a name and at least one of rules, quotas, a new token's hash, an SQS key."""
    problem = check_principal_remove(cmd)
    if problem:
        return problem
    if not {"rules", "quotas", "token_hash", "sqs_key"} & set(cmd):
        return error(BAD_REQUEST, "a change names rules, quotas, token_hash or sqs_key")
    if "token_hash" in cmd and cmd["token_hash"] is None:
        return error(BAD_REQUEST, f"token_hash must be {TOKEN_HASH_BYTES} bytes")
    if "sqs_key" in cmd and cmd["sqs_key"] is None:
        return error(BAD_REQUEST, "sqs_key must be an object with access_key and sealed")
    return ((check_rules(cmd["rules"]) if "rules" in cmd else None)
            or (check_quotas(cmd["quotas"]) if "quotas" in cmd else None)
            or _check_token_hash(cmd.get("token_hash")) or _check_sealed_key(cmd.get("sqs_key")))


def check_node_leaving(cmd):
    """node_leaving: the id of the node whose replicas move away before it leaves."""
    return check_name(cmd.get("id"), "node id")


def check_replica_moved(cmd):
    """replica_moved: the move in progress, and whether the target took the source's place."""
    if not isinstance(cmd.get("moved"), bool):
        return error(BAD_REQUEST, "moved must be true or false")
    return check_replica_move(cmd)

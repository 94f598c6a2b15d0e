"""The node's caps on what clients may make: queues, groups per queue, the
dedup window, ids kept for deduplication (docs/security.md).

Counts are checked on the leader before a command enters the log, against
the state it has applied, so the state machine never reads a node option
(replicas with other options apply the same log alike). Commands already in
flight are not counted: concurrent creations may pass a cap by as many as
are in flight together. The dedup budget travels in the put itself
(``dedup_max_bytes``), so every replica forgets the same oldest ids.
"""

from .errors import ApiError


def _refuse(what: str, cap: int, option: str):
    raise ApiError("limit_reached", f"{what} (limit {cap}, the node option --{option})",
                   headers={"Retry-After": "60"})


def _created_by(command: dict) -> list:
    op = command["op"]
    if op == "create_queue":
        return [command["queue"]]
    if op == "put" and command.get("auto_create", True):
        return [command["queue"]]
    if op == "tx" and command.get("auto_create", True):
        return [part["queue"] for part in command.get("put", [])]
    return []


def prepare(limits, command: dict) -> list | None:
    """The checks that need no state; then the queues whose existence alone
    passes every cap (none: nothing to check), or None when the caps need
    the usage read (``check``).

    A write into queues that exist creates nothing, so the engine can check
    their existence as it submits (``submit(..., if_queues_exist=...)``):
    a put costs one round trip to the engine, not two.
    """
    op = command["op"]
    config = command.get("config")
    if op in ("create_queue", "patch_queue") and isinstance(config, dict) \
            and (config.get("dedup_window_ms") or 0) > limits.max_dedup_window_ms:
        raise ApiError("bad_request", f"dedup_window_ms may be at most {limits.max_dedup_window_ms} "
                                      "(the node option --max-dedup-window-ms)")
    if op in ("put", "tx"):
        # The state machine forgets a queue's oldest ids beyond this; carried in
        # the command so that every replica forgets the same ones.
        command["dedup_max_bytes"] = limits.max_dedup_bytes
    return None if op == "add_group" else list(dict.fromkeys(_created_by(command)))


async def check(node, limits, command: dict) -> None:
    prepare(limits, command)
    op = command["op"]
    created = _created_by(command)
    grouped = [command["queue"]] if op == "add_group" else []
    names = list(dict.fromkeys(created + grouped))
    if not names:
        return
    usage = (await node.read("usage", names)).result
    new = [n for n in dict.fromkeys(created) if usage["named"][n] is None]
    if new and usage["queues"] + len(new) > limits.max_queues:
        _refuse(f"this cluster holds {usage['queues']} queues", limits.max_queues, "max-queues")
    for name in grouped:
        groups = usage["named"][name]
        if groups is not None and groups >= limits.max_groups_per_queue:
            _refuse(f"queue {name!r} has {groups} groups", limits.max_groups_per_queue,
                    "max-groups-per-queue")

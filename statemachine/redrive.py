"""Dead-letter redrive: send a dead-letter queue's messages back to the queue they died in.

A dead letter names its source in the ``x-raftq-from-queue`` header that the
move into the dead-letter queue gave it.  ``redrive`` takes the dead-letter
queue's stored messages in seq order and, for each one that carries that
header (and matches ``from_queue`` when given), puts it back into its source
queue and removes it from the dead-letter queue — all in the one log entry of
the command, up to ``max`` messages.

Rules (docs/api.md):

- moving back is a put into the source queue: it goes to every group there,
  keyed replacement and the source's TTL included; the four dead-letter
  headers are taken off, the message's own headers stay;
- a dead letter leased by a consumer of the dead-letter queue is left where it
  is (someone is handling it);
- a source queue that no longer exists, or is full (``overflow: reject``),
  keeps its dead letters where they are; later dead letters of the same source
  wait with them, so a source receives its dead letters in their order;
- a redrive of a principal moves only the dead letters of the sources it may
  redrive to (``allowed_queues``, its patterns: rules.py); the others stay where
  they are, as if ``from_queue`` had left them out;
- a redrive with an ``id`` is answered once: the same id again within the
  dead-letter queue's ``dedup_window_ms`` moves nothing and answers the first
  result with ``"duplicate": true`` (clients retry with the same id after a
  timeout or failover).
"""

from .rules import any_pattern_matches

FROM_QUEUE = "x-raftq-from-queue"
DEAD_LETTER_HEADERS = frozenset({FROM_QUEUE, "x-raftq-from-group", "x-raftq-deliveries", "x-raftq-reason"})
DEFAULT_MAX = 1_000


def redrive(machine, cmd) -> dict:
    dlq = machine._touch(cmd["queue"])
    if dlq is None:
        return machine._missing(cmd["queue"])
    request_id = cmd.get("id")
    if request_id is not None and request_id in dlq.redrives:
        return {**dlq.redrives[request_id][0], "duplicate": True}
    wanted, limit = cmd.get("from_queue"), cmd.get("max") or DEFAULT_MAX
    allowed = cmd.get("allowed_queues")
    moved, to = 0, {}
    blocked = set()        # sources that are gone or full: their later dead letters wait too
    # Only the message at hand leaves the dead-letter queue, so a copy of its seqs stays true.
    rows = dlq.rows
    for seq in rows.seqs():
        if moved == limit:
            break
        held_headers = rows.headers.get(seq, ())
        source = dict(held_headers).get(FROM_QUEUE)
        if source is None or source == dlq.name or source in blocked or wanted not in (None, source) \
                or (allowed is not None and not any_pattern_matches(allowed, source)):
            continue
        if any(seq in group.leases for group in dlq.groups.values()):
            continue
        target = machine.queues.get(source)
        if target is not None:
            machine._advance(target)
        headers = {k: v for k, v in held_headers if k not in DEAD_LETTER_HEADERS} or None
        back = [{"body": rows.body(seq), "key": rows.keys.get(seq), "headers": headers,
                 "ordering_key": dlq.ordering.get(seq), "priority": rows.priority_of(seq)}]
        if target is None or target.check_capacity(back):
            blocked.add(source)
            continue
        target.put(back, machine.clock)
        dlq._remove(seq)
        dlq.counters["redriven_total"] += 1
        moved += 1
        to[source] = to.get(source, 0) + 1
    result = {"moved": moved, "to": to}
    if request_id is not None:
        dlq.redrives[request_id] = (result, machine.clock)
        dlq.redrive_order.append((machine.clock, request_id))
    return {**result, "duplicate": False}

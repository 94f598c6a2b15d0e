"""A snapshot of this release rewritten in an older version's layout, for the
tests that restore older versions (statemachine/machine.py reads 4 on).

Before version 9 a queue's messages were one list per field (seq, body, key,
headers, put_at, visible_at, expires_at, size, pending, received) holding the
stored messages only, and a group's ready seqs a list; version 9 holds the
columns of statemachine/rows.py and runs of ready seqs (statemachine/ready.py);
version 10 adds each row's body reference (statemachine/bodies.py) and holds
only the bodies without one, by row, where version 9 holds every row's body;
version 11 adds group 0's record of each group's members (a test that writes
an older one drops it: a reader takes it when present); version 12 holds a
staged message's body reference as its "ref" (statemachine/staging.py);
version 13 adds each group's names leaving the catalog and the catalog's
count of releases (statemachine/release.py), which an older one lacks;
version 14 adds the catalog's last release of each group taken in turn
(statemachine/catalog.py); version 15 the SQS keys group 0 keeps
(statemachine/credentials.py), which a reader takes when present; version 16
the wall time of log time (statemachine/wall.py), likewise; version 17 adds
each row's priority (a column of the rows, after the references'), retained
rows (a received value of 2) and each group's pause and rate limit (after its
first deliveries' times); version 18 keeps
principals (statemachine/principals.py) in place of the SQS keys and the
queues' owners (statemachine/quotas.py), which a reader of version 17 takes
as principals of the keys' roles and none owned.
A snapshot with references has no older layout: only one of a machine
that applied its entries without their log indexes is rewritten; nor has
one with a priority, a retained message, a back-off policy or retention in a
queue's config, or a paused or limited group before version 17.
Written here from the version-17 layout, not with the machine's own code, so
that a reader that misreads either layout fails the tests. The group's fields
(its id, the group count, the catalog), which version 8 lacks, and the
names leaving the catalog, which version 12 lacks, and the last releases,
which version 13 lacks, are kept: a reader takes
them when present, and one group's snapshot without them
restores as group 0 of 1 all the same.
"""

import cbor2

RETAINED = 2
FEATURES_OF_17 = ("backoff", "retention_ms", "retention_bytes")


class NoOlderLayout(ValueError):
    """The state holds something the older version cannot say."""


def downgraded(snapshot: bytes, version: int) -> dict:
    """The decoded snapshot, marked `version`, its messages in that version's layout."""
    state = cbor2.loads(snapshot)
    state["version"] = version
    if version < 18:
        without_principals(state)
    for queue in state["queues"]:
        if version < 17:
            without_issue_51(queue)
        if version < 9:
            queue[6] = message_lists(queue[6])
            for group in queue[8]:
                group[1] = ready_list(group[1])
        elif version < 10:
            queue[6] = rows_without_references(queue[6])
    return state


def without_principals(state: dict) -> None:
    """Version 17's state: the SQS keys group 0 keeps (none, as a state without principals has), no
    queue owned, no quotas carried (version 18's principals and quotas, statemachine/quotas.py)."""
    principals, quotas = state.pop("principals"), state.pop("quotas")
    if principals["principals"] or principals["audit"] or principals["version"]:
        raise NoOlderLayout("the state keeps principals, or their changes")
    if quotas["queues"] or quotas["names"] or quotas["carried"]:
        raise NoOlderLayout("the state holds a principal's queues or quotas")
    state["credentials"] = {"sqs_keys": []}


def without_issue_51(queue: list) -> None:
    """A queue's state without the priorities column and the groups' pauses (version 16's)."""
    config, rows, groups = queue[1], queue[6], queue[8]
    if any(config.get(field) is not None for field in FEATURES_OF_17):
        raise NoOlderLayout(f"queue {queue[0]!r} has {FEATURES_OF_17} in its config")
    priorities, received = rows.pop(14), rows[6]
    if any(priorities[0]) or RETAINED in received[0]:
        raise NoOlderLayout(f"queue {queue[0]!r} holds a message with a priority, or a retained one")
    for group in groups:
        paused, resume_at, pace = group.pop(7)
        if paused or pace is not None:
            raise NoOlderLayout(f"group {group[0]!r} of queue {queue[0]!r} is paused or limited")
    for field in FEATURES_OF_17:
        config.pop(field, None)


def ready_list(runs: list) -> list:
    """A group's ready seqs, in order, from version 9's [first seqs, lengths] runs of consecutive ones."""
    return [seq for start, length in zip(*runs) for seq in range(start, start + length)]


def rows_without_references(rows_state: list) -> list:
    """Version 9's rows from version 14's (or a later one's): every row's body in one list, no reference columns."""
    base, (rows, unreferenced), *columns = rows_state
    ref_index = numbers(columns[8])
    assert not any(ref_index), "a snapshot with body references has no older layout"
    bodies = [None] * len(ref_index)
    for row, body in zip(rows, unreferenced):
        bodies[row] = body
    return [base, bodies, *columns[:8]]


def message_lists(rows_state: list) -> list:
    """Version 8's lists of the stored messages' fields from version 14's rows."""
    base, bodies, put_at, expires_at, sizes, pending, received, keys, headers, shows_at = \
        rows_without_references(rows_state)
    put_at, expires_at, sizes, pending, received = map(numbers, (put_at, expires_at, sizes, pending, received))
    keys, headers, shows_at = dict(zip(*keys)), dict(zip(*headers)), dict(zip(*shows_at))
    live = [row for row, groups in enumerate(pending) if groups]
    seqs = [base + row for row in live]
    return [seqs, [bodies[row] for row in live], [keys.get(seq) for seq in seqs],
            [headers.get(seq) for seq in seqs], [put_at[row] for row in live],
            [shows_at.get(base + row, put_at[row]) for row in live],
            [expires_at[row] or None for row in live], [sizes[row] for row in live],
            [pending[row] for row in live], [received[row] == 1 for row in live]]


def numbers(runs: list) -> list:
    """A column from its [values, lengths] runs."""
    values, lengths = runs
    return [value for value, length in zip(values, lengths) for _ in range(length)]

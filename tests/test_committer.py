"""engine.committer: how concurrent commands are packed into log entries.

The committer's only collaborator is the function that proposes an entry;
here it is a list that stands for the log and answers each entry once the
test says it committed.
"""

import asyncio

import cbor2
import pytest

from raftq.engine.committer import GroupCommitter
from raftq.engine.outcome import CommitError


class Log:
    def __init__(self):
        self.proposed = []   # (commands, term, callback)

    def propose(self, entry, term, callback):
        self.proposed.append((cbor2.loads(entry), term, callback))

    def commit_all(self):
        for index, (commands, _, callback) in enumerate(self.proposed, start=1):
            callback((index, [{"echo": c["n"]} for c in commands]), None)


def run(coro):
    return asyncio.run(coro)


def test_concurrent_commands_share_one_entry_and_each_gets_its_own_result():
    async def scenario():
        log = Log()
        committer = GroupCommitter(log.propose)
        futures = [committer.enqueue(cbor2.dumps({"n": i}), term=3) for i in range(5)]
        await asyncio.sleep(0)
        assert [(len(cmds), term) for cmds, term, _ in log.proposed] == [(5, 3)]
        log.commit_all()
        return [(c.result["echo"], c.index) for c in await asyncio.gather(*futures)]

    assert run(scenario()) == [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1)]


def test_an_entry_never_mixes_commands_stamped_in_different_terms():
    async def scenario():
        log = Log()
        committer = GroupCommitter(log.propose)
        futures = [committer.enqueue(cbor2.dumps({"n": 0}), term=3), committer.enqueue(cbor2.dumps({"n": 1}), term=3),
                   committer.enqueue(cbor2.dumps({"n": 2}), term=4), committer.enqueue(cbor2.dumps({"n": 3}), term=3)]
        await asyncio.sleep(0)
        log.commit_all()
        await asyncio.gather(*futures)
        return [([c["n"] for c in cmds], term) for cmds, term, _ in log.proposed]

    assert run(scenario()) == [([0, 1], 3), ([2], 4), ([3], 3)]


def test_a_cancelled_command_does_not_decide_the_term_of_the_next_entry():
    async def scenario():
        log = Log()
        committer = GroupCommitter(log.propose)
        gone = committer.enqueue(cbor2.dumps({"n": 0}), term=3)
        kept = committer.enqueue(cbor2.dumps({"n": 1}), term=4)
        gone.cancel()
        await asyncio.sleep(0)
        log.commit_all()
        await kept
        return [([c["n"] for c in cmds], term) for cmds, term, _ in log.proposed]

    assert run(scenario()) == [([1], 4)]


def test_in_flight_entries_are_bounded_and_the_rest_wait_for_a_commit():
    async def scenario():
        log = Log()
        committer = GroupCommitter(log.propose, max_commands=1, max_in_flight=2)
        futures = [committer.enqueue(cbor2.dumps({"n": i}), term=1) for i in range(4)]
        await asyncio.sleep(0)
        first_round = len(log.proposed)
        log.commit_all()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert [f.done() for f in futures] == [True, True, False, False]
        return first_round, committer.backlog, len(log.proposed)

    assert run(scenario()) == (2, 0, 4)


def test_refusals_reach_every_command_of_the_entry():
    async def scenario():
        log = Log()
        committer = GroupCommitter(log.propose)
        futures = [committer.enqueue(cbor2.dumps({"n": i}), term=1) for i in range(3)]
        await asyncio.sleep(0)
        log.proposed[0][2](None, "not_leader")
        return await asyncio.gather(*futures, return_exceptions=True)

    outcomes = run(scenario())
    assert [type(o) for o in outcomes] == [CommitError] * 3
    assert {o.code for o in outcomes} == {"not_leader"}


def test_a_command_too_big_for_any_entry_is_refused_before_the_log():
    async def scenario():
        log = Log()
        committer = GroupCommitter(log.propose, max_entry_bytes=100)
        future = committer.enqueue(cbor2.dumps({"n": 0, "body": "x" * 200}), term=1)
        with pytest.raises(CommitError) as refused:
            await future
        return refused.value.code, log.proposed

    assert run(scenario()) == ("too_large", [])


def test_what_is_queued_before_packing_rides_behind_the_commands_queued_and_in_their_entry():
    """The hook the long polls use: receives queued as an entry is about to be packed go in
    it, after every command queued so far."""
    async def scenario():
        log = Log()
        hooked = []

        def before_packing():
            hooked.append(committer.backlog)
            if len(hooked) == 1:
                riders.append(committer.enqueue(cbor2.dumps({"n": 99}), term=3))

        riders: list = []
        committer = GroupCommitter(log.propose, before_packing=before_packing)
        futures = [committer.enqueue(cbor2.dumps({"n": i}), term=3) for i in range(3)]
        await asyncio.sleep(0)
        log.commit_all()
        results = [c.result["echo"] for c in await asyncio.gather(*futures, *riders)]
        return results, [[c["n"] for c in cmds] for cmds, _, _ in log.proposed], hooked[0]

    results, entries, backlog_when_hooked = run(scenario())
    assert entries == [[0, 1, 2, 99]]
    assert results == [0, 1, 2, 99]
    assert backlog_when_hooked == 3

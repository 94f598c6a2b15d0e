"""The bookkeeping of confirmed leader reads (engine.raft.read_index), alone."""

from raftq.engine.raft.read_index import ReadConfirmations


class Ticket:
    def __init__(self, name):
        self.name, self.done = name, False


def names(tickets):
    return [t.name for t in tickets]


def test_a_read_waits_for_a_majority_of_answers_to_appends_sent_after_it():
    reads = ReadConfirmations()
    reads.begin_leading(now=10.0)
    reads.answered("f1", 11.0)
    reads.answered("f2", 11.5)
    reads.ask(12.0, read_index=7, ticket=Ticket("r"))
    assert reads.wants_round(voters=3)                                 # no round since it arrived
    reads.round_sent(12.1)
    assert not reads.wants_round(voters=3)
    assert names(reads.confirmed(voters=3, applied=7)) == []           # answers predate it
    reads.answered("f1", 12.1)
    assert names(reads.confirmed(voters=3, applied=6)) == []           # not applied up to 7
    assert names(reads.confirmed(voters=3, applied=7)) == ["r"]


def test_five_voters_need_two_followers_and_one_round_is_out_at_a_time():
    reads = ReadConfirmations()
    reads.begin_leading(now=0.0)
    reads.ask(1.0, 3, Ticket("a"))
    assert reads.wants_round(voters=5)
    reads.round_sent(1.0)
    reads.ask(1.0, 3, Ticket("b"))                    # the round that just left covers it
    reads.ask(2.0, 4, Ticket("c"))
    reads.ask(2.5, 4, Ticket("d"))
    assert not reads.wants_round(voters=5)            # c and d wait for the round out now
    reads.answered("f1", 1.0)
    assert names(reads.confirmed(voters=5, applied=9)) == []
    assert not reads.wants_round(voters=5)
    reads.answered("f3", 1.0)
    assert names(reads.confirmed(voters=5, applied=9)) == ["a", "b"]
    assert reads.wants_round(voters=5)                # answered: one more round covers c and d
    reads.round_sent(3.0)
    reads.answered("f3", 3.0)
    reads.answered("f4", 3.0)
    assert names(reads.confirmed(voters=5, applied=9)) == ["c", "d"]
    assert not reads.wants_round(voters=5)


def test_answers_from_before_this_leadership_and_going_backwards_count_for_nothing():
    reads = ReadConfirmations()
    reads.begin_leading(now=5.0)
    reads.answered("f1", 4.0)                   # an append of an earlier leadership
    reads.ask(5.0, 1, Ticket("r"))
    assert names(reads.confirmed(voters=3, applied=1)) == []
    reads.answered("f1", 6.0)
    reads.answered("f1", 5.5)                   # a late answer to an older append
    reads.ask(6.0, 1, Ticket("s"))
    assert names(reads.confirmed(voters=3, applied=1)) == ["r", "s"]


def test_a_new_leadership_hands_back_the_pending_reads_and_timed_out_ones_are_dropped():
    reads = ReadConfirmations()
    reads.begin_leading(now=0.0)
    late, kept = Ticket("late"), Ticket("kept")
    reads.ask(1.0, 1, late)
    reads.ask(2.0, 1, kept)
    late.done = True
    reads.answered("f1", 2.0)
    assert names(reads.confirmed(voters=3, applied=1)) == ["kept"]
    reads.ask(3.0, 1, Ticket("old term"))
    assert names(reads.begin_leading(now=4.0)) == ["old term"]
    assert names(reads.confirmed(voters=1, applied=0)) == []


def test_a_single_voter_confirms_by_itself():
    reads = ReadConfirmations()
    reads.begin_leading(now=0.0)
    reads.ask(1.0, 2, Ticket("r"))
    assert names(reads.confirmed(voters=1, applied=1)) == []
    assert names(reads.confirmed(voters=1, applied=2)) == ["r"]

"""engine/balance.py's decision: whom a group's leader hands its leadership to."""

from raftq.engine.balance import CLOSE_ENTRIES, preferred_successor

TIMEOUT_S = 0.6


def status(self_id: str, commit: int = 10, role: str = "leader", **peers) -> dict:
    """A Consensus.status() of `self_id`; each peer as (last_contact_ms, match_index)."""
    return {"self_id": self_id, "role": role, "commit_index": commit,
            "peers": {p: {"last_contact_ms": contact, "match_index": match} for p, (contact, match) in peers.items()}}


def test_a_leader_first_in_the_preference_keeps_it():
    assert preferred_successor(["n1", "n2", "n3"], status("n1", n2=(10, 10), n3=(10, 10)), TIMEOUT_S) is None


def test_a_leader_hands_over_to_the_first_preference_when_it_is_live_and_caught_up():
    assert preferred_successor(["n2", "n1", "n3"], status("n1", n2=(50, 10), n3=(10, 10)), TIMEOUT_S) == "n2"


def test_a_preference_not_heard_within_the_election_timeout_is_passed_over():
    assert preferred_successor(["n2", "n3", "n1"], status("n1", n2=(700, 10), n3=(10, 10)), TIMEOUT_S) == "n3"
    assert preferred_successor(["n2", "n3", "n1"], status("n1", n2=(None, 0), n3=(10, 10)), TIMEOUT_S) == "n3"


def test_a_live_preference_a_round_of_appends_behind_takes_it():
    """Under writes a follower's log trails the commit index by an append or two; the hand-over
    holds writes back until it has the rest."""
    for match in (999, 1000 - CLOSE_ENTRIES):
        assert preferred_successor(["n2", "n3", "n1"], status("n1", 1000, n2=(10, match), n3=(10, 1000)),
                                   TIMEOUT_S) == "n2"


def test_a_live_preference_far_behind_is_waited_for_not_passed_over():
    """Replaying, or sent a snapshot: handing the lead to n3 meanwhile would only have n3 hand it
    on to n2 once n2 caught up."""
    behind = status("n1", 1000, n2=(10, 999 - CLOSE_ENTRIES), n3=(10, 1000))
    assert preferred_successor(["n2", "n3", "n1"], behind, TIMEOUT_S) is None


def test_only_a_leader_hands_over():
    assert preferred_successor(["n2", "n1"], status("n1", role="follower", n2=(10, 10)), TIMEOUT_S) is None


def test_a_preference_that_is_not_a_peer_is_passed_over():
    assert preferred_successor(["n9", "n2", "n1"], status("n1", n2=(10, 10)), TIMEOUT_S) == "n2"

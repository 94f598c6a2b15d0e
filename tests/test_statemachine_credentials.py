"""The SQS keys group 0 keeps (statemachine/credentials.py): rules, a model they are compared
with under Hypothesis, and snapshots."""

import cbor2
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from raftq.statemachine import StateMachine
from raftq.statemachine.credentials import MAX_SQS_KEYS

ADMIN_KEY = "AKIAADMINKEY00000001"
DATA_KEY = "AKIADATAKEY000000001"


def run(sm: StateMachine, op: str, **fields) -> dict:
    return sm.apply({"op": op, "now_ms": 1, **fields})


def test_a_key_is_added_once_listed_with_its_seal_and_removed_once():
    sm = StateMachine()
    assert run(sm, "sqs_key_add", access_key=ADMIN_KEY, role="admin", sealed=b"s1") == {"added": True}
    assert run(sm, "sqs_key_add", access_key=ADMIN_KEY, role="admin", sealed=b"s1") == {"added": False}
    assert run(sm, "sqs_key_add", access_key=ADMIN_KEY, role="data", sealed=b"s1")["error"] == "conflict"
    assert run(sm, "sqs_key_add", access_key=ADMIN_KEY, role="admin", sealed=b"s2")["error"] == "conflict"
    assert run(sm, "sqs_key_add", access_key=DATA_KEY, role="data", sealed=b"s3") == {"added": True}
    assert sm.read("sqs_keys") == {"keys": [{"access_key": ADMIN_KEY, "role": "admin", "sealed": b"s1"},
                                            {"access_key": DATA_KEY, "role": "data", "sealed": b"s3"}]}
    assert run(sm, "sqs_key_remove", access_key=ADMIN_KEY) == {"removed": True}
    assert run(sm, "sqs_key_remove", access_key=ADMIN_KEY)["error"] == "not_found"
    assert [k["access_key"] for k in sm.read("sqs_keys")["keys"]] == [DATA_KEY]


def test_malformed_keys_are_refused_and_change_nothing():
    sm = StateMachine()
    for fields in ({"access_key": "short", "role": "data", "sealed": b"s"},
                   {"access_key": "AKIA" + "é" * 16, "role": "data", "sealed": b"s"},
                   {"access_key": ADMIN_KEY, "role": "metrics", "sealed": b"s"},
                   {"access_key": ADMIN_KEY, "role": "admin", "sealed": "text"},
                   {"access_key": ADMIN_KEY, "role": "admin", "sealed": b""},
                   {"access_key": ADMIN_KEY, "role": "admin", "sealed": b"x" * 513}):
        assert run(sm, "sqs_key_add", **fields)["error"] == "bad_request", fields
    assert run(sm, "sqs_key_remove", access_key=None)["error"] == "bad_request"
    assert sm.read("sqs_keys") == {"keys": []}


def test_only_group_0_keeps_keys_and_the_cluster_keeps_at_most_a_hundred():
    other = StateMachine(1, 4)
    assert run(other, "sqs_key_add", access_key=ADMIN_KEY, role="admin", sealed=b"s")["error"] == "wrong_group"
    sm = StateMachine(0, 4)
    for n in range(MAX_SQS_KEYS):
        assert run(sm, "sqs_key_add", access_key=f"AKIA{n:016d}", role="data", sealed=b"s")["added"]
    assert run(sm, "sqs_key_add", access_key=DATA_KEY, role="data", sealed=b"s")["error"] == "limit_reached"


def test_keys_survive_a_snapshot_and_an_older_one_restores_with_none():
    sm = StateMachine(0, 4)
    run(sm, "sqs_key_add", access_key=ADMIN_KEY, role="admin", sealed=b"sealed")
    restored = StateMachine()
    restored.restore(sm.snapshot())
    assert restored.read("sqs_keys") == sm.read("sqs_keys")
    assert restored.snapshot() == sm.snapshot()
    older = cbor2.loads(sm.snapshot())
    older["version"] = 14
    del older["credentials"]
    restored.restore(cbor2.dumps(older))
    assert restored.read("sqs_keys") == {"keys": []}


ACCESS_KEYS = [f"AKIAMODEL{n:011d}" for n in range(4)]


class CredentialsComparison(RuleBasedStateMachine):
    """The machine against a dict, through snapshots: what it keeps is what was added and not removed."""

    def __init__(self):
        super().__init__()
        self.sm = StateMachine()
        self.model: dict[str, tuple[str, bytes]] = {}

    @rule(access_key=st.sampled_from(ACCESS_KEYS), role=st.sampled_from(["admin", "data"]),
          sealed=st.sampled_from([b"a", b"b"]))
    def add(self, access_key, role, sealed):
        got = run(self.sm, "sqs_key_add", access_key=access_key, role=role, sealed=sealed)
        if access_key not in self.model:
            self.model[access_key] = (role, sealed)
            assert got == {"added": True}
        elif self.model[access_key] == (role, sealed):
            assert got == {"added": False}
        else:
            assert got["error"] == "conflict"

    @rule(access_key=st.sampled_from(ACCESS_KEYS))
    def remove(self, access_key):
        got = run(self.sm, "sqs_key_remove", access_key=access_key)
        if self.model.pop(access_key, None) is not None:
            assert got == {"removed": True}
        else:
            assert got["error"] == "not_found"

    @rule()
    def snapshot_and_restore(self):
        restored = StateMachine()
        restored.restore(self.sm.snapshot())
        assert restored.snapshot() == self.sm.snapshot()
        self.sm = restored

    @invariant()
    def keeps_what_was_added(self):
        assert {k["access_key"]: (k["role"], k["sealed"]) for k in self.sm.read("sqs_keys")["keys"]} == self.model


CredentialsComparison.TestCase.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
test_credentials_against_a_model = CredentialsComparison.TestCase

"""The principals group 0 keeps and the quotas every group holds (statemachine/principals.py,
quotas.py): rules, models they are compared with under Hypothesis, and snapshots of this and
the earlier layout."""

import cbor2
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftq.statemachine import StateMachine
from raftq.statemachine.principals import AUDIT_KEPT, MAX_PRINCIPALS, MAX_SQS_KEYS
from raftq.statemachine.queue import message_size
from raftq.statemachine.quotas import share
from raftq.statemachine.rules import ROLE_RULES, normalized

ADMIN_KEY = "AKIAADMINKEY00000001"
DATA_KEY = "AKIADATAKEY000000001"
PUT_ORDERS = [{"actions": ["put"], "queues": ["orders-*"]}]
HASH_A, HASH_B = b"a" * 32, b"b" * 32


def run(sm: StateMachine, op: str, now_ms: int = 1, **fields) -> dict:
    return sm.apply({"op": op, "now_ms": now_ms, **fields})


def listed(sm: StateMachine) -> dict:
    return {p["name"]: p for p in sm.read("list_principals")["principals"]}


# ---- the principals ------------------------------------------------------------------------------

def test_a_principal_is_added_once_changed_and_removed_each_change_kept_as_an_event():
    sm = StateMachine()
    add = {"name": "orders-writer", "token_hash": HASH_A, "rules": PUT_ORDERS, "quotas": {"queues": 3}, "by": "admin"}
    assert run(sm, "principal_add", now_ms=5, **add) == {"added": True}
    assert run(sm, "principal_add", now_ms=6, **add) == {"added": False}          # retried
    assert run(sm, "principal_add", **{**add, "token_hash": HASH_B})["error"] == "conflict"
    kept = listed(sm)["orders-writer"]
    assert kept == {"name": "orders-writer", "token_hash": HASH_A, "role": None,
                    "rules": [{"actions": ["put"], "queues": ["orders-*"]}], "quotas": {"queues": 3},
                    "sqs_keys": {}, "created_ms": 5, "changed_ms": 5}
    assert run(sm, "principal_update", now_ms=7, name="orders-writer", rules=[{"actions": ["browse", "put"],
                                                                          "queues": ["orders-*", "orders-*"]}],
               by="ops") == {"changed": True}
    assert listed(sm)["orders-writer"]["rules"] == [{"actions": ["put", "browse"], "queues": ["orders-*"]}]
    assert run(sm, "principal_update", name="orders-writer", quotas={"queues": 3}) == {"changed": True}
    assert run(sm, "principal_update", name="nobody", quotas={})["error"] == "not_found"
    assert run(sm, "principal_update", now_ms=8, name="orders-writer", token_hash=HASH_B) == {"changed": True}
    assert listed(sm)["orders-writer"]["token_hash"] == HASH_B
    assert run(sm, "principal_remove", now_ms=9, name="orders-writer", by="ops") == {"removed": True}
    assert run(sm, "principal_remove", name="orders-writer")["error"] == "not_found"
    events = sm.read("principal_events", 10)["events"]
    assert [(e["change"], e["by"], e["at_ms"]) for e in events] == [
        ("added", "admin", 5), ("changed", "ops", 7), ("changed", None, 1), ("changed", None, 8), ("removed", "ops", 9)]
    assert events[3]["token"] == "new" and "token_hash" not in str(events)
    assert sm.read("principals_version") == 5


def test_names_and_credentials_are_one_principals_each():
    sm = StateMachine()
    assert run(sm, "principal_add", name="data", token_hash=HASH_A, rules=PUT_ORDERS)["error"] == "conflict"
    assert run(sm, "principal_add", name="one", token_hash=HASH_A, rules=PUT_ORDERS)["added"]
    assert run(sm, "principal_add", name="two", token_hash=HASH_A, rules=PUT_ORDERS)["error"] == "conflict"
    key = {"access_key": ADMIN_KEY, "sealed": b"s"}
    assert run(sm, "principal_add", name="two", token_hash=HASH_B, rules=PUT_ORDERS, sqs_key=key)["added"]
    assert run(sm, "principal_update", name="one", sqs_key=key)["error"] == "conflict"
    assert run(sm, "principal_update", name="one", token_hash=HASH_B)["error"] == "conflict"
    assert run(sm, "sqs_key_add", access_key=ADMIN_KEY, role="admin", sealed=b"s")["error"] == "conflict"
    assert listed(sm)["two"]["sqs_keys"] == {ADMIN_KEY: b"s"}


def test_an_sqs_key_of_a_role_is_a_principal_named_after_it_and_goes_with_it():
    sm = StateMachine()
    assert run(sm, "sqs_key_add", access_key=DATA_KEY, role="data", sealed=b"s1") == {"added": True}
    assert run(sm, "sqs_key_add", access_key=DATA_KEY, role="data", sealed=b"s1") == {"added": False}
    assert run(sm, "sqs_key_add", access_key=DATA_KEY, role="admin", sealed=b"s1")["error"] == "conflict"
    kept = listed(sm)[DATA_KEY]
    assert kept["role"] == "data" and kept["rules"] == normalized(ROLE_RULES["data"]) and kept["token_hash"] is None
    assert run(sm, "principal_update", name=DATA_KEY, rules=PUT_ORDERS)["error"] == "conflict"
    assert run(sm, "sqs_key_remove", access_key=DATA_KEY) == {"removed": True}
    assert listed(sm) == {}
    # a key of a principal of its own leaves the principal when removed
    run(sm, "principal_add", name="svc", token_hash=HASH_A, rules=PUT_ORDERS,
        sqs_key={"access_key": ADMIN_KEY, "sealed": b"s"})
    assert run(sm, "principal_update", name="svc", sqs_key={"access_key": DATA_KEY, "sealed": b"t"})["changed"]
    assert run(sm, "principal_update", name="svc", sqs_key={"access_key": "AKIATHIRD00000000001", "sealed": b"u"}
               )["error"] == "limit_reached"
    assert run(sm, "sqs_key_remove", access_key=ADMIN_KEY) == {"removed": True}
    assert listed(sm)["svc"]["sqs_keys"] == {DATA_KEY: b"t"}
    assert run(sm, "sqs_key_remove", access_key=ADMIN_KEY)["error"] == "not_found"


def test_malformed_principals_are_refused_and_change_nothing():
    sm = StateMachine()
    good = {"name": "svc", "token_hash": HASH_A, "rules": PUT_ORDERS}
    for fields in ({**good, "name": "-svc"}, {**good, "token_hash": b"short"}, {**good, "token_hash": None},
                   {**good, "rules": [{"actions": ["put"]}]}, {**good, "quotas": {"queues": -1}},
                   {**good, "quotas": {"bandwidth": 1}}, {**good, "sqs_key": {"access_key": "x", "sealed": b"s"}},
                   {**good, "by": ""}, {**good, "principal": "not a name"},
                   {**good, "allowed_queues": ["-x"]}, {**good, "quotas": {"queues": True}}):
        assert run(sm, "principal_add", **fields)["error"] == "bad_request", fields
    for fields in ({"name": "svc"}, {"name": "svc", "token_hash": None}, {"name": "svc", "sqs_key": None},
                   {"name": "svc", "rules": "all"}):
        assert run(sm, "principal_update", **fields)["error"] == "bad_request", fields
    assert listed(sm) == {} and sm.read("principals_version") == 0


def test_only_group_0_keeps_principals_and_the_cluster_keeps_a_bounded_number():
    other = StateMachine(1, 4)
    assert run(other, "principal_add", name="svc", token_hash=HASH_A, rules=PUT_ORDERS)["error"] == "wrong_group"
    assert run(other, "sqs_key_add", access_key=ADMIN_KEY, role="admin", sealed=b"s")["error"] == "wrong_group"
    sm = StateMachine(0, 4)
    for n in range(MAX_SQS_KEYS):
        assert run(sm, "sqs_key_add", access_key=f"AKIA{n:016d}", role="data", sealed=b"s")["added"]
    assert run(sm, "sqs_key_add", access_key=DATA_KEY, role="data", sealed=b"s")["error"] == "limit_reached"
    for n in range(MAX_PRINCIPALS - MAX_SQS_KEYS):
        assert run(sm, "principal_add", name=f"p{n}", token_hash=n.to_bytes(32, "big"), rules=PUT_ORDERS)["added"]
    assert run(sm, "principal_add", name="over", token_hash=HASH_A, rules=PUT_ORDERS)["error"] == "limit_reached"
    assert len(sm.read("principal_events", 10_000)["events"]) == AUDIT_KEPT


def test_principals_survive_a_snapshot_and_the_sqs_keys_of_version_17_restore_as_principals():
    sm = StateMachine(0, 4)
    run(sm, "principal_add", name="svc", token_hash=HASH_A, rules=PUT_ORDERS, quotas={"stored_bytes": 10},
        sqs_key={"access_key": ADMIN_KEY, "sealed": b"s"})
    run(sm, "sqs_key_add", access_key=DATA_KEY, role="data", sealed=b"sealed")
    restored = StateMachine()
    restored.restore(sm.snapshot())
    assert restored.snapshot() == sm.snapshot()
    assert restored.read("list_principals") == sm.read("list_principals")
    assert run(restored, "principal_add", name="two", token_hash=HASH_A, rules=PUT_ORDERS)["error"] == "conflict"
    version_17 = cbor2.loads(sm.snapshot())
    version_17["version"] = 17
    del version_17["principals"], version_17["quotas"]
    version_17["credentials"] = {"sqs_keys": [[DATA_KEY, "data", b"sealed"], [ADMIN_KEY, "admin", b"s"]]}
    restored.restore(cbor2.dumps(version_17))
    assert {name: (p["role"], p["sqs_keys"]) for name, p in listed(restored).items()} == {
        DATA_KEY: ("data", {DATA_KEY: b"sealed"}), ADMIN_KEY: ("admin", {ADMIN_KEY: b"s"})}
    assert run(restored, "sqs_key_remove", access_key=ADMIN_KEY) == {"removed": True}
    del version_17["credentials"], version_17["wall_times"]
    version_17["version"] = 14
    restored.restore(cbor2.dumps(version_17))
    assert listed(restored) == {}


# ---- quotas ----------------------------------------------------------------------------------------

def of(principal: str, **quotas) -> dict:
    """What a front adds to a command of `principal`."""
    return {"principal": principal, "quotas": quotas}


def put(sm, queue, *messages, now_ms=1, **acting):
    return run(sm, "put", now_ms=now_ms, queue=queue, messages=[{"body": b} for b in messages] if not
               isinstance(messages[0], dict) else list(messages), **acting)


def test_a_principal_owns_the_queues_its_commands_create_up_to_its_quota_with_one_group():
    sm = StateMachine()
    assert "error" not in put(sm, "a1", "x", **of("a", queues=2))
    assert run(sm, "create_queue", queue="a2", config={}, **of("a", queues=2))["created"]
    refused = put(sm, "a3", "x", **of("a", queues=2))
    assert refused["error"] == "quota_exceeded" and refused["quota"] == "queues" and refused["principal"] == "a"
    assert "a3" not in sm.queues
    assert "error" not in put(sm, "a1", "more", **of("a", queues=2))      # into its own: no new queue
    tx = run(sm, "tx", put=[{"queue": "a1", "messages": [{"body": 1}]}, {"queue": "a4", "messages": [{"body": 1}]}],
             **of("a", queues=2))
    assert tx["error"] == "quota_exceeded" and sm.queues["a1"].rows.count == 2
    assert "error" not in put(sm, "b1", "x", **of("b", queues=1))         # another principal's count
    assert "error" not in put(sm, "c1", "x")                                # no principal: no quota
    assert run(sm, "delete_queue", queue="a2")["deleted"]
    assert "error" not in put(sm, "a3", "x", **of("a", queues=2))
    assert sm.quotas.queues.owners == {"a1": "a", "b1": "b", "a3": "a"}


def test_with_several_groups_the_catalog_counts_the_names_a_principal_placed():
    catalog = StateMachine(0, 2)
    assert catalog.apply({"op": "assign", "now_ms": 1, "queues": ["a1", "a2"], **of("a", queues=3)})["groups"]
    assert catalog.apply({"op": "assign", "now_ms": 1, "queues": ["a1", "a3"], **of("a", queues=3)})["groups"]
    refused = catalog.apply({"op": "assign", "now_ms": 1, "queues": ["a4"], **of("a", queues=3)})
    assert refused["error"] == "quota_exceeded" and "a4" not in catalog.catalog.assigned
    # a name the catalog lets go counts no longer
    group = catalog.catalog.assigned["a2"]
    catalog.apply({"op": "release_names", "now_ms": 1, "group": group, "names": ["a2"]})
    assert catalog.apply({"op": "assign", "now_ms": 1, "queues": ["a4"], **of("a", queues=3)})["groups"]
    # a group's own machine does not count them again
    other = StateMachine(1, 2)
    for n in range(5):
        assert "error" not in put(other, f"a{n}", "x", raft_group=1, **of("a", queues=3))


def test_a_dead_letter_queue_a_move_creates_is_its_sources_owners():
    sm = StateMachine()
    run(sm, "create_queue", queue="jobs", config={"max_deliveries": 1, "dead_letter": "jobs-dlq", "lease_ms": 10},
        **of("a", queues=1))
    put(sm, "jobs", "x", **of("a", queues=1))
    run(sm, "receive", queue="jobs", group="default", max=1, now_ms=2)
    run(sm, "tick", now_ms=100)
    assert sm.queues["jobs-dlq"].rows.count == 1 and sm.quotas.queues.owners["jobs-dlq"] == "a"


def test_the_bytes_a_principals_queues_store_are_held_to_its_quota():
    sm = StateMachine()
    size = message_size({"body": "x" * 100, "id": "m0"})
    limit = of("a", stored_bytes=3 * size)
    for n in range(3):
        assert "error" not in put(sm, "a1", {"body": "x" * 100, "id": f"m{n}"}, **limit)
    assert "error" not in put(sm, "a1", {"body": "x" * 100, "id": "m2"}, **limit)      # a retry adds nothing
    refused = put(sm, "a2", "x" * 100, **limit)
    assert refused["error"] == "quota_exceeded" and refused["quota"] == "stored_bytes" and "a2" not in sm.queues
    # another principal's put into a's queue is held to a's quota; into its own, to its own
    assert put(sm, "a1", "x" * 100, **of("b", stored_bytes=10 ** 6))["error"] == "quota_exceeded"
    assert "error" not in put(sm, "b1", "x" * 100, **of("b", stored_bytes=10 ** 6))
    # what consumers take is room again
    leased = run(sm, "receive", queue="a1", group="default", max=1)
    run(sm, "ack", queue="a1", receipts=[leased["messages"][0]["receipt"]])
    assert "error" not in put(sm, "a1", "x" * 100, **limit)
    # a quota the principal no longer has holds no longer
    assert "error" not in put(sm, "a1", "x" * 100, **of("a"))
    assert "error" not in put(sm, "a1", "x" * 100, **of("b"))


def test_each_group_holds_its_share_of_a_stored_bytes_quota():
    assert [share(10, 4, g) for g in range(4)] == [3, 3, 2, 2] and sum(share(7, 3, g) for g in range(3)) == 7
    size = message_size({"body": "y"})
    for group, fits in ((0, 3), (1, 2)):
        sm = StateMachine(group, 2)
        for n in range(fits):
            assert "error" not in put(sm, "q", "y", raft_group=group, **of("a", stored_bytes=5 * size))
        assert put(sm, "q", "y", raft_group=group, **of("a", stored_bytes=5 * size))["error"] == "quota_exceeded"


def test_a_redrive_moves_only_the_dead_letters_of_the_sources_it_may_redrive_to():
    sm = StateMachine()
    for source in ("orders-eu", "billing"):
        run(sm, "create_queue", queue=source, config={"max_deliveries": 1, "dead_letter": "dlq", "lease_ms": 10})
        put(sm, source, f"from {source}")
        run(sm, "receive", queue=source, group="default", max=1)
    run(sm, "tick", now_ms=100)
    assert sm.queues["dlq"].rows.count == 2
    moved = run(sm, "redrive", queue="dlq", allowed_queues=["orders-*"], now_ms=101)
    assert moved["to"] == {"orders-eu": 1} and sm.queues["dlq"].rows.count == 1
    assert run(sm, "redrive", queue="dlq", now_ms=102)["to"] == {"billing": 1}


def test_a_stage_commit_into_a_queue_the_principal_may_not_put_to_is_refused_whole():
    sm = StateMachine()
    for token, queue in (("t1", "orders-eu"), ("t2", "billing")):
        assert "error" not in run(sm, "stage", producer="p", token=token, chunk=0, queue=queue,
                                  messages=[{"body": token}])
    parts = [{"token": "t1", "chunks": 1}, {"token": "t2", "chunks": 1}]
    refused = run(sm, "stage_commit", producer="p", batch=0, parts=parts, allowed_queues=["orders-*"])
    assert refused["error"] == "forbidden" and refused["queue"] == "billing" and refused["action"] == "put"
    assert "orders-eu" not in sm.queues and sm.staging.committed_batch("p") is None
    assert run(sm, "stage_commit", producer="p", batch=0, parts=parts, allowed_queues=["*"])["committed"]


# ---- models ------------------------------------------------------------------------------------------

NAMES = ["svc", "ops", "sqs"]
KEYS = [f"AKIAMODEL{n:011d}" for n in range(3)]
HASHES = [bytes([n]) * 32 for n in range(3)]


class PrincipalsComparison(RuleBasedStateMachine):
    """The machine against a dict, through snapshots: what it keeps is what was made and changed
    and not removed, each credential one principal's, every change one event."""

    def __init__(self):
        super().__init__()
        self.sm = StateMachine()
        self.model: dict[str, dict] = {}
        self.changes = 0

    def holder_of(self, token_hash=None, access_key=None):
        return next((name for name, p in self.model.items()
                     if (token_hash is not None and p["token_hash"] == token_hash) or access_key in p["keys"]), None)

    @rule(name=st.sampled_from(NAMES), token_hash=st.sampled_from(HASHES),
          quotas=st.sampled_from([{}, {"queues": 1}]))
    def add(self, name, token_hash, quotas):
        got = run(self.sm, "principal_add", name=name, token_hash=token_hash, rules=PUT_ORDERS, quotas=quotas)
        existing = self.model.get(name)
        if existing is not None:
            same = (existing["token_hash"], existing["quotas"], existing["keys"], existing["role"]) == \
                (token_hash, quotas, {}, None)
            assert got == {"added": False} if same else got["error"] == "conflict"
        elif self.holder_of(token_hash=token_hash):
            assert got["error"] == "conflict"
        else:
            assert got == {"added": True}
            self.model[name] = {"token_hash": token_hash, "quotas": quotas, "keys": {}, "role": None}
            self.changes += 1

    @rule(name=st.sampled_from(NAMES + KEYS), quotas=st.sampled_from([{}, {"stored_bytes": 9}]),
          token_hash=st.sampled_from([None, *HASHES]))
    def update(self, name, quotas, token_hash):
        change = {"quotas": quotas, **({"token_hash": token_hash} if token_hash else {})}
        got = run(self.sm, "principal_update", name=name, **change)
        existing = self.model.get(name)
        holder = self.holder_of(token_hash=token_hash)
        if existing is None:
            assert got["error"] == "not_found"
        elif existing["role"] is not None:
            assert got["error"] == "conflict"
        elif holder not in (None, name):
            assert got["error"] == "conflict"
        else:
            assert got == {"changed": True}
            existing["quotas"] = quotas
            existing["token_hash"] = token_hash or existing["token_hash"]
            self.changes += 1

    @rule(name=st.sampled_from(NAMES + KEYS))
    def remove(self, name):
        got = run(self.sm, "principal_remove", name=name)
        if self.model.pop(name, None) is None:
            assert got["error"] == "not_found"
        else:
            assert got == {"removed": True}
            self.changes += 1

    @rule(access_key=st.sampled_from(KEYS), role=st.sampled_from(["admin", "data"]))
    def add_key_of_a_role(self, access_key, role):
        got = run(self.sm, "sqs_key_add", access_key=access_key, role=role, sealed=b"s")
        existing = self.model.get(access_key)
        if existing is not None and existing["role"] == role and existing["keys"] == {access_key: b"s"}:
            assert got == {"added": False}
        elif existing is not None or self.holder_of(access_key=access_key):
            assert got["error"] == "conflict"
        else:
            assert got == {"added": True}
            self.model[access_key] = {"token_hash": None, "quotas": {}, "keys": {access_key: b"s"}, "role": role}
            self.changes += 1

    @rule(name=st.sampled_from(NAMES), access_key=st.sampled_from(KEYS))
    def add_key_to_a_principal(self, name, access_key):
        got = run(self.sm, "principal_update", name=name, sqs_key={"access_key": access_key, "sealed": b"k"})
        existing, holder = self.model.get(name), self.holder_of(access_key=access_key)
        if existing is None:
            assert got["error"] == "not_found"
        elif existing["role"] is None and existing["keys"].get(access_key) == b"k":
            assert got == {"changed": False}
        elif existing["role"] is None and holder is None and len(existing["keys"]) >= 2:
            assert got["error"] == "limit_reached"
        elif existing["role"] is not None or holder is not None:
            assert got["error"] == "conflict" or existing["role"] is not None
        else:
            assert got == {"changed": True}
            existing["keys"][access_key] = b"k"
            self.changes += 1

    @rule(access_key=st.sampled_from(KEYS))
    def remove_key(self, access_key):
        got = run(self.sm, "sqs_key_remove", access_key=access_key)
        holder = self.holder_of(access_key=access_key)
        if holder is None:
            assert got["error"] == "not_found"
            return
        assert got == {"removed": True}
        self.changes += 1
        if self.model[holder]["role"] is not None:
            del self.model[holder]
        else:
            del self.model[holder]["keys"][access_key]

    @rule()
    def snapshot_and_restore(self):
        restored = StateMachine()
        restored.restore(self.sm.snapshot())
        assert restored.snapshot() == self.sm.snapshot()
        self.sm = restored

    @invariant()
    def keeps_what_was_made(self):
        kept = {name: {"token_hash": p["token_hash"], "quotas": p["quotas"], "keys": p["sqs_keys"], "role": p["role"]}
                for name, p in listed(self.sm).items()}
        assert kept == self.model
        assert self.sm.read("principals_version") == self.changes
        assert len(self.sm.read("principal_events", AUDIT_KEPT)["events"]) == min(self.changes, AUDIT_KEPT)


PrincipalsComparison.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_principals_against_a_model = PrincipalsComparison.TestCase

QUEUES = ["q1", "q2", "q3"]
PRINCIPALS = ["a", "b"]
BODY = "z" * 40
SIZE = message_size({"body": BODY})


class QuotasComparison(RuleBasedStateMachine):
    """Puts, creations, acks and deletes of two principals with quotas against a model of who owns
    which queue and what each queue stores: nothing passes a quota, nothing else is refused."""

    def __init__(self):
        super().__init__()
        self.sm = StateMachine()
        self.owner: dict[str, str | None] = {}
        self.stored: dict[str, int] = {}
        self.quotas = {p: {"queues": 2, "stored_bytes": 5 * SIZE} for p in PRINCIPALS}
        self.carried: dict[str, dict] = {}      # each principal's quotas as its last applied put carried them
        self.now = 1

    def step(self) -> int:
        self.now += 1
        return self.now

    def owned_bytes(self, principal) -> int:
        return sum(self.stored[q] for q, owner in self.owner.items() if owner == principal)

    @rule(principal=st.sampled_from(PRINCIPALS + [None]), queue=st.sampled_from(QUEUES), count=st.integers(1, 3))
    def put(self, principal, queue, count):
        acting = of(principal, **self.quotas[principal]) if principal else {}
        got = put(self.sm, queue, *[BODY] * count, now_ms=self.step(), **acting)
        new = queue not in self.owner
        owner = principal if new else self.owner[queue]
        limits = self.quotas[owner] if owner and owner == principal else self.carried.get(owner, {})
        count_after = sum(1 for o in self.owner.values() if o == principal) + 1
        if principal and new and count_after > limits["queues"]:
            assert got["error"] == "quota_exceeded" and got["quota"] == "queues"
        elif owner and self.owned_bytes(owner) + count * SIZE > limits.get("stored_bytes", float("inf")):
            assert got["error"] == "quota_exceeded" and got["quota"] == "stored_bytes"
        else:
            assert "error" not in got, got
            if principal:
                self.carried[principal] = dict(self.quotas[principal])
            self.owner.setdefault(queue, principal)
            self.stored[queue] = self.stored.get(queue, 0) + count * SIZE

    @rule(queue=st.sampled_from(QUEUES))
    def take_one(self, queue):
        leased = run(self.sm, "receive", now_ms=self.step(), queue=queue, group="default", max=1)
        if leased.get("messages"):
            run(self.sm, "ack", now_ms=self.step(), queue=queue, receipts=[leased["messages"][0]["receipt"]])
            self.stored[queue] -= SIZE

    @rule(queue=st.sampled_from(QUEUES))
    def delete(self, queue):
        got = run(self.sm, "delete_queue", now_ms=self.step(), queue=queue)
        assert ("error" in got) == (queue not in self.owner)
        self.owner.pop(queue, None)
        self.stored.pop(queue, None)

    @precondition(lambda self: self.quotas["a"]["stored_bytes"] > SIZE)
    @rule()
    def lower_a_quota(self):
        """An admin lowers it: a's own commands carry it at once, b's puts into a's queues meet it
        once a command of a's applied."""
        self.quotas["a"] = {**self.quotas["a"], "stored_bytes": self.quotas["a"]["stored_bytes"] - SIZE}

    @rule()
    def snapshot_and_restore(self):
        restored = StateMachine()
        restored.restore(self.sm.snapshot())
        assert restored.snapshot() == self.sm.snapshot()
        self.sm = restored

    @invariant()
    def owners_and_bytes_agree(self):
        assert {q: o for q, o in self.owner.items() if o} == self.sm.quotas.queues.owners
        assert {q: self.sm.queues[q].rows.bytes for q in self.sm.queues} == self.stored


QuotasComparison.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_quotas_against_a_model = QuotasComparison.TestCase

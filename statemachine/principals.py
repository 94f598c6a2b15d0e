"""The principals group 0 keeps: who may call the cluster, what each may do and within what quotas.

A principal has a name, rules (rules.py: actions on queue-name patterns), quotas (``QUOTAS``; a
missing one is no limit), and its credentials: a bearer token, kept as a keyed hash that the
front computed (api/principals.py), and SQS access keys, whose secrets SigV4 needs themselves
and are kept sealed by the front (api/sqs/credentials.py). The state machine never sees a
secret: it stays pure, and a copy of the log or of a snapshot holds none.

An SQS key made by ``sqs_key_add`` (``/v1/sqs/keys``, ``raftq sqs key add``: the ops of the
release before principals, whose log entries every release still applies) is a principal named
after its access key, acting as its role (rules.ROLE_RULES); removing the key removes it.

Every change is kept as an event (``audit``: the last AUDIT_KEPT, with the log time and who
made it), and bumps ``version``, which the fronts read every few hundred milliseconds to know
when to read the principals again: a change takes effect on every node within a second.
"""

from __future__ import annotations

from .results import CONFLICT, LIMIT_REACHED, NOT_FOUND, error
from .rules import ROLE_RULES, normalized

MAX_PRINCIPALS = 1000
MAX_SQS_KEYS = 100             # kept keys in all: a front opens each one's seal
MAX_SQS_KEYS_PER_PRINCIPAL = 2  # the one in use and its successor, while clients move to it
AUDIT_KEPT = 500
QUOTAS = ("queues", "stored_bytes", "put_rate", "connections", "long_polls")
# The names the bootstrap tokens of cluster.toml act under: no kept principal may take one.
BOOTSTRAP = ("admin", "data", "metrics")


class Principals:
    def __init__(self):
        # name -> {"token_hash", "role", "rules", "quotas", "sqs_keys": {access key: sealed},
        # "created_ms", "changed_ms"}, in the order made
        self.principals: dict[str, dict] = {}
        self.access_keys: dict[str, str] = {}     # access key -> principal (derived)
        self.token_hashes: dict[bytes, str] = {}  # token hash -> principal (derived)
        self.audit: list[dict] = []
        self.version = 0

    # ---- changes ---------------------------------------------------------------------------
    def add(self, cmd: dict) -> dict:
        name = cmd["name"]
        wanted = {"token_hash": cmd.get("token_hash"), "role": None, "rules": normalized(cmd["rules"]),
                  "quotas": dict(cmd.get("quotas") or {}),
                  "sqs_keys": {cmd["sqs_key"]["access_key"]: cmd["sqs_key"]["sealed"]} if cmd.get("sqs_key") else {}}
        existing = self.principals.get(name)
        if existing is not None:
            if {k: existing[k] for k in wanted} == wanted:
                return {"added": False}       # the same command again: a retried add
            return error(CONFLICT, f"principal {name!r} exists: change it (PATCH) or remove it first")
        if name in BOOTSTRAP:
            return error(CONFLICT, f"{name!r} is the name of cluster.toml's {name} token: choose another")
        problem = self._room(1, len(wanted["sqs_keys"])) or self._fresh(wanted["token_hash"], wanted["sqs_keys"])
        if problem:
            return problem
        self._keep(name, {**wanted, "created_ms": cmd["now_ms"], "changed_ms": cmd["now_ms"]})
        self._record(cmd, "added", name, rules=wanted["rules"], quotas=wanted["quotas"],
                     access_keys=list(wanted["sqs_keys"]))
        return {"added": True}

    def update(self, cmd: dict) -> dict:
        """Rules and quotas replaced as given; a new token (its hash); an SQS key added."""
        name = cmd["name"]
        principal = self.principals.get(name)
        if principal is None:
            return error(NOT_FOUND, f"principal {name!r} does not exist")
        if principal["role"] is not None and ("rules" in cmd or "quotas" in cmd):
            return error(CONFLICT, f"principal {name!r} is an SQS key of role {principal['role']}: its rules are "
                                   "the role's (make a principal with an SQS key for rules of your own)")
        key = cmd.get("sqs_key")
        if key is not None:
            if key["access_key"] in principal["sqs_keys"] and principal["sqs_keys"][key["access_key"]] == key["sealed"]:
                key = None                       # the same key again: a retried change
        token_hash = cmd.get("token_hash")
        problem = (self._room(0, 1 if key else 0)
                   or self._fresh(token_hash if token_hash != principal["token_hash"] else None,
                                  {key["access_key"]: key["sealed"]} if key else {}))
        if problem:
            return problem
        # after _fresh: a key that is another's is a conflict whatever this principal holds
        if key and len(principal["sqs_keys"]) >= MAX_SQS_KEYS_PER_PRINCIPAL:
            return error(LIMIT_REACHED, f"principal {name!r} holds {MAX_SQS_KEYS_PER_PRINCIPAL} SQS keys: "
                                        "remove one first")
        changed = {}
        if "rules" in cmd:
            changed["rules"] = normalized(cmd["rules"])
        if "quotas" in cmd:
            changed["quotas"] = dict(cmd["quotas"])
        if token_hash is not None and token_hash != principal["token_hash"]:
            self.token_hashes.pop(principal["token_hash"], None)
            changed["token_hash"] = token_hash
        if key:
            changed["sqs_keys"] = {**principal["sqs_keys"], key["access_key"]: key["sealed"]}
        if not changed:
            return {"changed": False}
        self._keep(name, {**principal, **changed, "changed_ms": cmd["now_ms"]})
        self._record(cmd, "changed", name, **{k: v for k, v in changed.items() if k in ("rules", "quotas")},
                     **({"token": "new"} if "token_hash" in changed else {}),
                     **({"access_keys": [key["access_key"]]} if key else {}))
        return {"changed": True}

    def remove(self, cmd: dict) -> dict:
        name = cmd["name"]
        principal = self.principals.pop(name, None)
        if principal is None:
            return error(NOT_FOUND, f"principal {name!r} does not exist")
        self._forget(principal)
        self._record(cmd, "removed", name)
        return {"removed": True}

    def add_sqs_key(self, cmd: dict) -> dict:
        """An SQS key of a role (the release before principals' op): a principal named after it."""
        access_key, role, sealed = cmd["access_key"], cmd["role"], cmd["sealed"]
        existing = self.principals.get(access_key)
        if existing is not None or access_key in self.access_keys:
            if existing is not None and existing["role"] == role and existing["sqs_keys"] == {access_key: sealed}:
                return {"added": False}
            return error(CONFLICT, f"SQS access key {access_key} exists with another secret or role")
        problem = self._room(1, 1)
        if problem:
            return problem
        self._keep(access_key, {"token_hash": None, "role": role, "rules": normalized(ROLE_RULES[role]),
                                "quotas": {}, "sqs_keys": {access_key: sealed}, "created_ms": cmd["now_ms"],
                                "changed_ms": cmd["now_ms"]})
        self._record(cmd, "added", access_key, role=role, access_keys=[access_key])
        return {"added": True}

    def remove_sqs_key(self, cmd: dict) -> dict:
        """The key, from whichever principal holds it; a principal that was that key goes with it."""
        access_key = cmd["access_key"]
        name = self.access_keys.get(access_key)
        if name is None:
            return error(NOT_FOUND, f"SQS access key {access_key} is not one of the cluster's")
        principal = self.principals[name]
        if principal["role"] is not None:
            del self.principals[name]
            self._forget(principal)
            self._record(cmd, "removed", name, access_keys=[access_key])
        else:
            keys = {k: v for k, v in principal["sqs_keys"].items() if k != access_key}
            del self.access_keys[access_key]
            self.principals[name] = {**principal, "sqs_keys": keys, "changed_ms": cmd["now_ms"]}
            self._record(cmd, "changed", name, access_keys_removed=[access_key])
        return {"removed": True}

    def _room(self, principals: int, keys: int) -> dict | None:
        if len(self.principals) + principals > MAX_PRINCIPALS:
            return error(LIMIT_REACHED, f"the cluster keeps at most {MAX_PRINCIPALS} principals: remove one first")
        if len(self.access_keys) + keys > MAX_SQS_KEYS:
            return error(LIMIT_REACHED, f"the cluster keeps at most {MAX_SQS_KEYS} SQS keys: remove one first")
        return None

    def _fresh(self, token_hash: bytes | None, keys: dict) -> dict | None:
        """A conflict when a credential is another principal's already."""
        if token_hash is not None and token_hash in self.token_hashes:
            return error(CONFLICT, "that token is another principal's")
        taken = [key for key in keys if key in self.access_keys]
        if taken:
            return error(CONFLICT, f"SQS access key {taken[0]} is another principal's")
        return None

    def _keep(self, name: str, principal: dict) -> None:
        self.principals[name] = principal
        if principal["token_hash"] is not None:
            self.token_hashes[principal["token_hash"]] = name
        for access_key in principal["sqs_keys"]:
            self.access_keys[access_key] = name

    def _forget(self, principal: dict) -> None:
        self.token_hashes.pop(principal["token_hash"], None)
        for access_key in principal["sqs_keys"]:
            self.access_keys.pop(access_key, None)

    def _record(self, cmd: dict, change: str, name: str, **details) -> None:
        self.version += 1
        self.audit.append({"at_ms": cmd["now_ms"], "change": change, "principal": name, "by": cmd.get("by"),
                           **details})
        del self.audit[:-AUDIT_KEPT]

    # ---- reads -----------------------------------------------------------------------------
    def listing(self) -> dict:
        """Every principal as kept (hashes and seals included: the fronts' read), and the version."""
        return {"version": self.version,
                "principals": [{"name": name, **principal} for name, principal in self.principals.items()]}

    def events(self, limit: int) -> dict:
        return {"version": self.version, "events": self.audit[-limit:] if limit else []}

    def quotas_of(self, name: str) -> dict | None:
        principal = self.principals.get(name)
        return None if principal is None else principal["quotas"]

    # ---- snapshots ---------------------------------------------------------------------------
    def to_state(self) -> dict:
        return {"version": self.version, "audit": self.audit,
                "principals": [[name, p["token_hash"], p["role"], p["rules"], p["quotas"],
                                [[k, sealed] for k, sealed in p["sqs_keys"].items()], p["created_ms"], p["changed_ms"]]
                               for name, p in self.principals.items()]}

    @classmethod
    def from_state(cls, state: dict | None, credentials: dict | None = None) -> "Principals":
        """From a snapshot's state; one of versions 15 to 17 has `credentials` instead (its SQS keys of a
        role), each restored as the principal ``sqs_key_add`` makes of it now."""
        kept = cls()
        if state is not None:
            kept.version, kept.audit = state["version"], list(state["audit"])
            for name, token_hash, role, rules, quotas, keys, created_ms, changed_ms in state["principals"]:
                kept._keep(name, {"token_hash": token_hash, "role": role, "rules": rules, "quotas": quotas,
                                  "sqs_keys": dict(keys), "created_ms": created_ms, "changed_ms": changed_ms})
        for access_key, role, sealed in (credentials or {}).get("sqs_keys", []):
            kept._keep(access_key, {"token_hash": None, "role": role, "rules": normalized(ROLE_RULES[role]),
                                    "quotas": {}, "sqs_keys": {access_key: sealed}, "created_ms": 0, "changed_ms": 0})
        return kept

"""The credentials the cluster keeps in group 0's log: the SQS API's access keys.

A key is an access key id, the raftq role it acts as (admin or data) and its secret, which
SigV4 needs itself (a signature is an HMAC under a key derived from the secret), sealed by
the front that added it (api/sqs/credentials.py: AES-GCM under a key derived from the cluster
secret). The state machine keeps the sealed bytes as they came and never sees a secret: it
stays pure, and a copy of the log or a snapshot holds no usable secret. Every node's front
reads the keys from its replica of group 0, so a key added or removed takes effect on every
node without a restart.

An access key id names one secret for good: adding it again with the same role and seal is
done (a retried add), with others a conflict; removing one that is not there is not_found.
"""

from __future__ import annotations

from .results import CONFLICT, LIMIT_REACHED, NOT_FOUND, error

# Keys a cluster keeps: each is read by every front at every change
MAX_SQS_KEYS = 100


class Credentials:
    def __init__(self):
        self.sqs_keys: dict[str, dict] = {}    # access key -> {"role", "sealed"}, in the order added

    def add_sqs_key(self, access_key: str, role: str, sealed: bytes) -> dict:
        existing = self.sqs_keys.get(access_key)
        if existing is not None:
            if existing == {"role": role, "sealed": sealed}:
                return {"added": False}
            return error(CONFLICT, f"SQS access key {access_key} exists with another secret or role")
        if len(self.sqs_keys) >= MAX_SQS_KEYS:
            return error(LIMIT_REACHED, f"the cluster keeps at most {MAX_SQS_KEYS} SQS keys: remove one first")
        self.sqs_keys[access_key] = {"role": role, "sealed": sealed}
        return {"added": True}

    def remove_sqs_key(self, access_key: str) -> dict:
        if self.sqs_keys.pop(access_key, None) is None:
            return error(NOT_FOUND, f"SQS access key {access_key} is not one of the cluster's")
        return {"removed": True}

    def list_sqs_keys(self) -> dict:
        return {"keys": [{"access_key": access_key, **key} for access_key, key in self.sqs_keys.items()]}

    def to_state(self) -> dict:
        return {"sqs_keys": [[access_key, key["role"], key["sealed"]] for access_key, key in self.sqs_keys.items()]}

    @classmethod
    def from_state(cls, state: dict | None) -> "Credentials":
        credentials = cls()
        for access_key, role, sealed in (state or {}).get("sqs_keys", []):
            credentials.sqs_keys[access_key] = {"role": role, "sealed": sealed}
        return credentials

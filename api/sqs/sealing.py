"""An SQS key's secret, sealed for group 0's log and opened by each front that takes it.

SigV4 needs the secret itself, so the cluster keeps it sealed (AES-256-GCM under
``ClusterKeys.sqs_secrets``, derived from the cluster secret, with the access key id and role as
associated data): the log, the snapshots and their backups hold none in the clear. A node makes
a new key's id and secret (of AWS's shape: ``AKIA`` and 16 base-32 characters; 40 base-64
characters), answers them once to the admin who asked, and logs neither.
"""

from __future__ import annotations

import os
import secrets

from aiohttp import web
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from raftq.engine.config import SqsKey

from ..keys import SETTINGS

NONCE_BYTES = 12
ACCESS_KEY_PREFIX = "AKIA"
BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
SECRET_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def new_key(role: str | None) -> SqsKey:
    access_key = ACCESS_KEY_PREFIX + "".join(secrets.choice(BASE32) for _ in range(16))
    return SqsKey(access_key, "".join(secrets.choice(SECRET_ALPHABET) for _ in range(40)), role)


def _associated(access_key: str, role: str | None) -> bytes:
    # a principal's own key (no role) is bound to its id alone
    return f"raftq sqs key\n{access_key}\n{role}".encode() if role else f"raftq sqs key\n{access_key}".encode()


def seal(app: web.Application, key: SqsKey) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    aead = AESGCM(app[SETTINGS].keys.sqs_secrets)
    return nonce + aead.encrypt(nonce, key.secret_key.encode(), _associated(key.access_key, key.role))


def unseal(app: web.Application, access_key: str, role: str | None, sealed: bytes) -> SqsKey | None:
    """The key, or None when its seal does not open with this cluster's secret."""
    aead = AESGCM(app[SETTINGS].keys.sqs_secrets)
    try:
        secret = aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], _associated(access_key, role))
    except (InvalidTag, ValueError):
        return None
    return SqsKey(access_key, secret.decode(), role)

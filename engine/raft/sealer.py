"""Authenticated encryption of Raft traffic between nodes, with AES-256-GCM.

pysyncobj encrypts each node-to-node message with Fernet when the cluster
has a secret. Fernet is sound but slow for this job: AES-CBC, a separate
HMAC, base64 (a third more bytes) and a cipher object built per message,
about 46 microseconds per message and side for a 1 KiB append, and a lone
write needs four messages. ``Sealer`` has the three methods pysyncobj calls
on its encryptor (``encrypt_at_time``, ``extract_timestamp``, ``decrypt``)
and uses the one-shot AEAD of the ``cryptography`` package instead.

Keys and nonces
---------------
The cluster secret is stretched once per process with PBKDF2-HMAC-SHA256
(as pysyncobj does). Each process then derives its own sending key with
HKDF from the stretched secret and a fresh random 16-byte salt, and numbers
its messages with a 96-bit counter used as the GCM nonce: a key is never
used twice with the same nonce, without relying on random nonces not
colliding. The salt travels in every token so a receiver derives (and
caches) the sender's key.

A token is ``version(1) | salt(16) | timestamp(8) | nonce(12) | ciphertext+tag``;
the 37-byte header is authenticated as associated data. pysyncobj reads the
timestamp before decrypting, to refuse a connection's timestamps going
backwards; a forged timestamp fails the tag check right after and the
connection is dropped, as with Fernet. Replays across connections are
refused by pysyncobj's per-connection random key inside the payload.

Every node of a cluster must use the same scheme: a raftq node does not
understand a Fernet token, nor the reverse.
"""

from __future__ import annotations

import itertools
import os
import struct

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

VERSION = b"\x01"
HEADER = struct.Struct(">c16sQ12s")          # version, salt, timestamp, nonce
STRETCH_SALT = b"raftq raft traffic v1"
STRETCH_ITERATIONS = 200_000
MAX_SENDER_KEYS = 64                          # senders' keys kept (one per peer process)


class Sealer:
    def __init__(self, secret: str | bytes):
        if isinstance(secret, str):
            secret = secret.encode()
        self._stretched = PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=STRETCH_SALT,
                                     iterations=STRETCH_ITERATIONS).derive(secret)
        self._salt = os.urandom(16)
        self._aead = self._key_for(self._salt)
        self._counter = itertools.count()
        self._senders: dict[bytes, AESGCM] = {self._salt: self._aead}

    def _key_for(self, salt: bytes) -> AESGCM:
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=b"raftq sender key").derive(self._stretched)
        return AESGCM(key)

    def encrypt_at_time(self, data: bytes, timestamp: int) -> bytes:
        nonce = next(self._counter).to_bytes(12, "big")
        header = HEADER.pack(VERSION, self._salt, timestamp, nonce)
        return header + self._aead.encrypt(nonce, data, header)

    def extract_timestamp(self, token: bytes) -> int:
        return self._header(token)[2]

    def decrypt(self, token: bytes) -> bytes:
        _, salt, _, nonce = self._header(token)
        aead = self._senders.get(salt)
        if aead is None:
            if len(self._senders) >= MAX_SENDER_KEYS:
                self._senders = {self._salt: self._aead}
            aead = self._senders[salt] = self._key_for(salt)
        # raises cryptography.exceptions.InvalidTag on any tampering
        return aead.decrypt(nonce, token[HEADER.size:], token[:HEADER.size])

    @staticmethod
    def _header(token: bytes) -> tuple:
        if len(token) < HEADER.size + 16 or token[:1] != VERSION:
            raise ValueError("not a raftq-sealed message")
        return HEADER.unpack_from(token)

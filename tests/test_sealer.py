"""engine.raft.sealer: AES-GCM sealing of node-to-node Raft messages."""

import pytest
from cryptography.exceptions import InvalidTag

from raftq.engine.raft.sealer import HEADER, Sealer


@pytest.fixture(scope="module")
def pair():
    # two processes of one cluster: same secret, each its own sending key
    return Sealer("cluster-secret"), Sealer("cluster-secret")


def test_a_peer_with_the_same_secret_opens_what_was_sealed(pair):
    sender, receiver = pair
    token = sender.encrypt_at_time(b"append_entries payload", 1234)
    assert b"append_entries" not in token
    assert receiver.extract_timestamp(token) == 1234
    assert receiver.decrypt(token) == b"append_entries payload"
    assert sender.decrypt(token) == b"append_entries payload"


def test_every_message_gets_a_fresh_nonce(pair):
    sender, _ = pair
    nonces = {HEADER.unpack_from(sender.encrypt_at_time(b"same", 1))[3] for _ in range(1000)}
    assert len(nonces) == 1000
    assert Sealer("cluster-secret")._salt != sender._salt   # and each process its own key


@pytest.mark.parametrize("where", [0, 5, 20, HEADER.size - 1, HEADER.size, -1])
def test_any_changed_byte_is_refused(pair, where):
    sender, receiver = pair
    token = bytearray(sender.encrypt_at_time(b"commit index 42", 7))
    token[where] ^= 0x01
    with pytest.raises((InvalidTag, ValueError)):
        receiver.decrypt(bytes(token))


def test_a_forged_timestamp_fails_the_tag(pair):
    sender, receiver = pair
    token = bytearray(sender.encrypt_at_time(b"x", 7))
    token[17:25] = (2 ** 40).to_bytes(8, "big")
    assert receiver.extract_timestamp(bytes(token)) == 2 ** 40   # read before decrypting, as pysyncobj does
    with pytest.raises(InvalidTag):
        receiver.decrypt(bytes(token))


def test_another_secret_cannot_open_it(pair):
    sender, _ = pair
    with pytest.raises(InvalidTag):
        Sealer("another-secret").decrypt(sender.encrypt_at_time(b"x", 1))


@pytest.mark.parametrize("token", [b"", b"\x01short", b"\x00" + b"\x00" * 80])
def test_garbage_is_refused_before_any_crypto(pair, token):
    with pytest.raises(ValueError):
        pair[1].decrypt(token)

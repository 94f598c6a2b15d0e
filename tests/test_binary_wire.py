"""The binary wire of appends and their answers (engine/raft/binary_wire.py) and the protocol
version that gates it on a connection (engine/raft/wire.py): what is encoded comes back equal,
what is cut or garbled is refused whole, and a peer gets binary frames only once it announced them."""

import pickle
import socket

import pytest
from hypothesis import given, settings, strategies as st
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import CONNECTION_STATE

from raftq.engine.raft import binary_wire
from raftq.engine.raft.sealer import Sealer
from raftq.engine.raft.wire import ANNOUNCE, FRAME, Connection

SECRET = "binary wire test secret"
u64 = st.integers(0, (1 << 64) - 1)
keys = st.one_of(st.none(), st.binary(min_size=32, max_size=32))
sent_at = st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def appends(draw):
    term = draw(u64)
    prev_term = draw(st.integers(0, term))
    prev_idx = draw(st.integers(0, (1 << 64) - 100))
    terms = sorted(draw(st.lists(st.integers(prev_term, term), max_size=6)))
    entries = [(draw(st.binary(max_size=300)), prev_idx + 1 + i, t) for i, t in enumerate(terms)]
    message = {"type": "append_entries", "term": term, "commit_index": draw(u64), "prevLogIdx": prev_idx,
               "prevLogTerm": prev_term, "entries": entries}
    if draw(st.booleans()):
        message["sent_at"] = draw(sent_at)
    if draw(st.booleans()):
        message["quiet_s"] = draw(sent_at)      # a quiet leader's promise (engine.raft.quiet)
    return message


@st.composite
def answers(draw):
    message = {"type": "next_node_idx", "term": draw(u64), "next_node_idx": draw(u64),
               "reset": draw(st.booleans()), "success": draw(st.booleans())}
    if draw(st.booleans()):
        message["sent_at"] = draw(sent_at)
    return message


@settings(max_examples=300)
@given(st.one_of(appends(), answers()), keys)
def test_what_is_encoded_decodes_equal(message, key):
    data = binary_wire.encode(message, key)
    assert data[0] in binary_wire.KINDS and data[:1] != pickle.dumps(message)[:1]
    assert binary_wire.decode(data) == (key, message)


@settings(max_examples=300)
@given(st.one_of(appends(), answers()), keys, st.data())
def test_a_cut_frame_is_refused(message, key, data):
    frame = binary_wire.encode(message, key)
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(ValueError):
        binary_wire.decode(frame[:cut])
    with pytest.raises(ValueError):
        binary_wire.decode(frame + b"\x00")


@settings(max_examples=500)
@given(st.one_of(appends(), answers()), keys, st.data())
def test_garbled_frames_are_refused_or_decode_to_a_consistent_message(message, key, data):
    """A flipped byte either fails the checks or still gives a message whose own encoding it is:
    never an exception other than ValueError, never entries out of order."""
    frame = bytearray(binary_wire.encode(message, key))
    at = data.draw(st.integers(0, len(frame) - 1))
    frame[at] ^= data.draw(st.integers(1, 255))
    try:
        got_key, got = binary_wire.decode(bytes(frame))
    except ValueError:
        return
    assert binary_wire.encode(got, got_key) == bytes(frame)


@given(st.binary(max_size=200))
def test_garbage_is_refused_with_a_value_error(garbage):
    try:
        binary_wire.decode(bytes([binary_wire.APPEND]) + garbage)
    except ValueError:
        pass


def test_entries_out_of_order_or_past_the_append_s_term_are_refused():
    def frame(entries, term=5):
        body = b"".join(binary_wire.ENTRY_HEADER.pack(i, t, len(c)) + c for c, i, t in entries)
        return (binary_wire.PREFIX.pack(binary_wire.APPEND, 0)
                + binary_wire.APPEND_HEADER.pack(0, term, 10, 4, 9, 0.0, len(entries), len(body)) + body)

    assert binary_wire.decode(frame([(b"a", 11, 4), (b"b", 12, 5)]))[1]["entries"] == [(b"a", 11, 4), (b"b", 12, 5)]
    for bad in ([(b"a", 12, 4)], [(b"a", 11, 5), (b"b", 12, 4)], [(b"a", 11, 6)], [(b"a", 11, 3)]):
        with pytest.raises(ValueError):
            binary_wire.decode(frame(bad))


# -- on a connection --------------------------------------------------------------------------

APPEND = {"type": "append_entries", "term": 2, "commit_index": 7, "prevLogIdx": 7, "prevLogTerm": 2,
          "entries": [(b"\x00command", 8, 2)], "sent_at": 12.5}
ANSWER = {"type": "next_node_idx", "term": 2, "next_node_idx": 9, "reset": False, "success": True}


def send_append(conn) -> None:
    """APPEND, sent as a leader sends it: from its fields."""
    conn.send_append(2, 7, 2, 7, [(b"\x00command", 8, 2)], 12.5)


class Pair:
    """A raftq Connection on one end of a socket pair, a test on the other speaking its frames."""

    def __init__(self, secret=SECRET):
        self.poller = createPoller("auto")
        self.ours, self.theirs = socket.socketpair()
        self.ours.setblocking(False)
        self.conn = Connection(poller=self.poller, socket=self.ours)
        self.sealer = Sealer(secret) if secret else None
        self.conn.encryptor = Sealer(secret) if secret else None
        self.received = []
        self.conn.setOnMessageReceivedCallback(self.received.append)
        self.stamp = 100

    def send_payload(self, payload: bytes) -> None:
        if self.sealer:
            payload = self.sealer.encrypt_at_time(payload, self.stamp)
        self.theirs.sendall(FRAME.pack(len(payload)) + payload)
        for _ in range(20):
            self.poller.poll(0.01)

    def sent_payloads(self) -> list[bytes]:
        self.theirs.setblocking(False)
        data = b""
        try:
            while True:
                data += self.theirs.recv(1 << 20)
        except BlockingIOError:
            pass
        payloads = []
        while data:
            (n,) = FRAME.unpack_from(data)
            token, data = data[FRAME.size:FRAME.size + n], data[FRAME.size + n:]
            payloads.append(self.sealer.decrypt(token) if self.sealer else token)
        return payloads

    def close(self):
        self.ours.close()
        self.theirs.close()


@pytest.fixture
def pair():
    made = Pair()
    yield made
    made.close()


def test_an_append_and_an_answer_go_pickled_to_a_peer_that_did_not_announce_the_binary_wire(pair):
    send_append(pair.conn)
    pair.conn.send_answer(2, 9, True, False, None)
    assert [pickle.loads(p) for p in pair.sent_payloads()] == [APPEND, ANSWER]
    assert pair.conn.appends_sent == {"binary": 0, "pickled": 1}


def test_an_answer_goes_binary_to_a_peer_that_announced_the_wire(pair):
    pair.send_payload(pickle.dumps({"type": ANNOUNCE, "versions": [1, 2]}))
    pair.conn.send_answer(2, 9, True, False, 3.25)
    assert [binary_wire.decode(p) for p in pair.sent_payloads()] == [(None, {**ANSWER, "sent_at": 3.25})]


def test_a_snapshot_s_chunk_goes_pickled_to_a_peer_that_announced_the_binary_wire(pair):
    pair.send_payload(pickle.dumps({"type": ANNOUNCE, "versions": [1, 2]}))
    chunk = {"type": "append_entries", "term": 2, "commit_index": 7, "serialized": (b"a chunk", 0, False),
             "sent_at": 12.5}
    pair.conn.send(dict(chunk))
    assert [pickle.loads(p) for p in pair.sent_payloads()] == [chunk]
    assert pair.conn.appends_sent == {"binary": 0, "pickled": 1}


def test_an_append_goes_binary_once_the_peer_announced_it_and_pickled_again_after_a_reconnect(pair):
    pair.send_payload(pickle.dumps({"type": ANNOUNCE, "versions": [1, 2]}))
    assert pair.received == [] and pair.conn.peer_binary       # the announcement is not handed on
    send_append(pair.conn)
    (payload,) = pair.sent_payloads()
    assert binary_wire.decode(payload) == (None, APPEND)
    assert pair.conn.appends_sent == {"binary": 1, "pickled": 0}
    pair.conn.disconnect()
    assert not pair.conn.peer_binary


def test_an_announcement_without_the_binary_wire_keeps_appends_pickled(pair):
    pair.send_payload(pickle.dumps({"type": ANNOUNCE, "versions": [1]}))
    send_append(pair.conn)
    assert pickle.loads(pair.sent_payloads()[0])["type"] == "append_entries"


def test_an_announcement_names_the_quiet_wire_apart_from_the_binary_one(pair):
    pair.send_payload(pickle.dumps({"type": ANNOUNCE, "versions": [1, 2]}))
    assert pair.conn.peer_binary and not pair.conn.peer_quiet
    pair.send_payload(pickle.dumps({"type": ANNOUNCE, "versions": [1, 2, 3]}))
    assert pair.conn.peer_binary and pair.conn.peer_quiet
    pair.conn.disconnect()
    assert not pair.conn.peer_quiet


def test_binary_frames_are_taken_from_a_peer_that_announced_them(pair):
    pair.send_payload(pickle.dumps({"type": ANNOUNCE, "versions": [1, 2]}))
    pair.send_payload(binary_wire.encode(APPEND, None))
    assert pair.received == [APPEND] and pair.conn.state != CONNECTION_STATE.DISCONNECTED


def test_a_binary_frame_the_peer_did_not_announce_closes_the_connection(pair):
    pair.send_payload(binary_wire.encode(APPEND, None))
    assert pair.received == [] and pair.conn.state == CONNECTION_STATE.DISCONNECTED


@pytest.mark.parametrize("payload", [
    binary_wire.encode(APPEND, None)[:-1],                     # cut
    binary_wire.encode(APPEND, None) + b"\x00",                # trailing bytes
    binary_wire.encode(APPEND, b"k" * 32),                     # a key this connection did not send
    bytes([binary_wire.ANSWER]) + b"\x00" * 5,                 # garbage
])
def test_a_malformed_binary_frame_closes_the_connection_and_hands_on_nothing(pair, payload):
    pair.send_payload(pickle.dumps({"type": ANNOUNCE, "versions": [1, 2]}))
    pair.send_payload(payload)
    assert pair.received == [] and pair.conn.state == CONNECTION_STATE.DISCONNECTED


def test_a_binary_frame_carries_the_connection_s_random_key():
    pair = Pair()
    try:
        pair.conn.recvRandKey, pair.conn.sendRandKey = b"r" * 32, b"s" * 32
        pair.send_payload(pickle.dumps((b"r" * 32, {"type": ANNOUNCE, "versions": [1, 2]})))
        pair.send_payload(binary_wire.encode(APPEND, b"r" * 32))
        assert pair.received == [APPEND]
        send_append(pair.conn)
        assert binary_wire.decode(pair.sent_payloads()[0]) == (b"s" * 32, APPEND)
    finally:
        pair.close()

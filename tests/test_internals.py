"""pysyncobj's private state is named in engine/raft/internals.py and nowhere else, and every
name there is one pysyncobj 0.3.17 has: a hook whose private method pysyncobj no longer
defines, or renamed, would never be called, and nothing else would say so."""

import inspect
import re
from pathlib import Path

import pysyncobj.monotonic
import pysyncobj.serializer
import pysyncobj.syncobj
import pysyncobj.tcp_connection
import pysyncobj.tcp_server
import pysyncobj.transport
import pytest
from pysyncobj.node import Node, TCPNode

from raftq.engine.raft import internals
from raftq.engine.raft.node import AddressNode

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_ROOMS = ("api", "engine", "raftq", "statemachine", "wire_format")
MANGLED = re.compile(r"\b_[A-Z][A-Za-z]*__[A-Za-z]\w*")
INTERNALS = ROOT / "engine" / "raft" / "internals.py"

PYSYNCOBJ_CLASSES = {
    "SyncObj": pysyncobj.syncobj.SyncObj,
    "TcpConnection": pysyncobj.tcp_connection.TcpConnection,
    "TcpServer": pysyncobj.tcp_server.TcpServer,
    "Serializer": pysyncobj.serializer.Serializer,
}


def test_no_module_but_internals_names_a_private_attribute():
    found = []
    for room in PACKAGE_ROOMS:
        for path in sorted((ROOT / room).rglob("*.py")):
            if path == INTERNALS:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if MANGLED.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "name-mangled pysyncobj names outside engine/raft/internals.py:\n" + "\n".join(found)


def _private_state() -> list[tuple[str, str]]:
    """(pysyncobj class, attribute) of every property engine/raft/internals.py defines."""
    names = []
    for holder in (internals.SyncObjInternals, internals.ConnectionInternals, internals.ServerInternals,
                   internals.SerializerInternals):
        owner = next(base.__name__ for base in holder.__mro__[1:] if base.__name__ in PYSYNCOBJ_CLASSES)
        for value in vars(holder).values():
            if isinstance(value, property):
                mangled = value.fget.__reduce__()[1][0]    # operator.attrgetter's one name
                assert mangled.startswith(f"_{owner}__")
                names.append((owner, mangled.removeprefix(f"_{owner}__")))
    return names


@pytest.mark.parametrize("owner,name", _private_state(), ids=lambda value: value)
def test_each_private_attribute_is_one_pysyncobj_sets(owner, name):
    source = inspect.getsource(PYSYNCOBJ_CLASSES[owner])
    assert re.search(rf"self\.__{name}\s*(\[[^\]]*\])?\s*=[^=]", source), f"pysyncobj's {owner} sets no __{name}"


def _hooks() -> list[tuple[str, str]]:
    hooks = []
    for holder in (internals.SyncObjInternals, internals.ConnectionInternals, internals.ServerInternals):
        for attr in vars(holder):
            owner, _, name = attr.lstrip("_").partition("__")
            if name and owner in PYSYNCOBJ_CLASSES:
                hooks.append((owner, name))
    return hooks


@pytest.mark.parametrize("owner,name", _hooks(), ids=lambda value: value)
def test_each_hook_replaces_a_method_pysyncobj_defines_and_calls(owner, name):
    source = inspect.getsource(PYSYNCOBJ_CLASSES[owner])
    assert re.search(rf"def __{name}\(", source), f"pysyncobj's {owner} defines no __{name}"
    assert re.search(rf"self\.__{name}\b(?!\s*=)", source.replace(f"def __{name}(", "")), \
        f"pysyncobj's {owner} never calls __{name}"


def test_every_call_names_a_private_method_pysyncobj_defines():
    calls = re.findall(r"self\._(SyncObj|TcpConnection)__(\w+)\(", INTERNALS.read_text())
    assert calls
    for owner, name in calls:
        assert f"def __{name}(" in inspect.getsource(PYSYNCOBJ_CLASSES[owner]), f"{owner}.__{name}"


def test_pysyncobj_reads_its_own_clock_through_raftqs_reader():
    """internals gives pysyncobj's modules back their clock read in C (a global each looks up at
    call time): a module that stopped naming it would keep the slow reader, and one given another
    clock would mix two in one comparison."""
    modules = (pysyncobj.syncobj, pysyncobj.tcp_connection, pysyncobj.transport)
    for module in modules:
        assert re.search(r"\bmonotonicTime\(\)", inspect.getsource(module)), module.__name__
        assert module.monotonicTime is internals.monotonic
    before = pysyncobj.monotonic.monotonic()
    between = internals.monotonic()
    after = pysyncobj.monotonic.monotonic()
    assert before <= between <= after


def test_a_node_hashes_and_compares_as_pysyncobjs_node_of_its_address():
    """pysyncobj builds nodes of its own (an incoming connection's, a membership change's) and
    looks raftq's up among them, and the other way round."""
    mine = AddressNode("127.0.0.1:7001", raftq_id="n1")
    theirs, bare = TCPNode("127.0.0.1:7001"), Node("127.0.0.1:7001")
    other = AddressNode("127.0.0.1:7002", raftq_id="n2")
    for same in (theirs, bare):
        assert mine == same and same == mine and not (mine != same) and not (same != mine)
        assert {same: "found"}[mine] == "found" and {mine: "found"}[same] == "found"
    assert mine != other and other != theirs and {mine, theirs, bare, other} == {mine, other}
    assert (mine.id, mine.address, mine.host, mine.port, mine.raftq_id) == ("127.0.0.1:7001", "127.0.0.1:7001",
                                                                           "127.0.0.1", 7001, "n1")

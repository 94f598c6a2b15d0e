"""The one pysyncobj release raftq's Raft modules are written against.

engine/raft/ reads and replaces pysyncobj's internals line by line: its
private state and hooks by name in engine/raft/internals.py, copied method
bodies in engine/raft/node.py, follower.py and wire.py. A different release
must be re-read before this pin moves. Each of them imports this module
before anything of pysyncobj's, so a mismatch stops the node at import
rather than misbehaving later.
"""

from pysyncobj.version import VERSION

PYSYNCOBJ_PIN = "0.3.17"
if VERSION != PYSYNCOBJ_PIN:
    raise ImportError(f"raftq's engine needs pysyncobj=={PYSYNCOBJ_PIN}, found {VERSION}")

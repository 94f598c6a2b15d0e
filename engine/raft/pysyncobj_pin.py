"""The one pysyncobj release raftq's Raft modules are written against.

engine/raft/wire.py and engine/raft/node.py read and replace pysyncobj
internals line by line (name-mangled ``_SyncObj__*`` attributes, copied
method bodies); a different release must be re-read before this pin moves.
Both import this module before anything of pysyncobj's, so a mismatch stops
the node at import rather than misbehaving later.
"""

from pysyncobj.version import VERSION

PYSYNCOBJ_PIN = "0.3.17"
if VERSION != PYSYNCOBJ_PIN:
    raise ImportError(f"raftq's engine needs pysyncobj=={PYSYNCOBJ_PIN}, found {VERSION}")

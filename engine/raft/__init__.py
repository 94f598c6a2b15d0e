"""Raft: the only code of raftq that touches pysyncobj (docs/pysyncobj.md).

``consensus.Consensus`` is the facade the rest of the engine uses;
``node.RaftNode`` is pysyncobj's SyncObj with raftq's protocol fixes, and the
one owner of pysyncobj's internals (its mixins ``follower`` and ``prevote``
included); ``read_index``, ``wire``, ``sealer`` and ``snapshots`` are what it
is built from, ``pysyncobj_pin`` the release they are written for.
"""

"""Raft: the only code of raftq that reads or replaces pysyncobj's internals
(docs/guarantees.md, "What pysyncobj 0.3.17 lacks"; ``engine.storage.journal`` implements pysyncobj's public journal
interface).

``consensus.Consensus`` is the facade the rest of the engine uses;
``node.RaftNode`` is pysyncobj's SyncObj with raftq's protocol fixes, and the
one owner of pysyncobj's internals (its mixins ``follower`` and ``prevote``
included); ``read_index``, ``wire``, ``sealer`` and ``snapshots`` are what it
is built from, ``pysyncobj_pin`` the release they are written for.
"""

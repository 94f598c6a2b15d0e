"""The engine: one Raft group's consensus, journal, log time and state machine,
and what a node's fronts need to reach it (docs/architecture.md).

A node is one engine process and the front processes it forks. These run in
the engine process: ``node`` (log time, the barrier, writes, reads and the
cluster), ``long_poll``, ``committer`` (group commit), ``raft/`` (consensus;
its snapshot writer is a child process), ``storage.journal`` and
``storage.snapshot_file``, ``link.service`` (what the fronts may call) and
``pauses``. These run in the fronts: ``link.remote`` (the engine as a front
calls it) and ``storage.put_buffer`` (a front's put buffer). Both sides use
``link.frames`` (the link's frames), ``outcome`` (``Committed`` and
``CommitError``, what a command comes back as), ``storage.records`` (the
record files), ``config`` (cluster.toml, which reads no Raft) and
``lifetime`` (children that die with their parent).
"""

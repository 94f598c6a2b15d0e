"""What a node keeps on disk: one checksummed record format (``records``) and
the files written in it: the Raft log (``journal``), the snapshot
(``snapshot_file``) and a front's put buffer (``put_buffer``)."""

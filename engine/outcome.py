"""What a command sent to the engine comes back as: the contract between the
engine and its fronts.

``Committed`` is a command's result and the log index of the entry that
carried it; ``CommitError`` says why there is none, by code (the link carries
the code, and a front maps it to HTTP). Group commit (``engine.committer``),
the node (``engine.node``) and a front's ``engine.link.remote.RemoteNode`` all
answer in these terms.
"""

from typing import NamedTuple

# The code of a command refused because the leader's disk had no room for its entry: it reached
# no log, so it was certainly not applied (HTTP 507; retrying helps only once there is room).
INSUFFICIENT_STORAGE = "insufficient_storage"


class CommitError(Exception):
    """The entry's fate is unknown or it was refused before the log (see code)."""

    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


class Committed(NamedTuple):
    """A command's result, and the log index of the entry that carried it."""
    result: dict
    index: int

"""raftq's queues as a pure, deterministic state machine (no I/O, no clock)."""

from .machine import StateMachine, check_command, decode_entry, encode_entry
from .results import ERROR_CODES, error, is_error

__all__ = ["StateMachine", "encode_entry", "decode_entry", "check_command", "error", "is_error",
           "ERROR_CODES"]

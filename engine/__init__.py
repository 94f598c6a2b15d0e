"""The engine: one Raft group's consensus, journal, log time and state machine.

Everything here runs in a node's engine process (see docs/architecture.md);
the fronts above reach it only through ``engine.face``.
"""

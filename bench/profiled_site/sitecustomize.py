"""Loaded as `sitecustomize` into the nodes `bench.put_calls` starts (this
directory on PYTHONPATH); it changes nothing unless its environment asks.

RAFTQ_PROFILE_DIR: SIGUSR2 starts cProfile in the process that receives it,
timing by the process's CPU clock (a wait in epoll or fdatasync is no
time of its own), and the next SIGUSR2 stops it and writes its statistics to
`<dir>/<process name>.<pid>.prof`. The nodes fork their engines and fronts
from the supervisor, which loaded this module, so each of them answers the
signal; the benchmark signals only those it measures, between two requests.
"""

import os
import signal

_profile = None


def _toggle(signum, frame) -> None:
    import cProfile
    import time

    global _profile
    if _profile is None:
        _profile = cProfile.Profile(time.process_time)
        _profile.enable()
        return
    _profile.disable()
    profile, _profile = _profile, None
    with open(f"/proc/{os.getpid()}/comm") as f:
        name = f.read().strip()
    profile.dump_stats(os.path.join(os.environ["RAFTQ_PROFILE_DIR"], f"{name}.{os.getpid()}.prof"))


if os.environ.get("RAFTQ_PROFILE_DIR"):
    signal.signal(signal.SIGUSR2, _toggle)

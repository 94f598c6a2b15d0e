"""Proofs that need a system tool (or anything else a checkout may lack: a package
index, a revision of the history) say so: outside CI a missing one skips the
proof with what to install (shown by `make test`'s -rs); in CI (CI=true, as
.ci/run sets it) it fails the suite, so a proof never goes missing silently."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def cannot_run(message: str):
    """This proof lacks what it needs (`message` says what and how to get it): skip it, or in CI fail it."""
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def require(found, tool: str, install: str):
    """`found` (a path, usually) or, when it is None, skip/fail saying `install`."""
    if found:
        return found
    cannot_run(f"{tool} is not installed, so this proof cannot run: {install} (.ci/run installs it)")


def require_strace() -> str:
    return require(shutil.which("strace"), "strace", "apt-get install strace")


class SmallFilesystem:
    """A tmpfs of its own at `path` (a node's data directory): a disk that fills up.
    Mounting needs root (or a container allowed to mount); where it is not permitted the
    proof is skipped outside CI and fails in CI, as for a missing tool."""

    def __init__(self, path, mib: int):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.mounted = False
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0700", "tmpfs", str(self.path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            cannot_run(f"cannot mount a small filesystem ({done.stderr.strip()}), so this proof cannot run: run "
                       "the tests as root, or in a container allowed to mount tmpfs")
        self.mounted = True

    def grow(self, mib: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={mib}m", str(self.path)], check=True)

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "--lazy", str(self.path)], check=True)
            self.mounted = False

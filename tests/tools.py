"""Proofs that need a system tool say so: outside CI a missing tool skips the
proof with what to install (shown by `make test`'s -rs); in CI (CI=true, as
.ci/run sets it) it fails the suite, so a proof never goes missing silently."""

import os
import shutil

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(found, tool: str, install: str):
    """`found` (a path, usually) or, when it is None, skip/fail saying `install`."""
    if found:
        return found
    message = f"{tool} is not installed, so this proof cannot run: {install} (.ci/run installs it)"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def require_strace() -> str:
    return require(shutil.which("strace"), "strace", "apt-get install strace")

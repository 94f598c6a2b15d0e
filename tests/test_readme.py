"""Every shell and Python block of README.md, run in order as a newcomer pastes them
(issue 27): in a directory laid out as `make up` leaves it, against a fresh `raftq up`.

Blocks preceded by `<!-- not run: reason -->` are illustrative or too long (a Spark
session, minutes of benchmarks) and are skipped with that reason. The directory has
what the README assumes of a checkout: `.raftq/` made by `raftq up --nodes 3 --demo`
(what `make up` runs) and `.venv/bin/{raftq,python}` running the code under test.
The one liberty taken: the README's ports 8001-8003 become free ports, so that the
test never collides with a cluster someone runs by hand.
"""

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import Lines, consecutive_free_port, stop_everything

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"(?:<!-- not run: (?P<reason>.*?) -->\n)?```(?P<lang>sh|python)\n(?P<code>.*?)```", re.S)
README_PORTS = (8001, 8002, 8003)


def blocks() -> list[dict]:
    return [m.groupdict() for m in BLOCK.finditer(README.read_text())]


def test_every_skipped_block_says_why_and_the_rest_are_many():
    found = blocks()
    assert all(b["reason"] is None or b["reason"].strip() for b in found)
    assert len([b for b in found if b["reason"] is None]) >= 3
    # a fence of another language would escape the run: every code fence is sh or python
    assert len(re.findall(r"^```\w+", README.read_text(), re.M)) == len(found)


def venv_like(workdir: Path) -> None:
    """`.venv/bin/raftq` and `.venv/bin/python` as `make` makes them, for the code under test."""
    bin_dir = workdir / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    # scripts, not symlinks: a symlinked interpreter would not find its own virtualenv
    for name, run in (("python", ""), ("raftq", " -m raftq")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}"{run} "$@"\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_the_readme_runs_as_pasted(tmp_path):
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    venv_like(workdir)
    http_port = consecutive_free_port(3)
    raft_port = consecutive_free_port(3)
    while abs(raft_port - http_port) < 3:
        raft_port = consecutive_free_port(3)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTQ_")}
    repo = str(README.parent)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    up = subprocess.Popen([sys.executable, "-m", "raftq", "up", "--nodes", "3", "--demo",
                           "--http-port", str(http_port), "--raft-port", str(raft_port)],
                          cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
    try:
        Lines(up).wait_for("Ctrl-C stops the cluster")
        for number, block in enumerate(blocks()):
            if block["reason"] is not None:
                continue
            code = block["code"]
            for i, port in enumerate(README_PORTS):
                code = code.replace(str(port), str(http_port + i))
            command = ["bash", "-e", "-o", "pipefail", "-c", code] if block["lang"] == "sh" else \
                [str(workdir / ".venv/bin/python"), "-c", code]
            done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
            shown = (f"README block {number} ({block['lang']}):\n{code}\n"
                     f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
            assert done.returncode == 0, shown
            assert '"error"' not in done.stdout + done.stderr and "Traceback" not in done.stderr, shown
            assert "<Future" not in done.stdout, shown
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                pass
        stop_everything(up, workdir / ".raftq")


def test_the_docs_point_only_inside_the_repository():
    """A newcomer has the repository and nothing beside it: every relative link of the README
    and docs/ resolves to a file of the repository, and no text names a document outside it."""
    root = README.parent
    broken = []
    for page in [README, *sorted((root / "docs").glob("*.md"))]:
        text = page.read_text()
        if "../shared" in text:
            broken.append(f"{page.name}: names ../shared")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.is_relative_to(root) or not path.exists():
                broken.append(f"{page.name}: {target}")
    assert broken == []

"""docs/sqs.md runs as pasted, in order (issue 49: create before use): its shell and Python
blocks, against a fresh `raftq up --sqs` in a directory laid out as `make up` leaves it, with
`raftq`, `python` and `aws` on the PATH as an installed raftq and an AWS CLI put them there.
Blocks preceded by `<!-- not run: reason -->` are skipped with that reason; `java`, `go` and
`toml` blocks are illustrations and are not run."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import Lines, consecutive_free_port, stop_everything

pytestmark = pytest.mark.integration

PAGE = Path(__file__).resolve().parent.parent / "docs" / "sqs.md"
BLOCK = re.compile(r"(?:<!-- not run: (?P<reason>.*?) -->\n)?```(?P<lang>sh|python)\n(?P<code>.*?)```", re.S)


def blocks() -> list[dict]:
    return [m.groupdict() for m in BLOCK.finditer(PAGE.read_text())]


def on_path(workdir: Path) -> str:
    """A bin directory with `raftq` and `python` running the code under test, before the one
    holding the AWS CLI."""
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    for name, run in (("python", ""), ("raftq", " -m raftq")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}"{run} "$@"\n')
        script.chmod(0o700)
    return os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def test_the_sqs_page_runs_as_pasted_in_order(tmp_path):
    assert len([b for b in blocks() if b["reason"] is None]) >= 3
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    http_port = consecutive_free_port(3)
    raft_port = consecutive_free_port(3)
    while abs(raft_port - http_port) < 3:
        raft_port = consecutive_free_port(3)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAFTQ_", "AWS_"))}
    repo = str(PAGE.parent.parent)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PATH"] = on_path(workdir)
    up = subprocess.Popen([sys.executable, "-m", "raftq", "up", "--nodes", "3", "--sqs",
                           "--http-port", str(http_port), "--raft-port", str(raft_port)],
                          cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
    try:
        Lines(up).wait_for("Ctrl-C stops the cluster")
        outputs = []
        for number, block in enumerate(blocks()):
            if block["reason"] is not None:
                continue
            code = block["code"].replace("8001", str(http_port))
            command = ["bash", "-e", "-o", "pipefail", "-c", code] if block["lang"] == "sh" else \
                ["python", "-c", code]
            done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
            shown = (f"docs/sqs.md block {number} ({block['lang']}):\n{code}\n"
                     f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
            assert done.returncode == 0, shown
            assert "Traceback" not in done.stderr and "error" not in done.stderr.lower(), shown
            outputs.append(done.stdout)
        assert any("hello" in out.split() for out in outputs)       # boto3 received what it sent
        assert any('"Arn": "arn:aws:iam::000000000000:user/AKIA' in out for out in outputs)   # STS named the key
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                pass
        stop_everything(up, workdir / ".raftq")

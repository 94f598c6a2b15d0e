"""What a user installs, and the floors of the house it is built from (docs/architecture.md).

The wheel holds one package, `raftq` (and the `pyspark_raftq` module Spark's lookup needs), with
every package of the checkout's rooms under it; and each room imports only what the table of
docs/architecture.md lets it, read from the code's own imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# room folder in the checkout -> its installed name
ROOMS = {"raftq": "raftq", "api": "raftq.api", "engine": "raftq.engine",
         "statemachine": "raftq.statemachine", "wire_format": "raftq.wire_format"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(out), str(REPO)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("raftq-*.whl")
    return zipfile.ZipFile(built)


def checkout_packages() -> set[str]:
    """Every package of the rooms, by the name it is installed as."""
    found = set()
    for folder, installed in ROOMS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            inner = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((installed, *inner)))
    return found


def test_the_wheel_installs_one_package_and_the_spark_lookup_module(wheel):
    names = wheel.namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"raftq", "pyspark_raftq.py"}, top
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert wheel.read(top_level).decode().split() == ["pyspark_raftq", "raftq"]


def test_every_package_of_the_checkout_is_in_the_wheel_with_its_files(wheel):
    names = set(wheel.namelist())
    in_wheel = {n[:-len("/__init__.py")].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert in_wheel == checkout_packages()
    for folder, installed in ROOMS.items():
        for source in (REPO / folder).rglob("*.py"):
            assert installed.replace(".", "/") + "/" + source.relative_to(REPO / folder).as_posix() in names
    assert {"raftq/api/console_files/index.html", "raftq/api/console_files/console.js",
            "raftq/api/console_files/console.css"} <= names


def imports_of(path: Path) -> set[str]:
    """The project modules a file imports (absolute `raftq.` names, and relative ones resolved)."""
    folder = next(f for f in ROOMS if path.is_relative_to(REPO / f))
    package = [*ROOMS[folder].split("."), *path.parent.relative_to(REPO / folder).parts]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == "raftq")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
                names.update(f"{module}.{a.name}" if not node.module else module for a in node.names)
            elif node.module and node.module.split(".")[0] == "raftq":
                names.add(node.module)
    return names


def room_of(module: str) -> str:
    """The room a `raftq.` module lives in: api, engine, statemachine, wire_format, the clients
    (`raftq.client`, `raftq.stream_client`, `raftq.failover`, `raftq.spark`) or the top."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ("api", "engine", "statemachine", "wire_format"):
        return parts[1]
    if len(parts) > 1 and parts[1] in CLIENTS:
        return "clients"
    return "top"


CLIENTS = ("client", "stream_client", "failover", "spark")
# docs/architecture.md's "may import", room by room (the engine's own floors are its own table's)
MAY_IMPORT = {
    "wire_format": set(),
    "statemachine": {"wire_format"},
    "engine": {"statemachine", "wire_format"},
    "api": {"engine", "statemachine", "wire_format"},
    "clients": {"clients", "wire_format"},
}
# What of the engine a front may use: its face, and what both sides share.
API_MAY_USE_OF_ENGINE = ("raftq.engine.link.remote", "raftq.engine.link.receipts", "raftq.engine.outcome",
                         "raftq.engine.storage.put_buffer",
                         "raftq.engine.config", "raftq.engine.placement", "raftq.engine.background")


def source_rooms():
    for folder, installed in ROOMS.items():
        for path in (REPO / folder).rglob("*.py"):
            module = ".".join([installed, *path.relative_to(REPO / folder).with_suffix("").parts])
            yield path, room_of(module.removesuffix(".__init__"))


def test_each_room_imports_only_the_rooms_below_it():
    wrong = []
    for path, room in source_rooms():
        if room == "top":
            continue
        for module in imports_of(path):
            target = room_of(module)
            if target != room and target not in MAY_IMPORT[room]:
                wrong.append(f"{path.relative_to(REPO)} imports {module}")
            elif room == "api" and target == "engine" and not module.startswith(API_MAY_USE_OF_ENGINE):
                wrong.append(f"{path.relative_to(REPO)} imports {module}, which is not the engine's face")
    assert not wrong, "\n".join(wrong)



def test_no_installed_module_imports_a_room_by_its_checkout_name():
    """`from statemachine.x import …` works in the checkout (the folder is on sys.path) and fails
    once installed, where only `raftq.statemachine` exists: the wheel's code names rooms under raftq."""
    checkout_only = {"api", "engine", "statemachine", "wire_format", "chaos", "bench", "tests"}
    wrong = []
    for path, _room in source_rooms():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module
                     else [])
            wrong += [f"{path.relative_to(REPO)}:{node.lineno} imports {name}"
                      for name in names if name.split(".")[0] in checkout_only]
    assert not wrong, "\n".join(wrong)

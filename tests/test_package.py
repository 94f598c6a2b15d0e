"""What a user installs, and the floors of the house it is built from (docs/architecture.md).

The wheel holds one package, `raftq` (and the `pyspark_raftq` module Spark's lookup needs), with
every package of the checkout's rooms under it; and each room imports only what the table of
docs/architecture.md lets it, read from the code's own imports. `pip install raftq` is the
client, whose dependencies are few; a node's are the `server` extra (docs/operations.md,
"Installing"): the client runs where nothing else can be imported.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import start_cluster

REPO = Path(__file__).resolve().parent.parent
# room folder in the checkout -> its installed name
ROOMS = {"raftq": "raftq", "api": "raftq.api", "engine": "raftq.engine",
         "statemachine": "raftq.statemachine", "wire_format": "raftq.wire_format"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy: a build writes build/ and raftq.egg-info into the tree, and an egg-info on
    # the path (PYTHONPATH=<checkout>) is an installed raftq to pip and importlib.metadata
    checkout = out / "checkout"
    shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(".venv", ".git", "results", "__pycache__",
                                                                  "build", "*.egg-info", ".raftq"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(out), str(checkout)], check=True, capture_output=True, timeout=300)
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


def test_no_module_imports_a_room_by_its_folder_name():
    """In a checkout `import statemachine` finds the folder; installed, only `raftq.statemachine` exists."""
    folders = {folder for folder in ROOMS if folder != "raftq"}
    wrong = []
    for path, _ in source_rooms():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
            wrong += [f"{path.relative_to(REPO)} imports {name}" for name in names
                      if name and name.split(".")[0] in folders]
    assert not wrong, "\n".join(wrong)


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



def requirements(wheel) -> list[Requirement]:
    """The wheel's Requires-Dist."""
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    lines = wheel.read(metadata).decode().splitlines()
    return [Requirement(line.partition(": ")[2]) for line in lines if line.startswith("Requires-Dist: ")]


def needed_without_extras(requirement: Requirement) -> bool:
    return requirement.marker is None or requirement.marker.evaluate({"extra": ""})


def names_of(found) -> set[str]:
    return {canonicalize_name(r.name) for r in found}


def test_the_plain_install_is_the_client_and_a_nodes_dependencies_are_the_server_extra(wheel):
    found = requirements(wheel)
    assert names_of(r for r in found if needed_without_extras(r)) == {"aiohttp", "cbor2"}
    server = [r for r in found if r.marker is not None and r.marker.evaluate({"extra": "server"})
              and not needed_without_extras(r)]
    assert names_of(server) == {"pysyncobj", "sortedcontainers", "orjson", "prometheus-client", "cryptography"}
    assert [str(r.specifier) for r in server if r.name == "pysyncobj"] == ["==0.3.17"]


@pytest.fixture(scope="module")
def client_install(wheel, tmp_path_factory) -> Path:
    """What `pip install raftq` puts into an environment, as one directory for sys.path: the wheel
    unpacked, and the distributions of its plain requirements and of theirs in turn (extras
    left out), linked from this environment's installed copies."""
    site = tmp_path_factory.mktemp("client-site-packages")
    wheel.extractall(site)
    wanted = [r for r in requirements(wheel) if needed_without_extras(r)]
    linked = set()
    while wanted:
        requirement = wanted.pop()
        if canonicalize_name(requirement.name) in linked:
            continue
        linked.add(canonicalize_name(requirement.name))
        distribution = importlib.metadata.distribution(requirement.name)
        for top in {f.parts[0] for f in distribution.files if ".." not in f.parts and f.parts[0] != "__pycache__"}:
            (site / top).symlink_to(distribution.locate_file(top))
        wanted += [r for r in map(Requirement, distribution.requires or ()) if needed_without_extras(r)]
    return site


CLIENT_CODE = """
import asyncio, os
from raftq.client import Client, Consumer, Producer
urls, token = os.environ["RAFTQ_URL"].split(","), os.environ["RAFTQ_TOKEN"]
with Client(urls, token=token) as q:
    q.put("py", {"n": 1})
    (message,) = q.receive("py", max=1, wait_ms=5000)["messages"]
    assert q.ack("py", [message["receipt"]])["acked"] == 1
async def stream():
    async with Producer(urls, token=token) as producer:
        await (await producer.send("streamed", {"n": 2}))
    async with Consumer(urls, "streamed", token=token) as consumer:
        message = await consumer.receive(timeout=60)
        message.ack()
        return message.body
print(asyncio.run(stream()))
"""


@pytest.mark.integration
def test_the_client_runs_with_the_wheel_and_its_plain_requirements_alone(client_install, tmp_path):
    """Put, receive and ack from the CLI and the Python clients (HTTP and the streaming wire), and
    `raftq cluster status` through a cluster.toml, run from the wheel in processes whose only
    packages are what `pip install raftq` brings (python -S: no site-packages); `raftq up` and
    `raftq node` there say what to install."""
    cluster = start_cluster(tmp_path / "cluster", 1)
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAFTQ_")},
           "PYTHONPATH": str(client_install), "RAFTQ_URL": ",".join(cluster.urls), "RAFTQ_TOKEN": cluster.token}

    def client_only(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", *args], cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=120)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return client_only("-m", "raftq", *args)

    try:
        where = client_only("-c", "import raftq, sys; print(raftq.__file__); import orjson")
        assert where.stdout.strip() == str(client_install / "raftq" / "__init__.py"), where
        assert "No module named 'orjson'" in where.stderr         # nothing of the server's is there
        put = cli("put", "jobs", '{"task": 1}')
        assert put.returncode == 0, put.stderr
        received = cli("receive", "jobs", "--wait", "5000", "--json")
        assert received.returncode == 0, received.stderr
        (message,) = json.loads(received.stdout)["messages"]
        assert message["body"] == {"task": 1}
        acked = cli("ack", "jobs", message["receipt"])
        assert acked.returncode == 0, acked.stderr
        python = client_only("-c", CLIENT_CODE)
        assert python.returncode == 0 and python.stdout.strip() == "{'n': 2}", python.stderr
        del env["RAFTQ_URL"], env["RAFTQ_TOKEN"]           # found through the cluster's cluster.toml
        status = cli("--cluster-dir", str(cluster.root), "cluster", "status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["leader"] == "n1"
        for command in (["up"], ["node", "--config", str(cluster.config_path), "--id", "n1"]):
            refused = cli(*command)
            assert refused.returncode == 2, refused.stderr
            assert "Traceback" not in refused.stderr, refused.stderr
            assert f"{sys.executable} -m pip install 'raftq[server]'" in refused.stderr, refused.stderr
            assert "pysyncobj, sortedcontainers, orjson, prometheus-client, cryptography missing" in refused.stderr
        with cluster.client() as client:
            assert client.queue("jobs")["stats"]["acked_total"] == 1
    finally:
        cluster.close()

"""A local Spark session for the connector's tests, and what every Spark test module needs.

The tests skip when pyspark or Java is missing — except in CI (tests/tools.py),
where they fail instead: .ci/run installs both, so a skip there would hide a
broken setup.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from tests.tools import require

REPO = Path(__file__).resolve().parent.parent


def require_spark() -> None:
    """Called by each Spark module's session fixture, before anything starts."""
    for module in ("pyspark", "pyarrow"):
        require(importlib.util.find_spec(module), f"the python package {module}",
                "make spark-deps (pip install -e '.[spark]')")
    require(shutil.which("java") or os.environ.get("JAVA_HOME"), "java", "apt-get install openjdk-17-jre-headless")


def spark_env() -> dict:
    """What the driver, its JVM and every Python worker must see (docs/spark.md, "A local Spark session")."""
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        # Workers import raftq.spark and Spark's lookup finds pyspark_raftq here,
        # also when raftq is installed in editable mode.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


def start_session(master: str = "local[2]", app: str = "raftq-tests"):
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession
    return (SparkSession.builder.master(master).appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "1g")
            .config("spark.sql.streaming.stopTimeout", "30s")
            .getOrCreate())


def stop_spark_jvm() -> None:
    """Stop the JVM the Spark tests' sessions ran in, by its PID, if one was started.

    ``SparkSession.stop`` leaves pyspark's gateway JVM running, for the next
    session of the process to reuse; the Spark test modules share it, and the
    run stops it once at its end."""
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext
    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    gateway.proc.terminate()
    try:
        gateway.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        gateway.proc.kill()
        gateway.proc.wait()
    SparkContext._gateway = SparkContext._jvm = None


def options(cluster, queue, **extra) -> dict:
    """The connector's options for `cluster` and `queue`, values as strings (as Spark passes them)."""
    opts = {"url": ",".join(cluster.urls), "queue": queue}
    if cluster.token:
        opts["token"] = cluster.token
    return {**opts, **{k: str(v) for k, v in extra.items()}}


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"

"""The `raftq` command line: run nodes, operate the cluster, use queues from a terminal.

One module per responsibility: run.py (node, up, down), up.py (what `raftq up`
does and prints), down.py (`raftq down` and `up --detach`), cluster.py (status, membership, leadership, health,
metrics), queues.py (queues, groups, redrive), messages.py (put ... tx),
top.py (live view), bench.py (load generator), sqs.py (SQS keys), principals.py (principals:
credentials with rules and quotas); connect.py finds the cluster (and says where it looked when
it found none) and prints; suggest.py turns a mistyped command into the one most likely meant.
Every client command takes --json, --url (repeatable), --token, --ca, before or after its name.
"""

import argparse
import sys
from importlib import metadata

from ..client import RaftqError
from . import bench, cluster, messages, principals, queues, run, sqs, top
from .connect import target, where_it_looked
from .suggest import Parser, UsageError, report


def _connection_options(defaults: bool) -> argparse.ArgumentParser:
    # On the subcommands the defaults are suppressed, so that an option given
    # before the command name is not overwritten by the subcommand's default.
    default = None if defaults else argparse.SUPPRESS
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--url", action="append", default=default,
                         help="a node's URL; repeat or comma-separate for several (default: RAFTQ_URL, "
                              "else ./.raftq/cluster.toml, else http://127.0.0.1:8001)")
    options.add_argument("--token", default=default, help="bearer token (default: RAFTQ_TOKEN, else the "
                                                          "local cluster's)")
    options.add_argument("--ca", default=default, help="CA bundle for https:// nodes (default: RAFTQ_CA)")
    options.add_argument("--cluster-dir", default=default,
                         help="where a local cluster's cluster.toml is (default: RAFTQ_CLUSTER_DIR, else .raftq)")
    options.add_argument("--json", action="store_true", default=False if defaults else argparse.SUPPRESS,
                         help="print the answer as one line of JSON")
    return options


def version() -> str:
    """The installed distribution's version (pyproject.toml), which docs/operations.md's upgrade rules name."""
    try:
        return metadata.version("raftq")
    except metadata.PackageNotFoundError:
        return "unknown (run from a source tree that is not installed)"


def parser() -> argparse.ArgumentParser:
    top_level = Parser(prog="raftq", description="A Raft-replicated durable queue cluster.",
                       parents=[_connection_options(True)])
    top_level.add_argument("--version", action="version", version=f"raftq {version()}")
    sub = top_level.add_subparsers(dest="command", required=True)
    common = _connection_options(False)
    run.add_parsers(sub)
    cluster.add_parsers(sub, common)
    queues.add_parsers(sub, common)
    messages.add_parsers(sub, common)
    top.add_parser(sub, common)
    bench.add_parser(sub, common)
    sqs.add_parsers(sub, common)
    principals.add_parsers(sub, common)
    return top_level


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    top = parser()
    try:
        args = top.parse_args(argv)
    except UsageError as error:
        return report(top, error, argv)
    try:
        return args.run(args)
    except RaftqError as exc:
        print(f"raftq: {exc.code}: {exc.message}", file=sys.stderr)
        _say_where_it_looked(args, exc)
        return 1
    except OSError as exc:
        print(f"raftq: cannot reach {target(args).describe()}: {exc}", file=sys.stderr)
        _say_where_it_looked(args, exc)
        return 1
    except KeyboardInterrupt:
        return 130


def _say_where_it_looked(args, failure: Exception) -> None:
    if args.command in run.LOCAL_COMMANDS:     # they name no cluster to reach
        return
    looked = where_it_looked(target(args), failure)
    if looked:
        print(f"raftq: {looked}", file=sys.stderr)

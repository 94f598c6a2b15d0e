"""`raftq principal add|list|show|change|remove|audit|whoami`: credentials the cluster keeps, each with
rules of actions on queue-name patterns and quotas (docs/security.md, "Principals").

A rule is ``--allow ACTIONS[:PATTERNS]``: comma-separated actions (put, receive, browse, admin,
redrive, producers, metrics, cluster) on comma-separated queue-name patterns ("orders-*", "*");
the cluster actions need none. The cluster checks rules and quotas (a client-only install has
no state machine to check them with) and says what is wrong. ``add`` and ``change --new-token``
print the token as the shell line the clients read it from (``eval "$(raftq principal add ...)"``): it is in that output and
nowhere else. They return once every node takes the new credential.
"""

from __future__ import annotations

import time

from ..client import Client, RaftqError
from .connect import emit, table, target
from .sqs import export_lines

EVERY_NODE_TAKES_IT_S = 10.0
# For the help alone: the cluster checks them (statemachine/rules.py's ACTIONS, principals.py's
# QUOTAS; tests/test_principals.py holds these to them).
ACTIONS = ("put", "receive", "browse", "admin", "redrive", "producers", "metrics", "cluster")
QUOTAS = ("queues", "stored_bytes", "put_rate", "connections", "long_polls")


def rule(text: str) -> dict:
    """--allow's ACTIONS[:PATTERNS] as a rule."""
    actions, _, patterns = text.partition(":")
    rule = {"actions": [a.strip() for a in actions.split(",") if a.strip()]}
    if not rule["actions"]:
        raise SystemExit(f"raftq: --allow {text!r}: ACTIONS[:PATTERNS], as in put,browse:orders-*")
    if patterns:
        rule["queues"] = [p.strip() for p in patterns.split(",") if p.strip()]
    return rule


def quotas(given: list[str] | None) -> dict | None:
    if given is None:
        return None
    found = {}
    for item in given:
        name, _, value = item.partition("=")
        if not name or not value.isdigit():
            raise SystemExit(f"raftq: --quota {item!r}: NAME=INTEGER, as in stored_bytes=1000000")
        found[name] = int(value)
    return found


def _wait_taken(token: str, urls: list[str], cafile: str | None) -> None:
    """Return once each node of `urls` takes `token` (its replica of group 0 applied it)."""
    deadline = time.monotonic() + EVERY_NODE_TAKES_IT_S
    for url in urls:
        with Client([url], token=token, cafile=cafile, retry_for=EVERY_NODE_TAKES_IT_S) as node:
            while True:
                try:
                    node.whoami()
                    break
                except RaftqError as exc:
                    if exc.code != "unauthorized" or time.monotonic() > deadline:
                        raise SystemExit(f"raftq: the principal was made, but {url} has not taken it within "
                                         f"{EVERY_NODE_TAKES_IT_S:g} s ({exc.code}); see `raftq cluster status`")
                    time.sleep(0.05)


def _credentials(answer: dict, endpoint: str) -> str:
    lines = [f"export RAFTQ_TOKEN={answer['token']}"] if "token" in answer else []
    if "sqs" in answer:
        lines.append(export_lines(answer["sqs"], endpoint))
    return "\n".join(lines)


def _rules_text(rules: list) -> str:
    return "; ".join(f"{','.join(r['actions'])}:{','.join(r['queues'])}" for r in rules)


def cmd_principal(args) -> int:
    where = target(args)
    with where.client() as client:
        if args.action == "add":
            answer = client.add_principal(args.name, [rule(r) for r in args.allow], quotas=quotas(args.quota),
                                          sqs=args.sqs)
            _wait_taken(answer["token"], where.urls, where.cafile)
            emit(args, answer, _credentials(answer, where.urls[0]))
        elif args.action == "change":
            answer = client.change_principal(args.name, rules=[rule(r) for r in args.allow] if args.allow else None,
                                             quotas=quotas(args.quota), new_token=args.new_token,
                                             new_sqs_key=args.new_sqs_key)
            if "token" in answer:
                _wait_taken(answer["token"], where.urls, where.cafile)
            emit(args, answer, _credentials(answer, where.urls[0]) or f"changed principal {args.name}")
        elif args.action == "list":
            view = client.principals()
            rows = [(p["name"], _rules_text(p["rules"]), " ".join(f"{k}={v}" for k, v in p["quotas"].items()) or None,
                     " ".join(p["sqs_keys"]) or None) for p in view["principals"]]
            emit(args, view, table(("principal", "rules", "quotas", "sqs keys"), rows) if rows else
                 "(no principals: only cluster.toml's tokens; raftq principal add makes one)")
        elif args.action == "show":
            emit(args, client.principal(args.name))
        elif args.action == "remove":
            client.remove_principal(args.name)
            emit(args, {"removed": args.name}, f"removed principal {args.name}: every node refuses it within a second")
        elif args.action == "audit":
            view = client.audit(limit=args.limit)
            changes = [(c["at_ms"], c["change"], c["principal"], c.get("by")) for c in view["changes"]]
            refusals = [(r["at_ms"], r["principal"], r["action"], r.get("queue"), r.get("client"))
                        for r in view["refusals"]]
            emit(args, view, table(("at_ms", "change", "principal", "by"), changes)
                 + f"\n\nrefused by node {view['node']}:\n"
                 + table(("at_ms", "principal", "action", "queue", "client"), refusals))
        else:
            me = client.whoami()
            emit(args, me, f"{me['name']} ({me['kept_by']}): {_rules_text(me['rules'])}"
                 + (f"; quotas {me['quotas']}" if me["quotas"] else ""))
    return 0


def add_parsers(sub, common) -> None:
    principal = sub.add_parser("principal", help="principals: credentials with rules and quotas, kept by the cluster")
    actions = principal.add_subparsers(dest="action", required=True)
    allow_help = ("a rule: ACTIONS:PATTERNS, e.g. put,browse:orders-* (actions: " + ", ".join(ACTIONS)
                  + "; metrics and cluster take no patterns); repeat for several")
    quota_help = "NAME=INTEGER, NAME one of " + ", ".join(QUOTAS) + "; repeat for several"
    add = actions.add_parser("add", parents=[common], help="make a principal and print its token (and SQS key)")
    add.add_argument("name")
    add.add_argument("--allow", action="append", required=True, help=allow_help)
    add.add_argument("--quota", action="append", help=quota_help)
    add.add_argument("--sqs", action="store_true", help="give it an SQS access key pair too")
    change = actions.add_parser("change", parents=[common], help="replace a principal's rules or quotas, or give it "
                                                                  "a new token or SQS key")
    change.add_argument("name")
    change.add_argument("--allow", action="append", help=allow_help + " (replaces every rule)")
    change.add_argument("--quota", action="append", help=quota_help + " (replaces every quota)")
    change.add_argument("--new-token", action="store_true", help="a new token; the old one stops")
    change.add_argument("--new-sqs-key", action="store_true", help="one more SQS key (remove the old one with "
                                                                   "raftq sqs key remove)")
    actions.add_parser("list", parents=[common], help="every principal's rules, quotas and SQS keys")
    show = actions.add_parser("show", parents=[common], help="one principal")
    show.add_argument("name")
    remove = actions.add_parser("remove", parents=[common], help="revoke a principal: every node refuses it "
                                                                 "within a second")
    remove.add_argument("name")
    audit = actions.add_parser("audit", parents=[common], help="the last credential changes, and what the answering "
                                                               "node refused")
    audit.add_argument("--limit", type=int, default=20)
    actions.add_parser("whoami", parents=[common], help="the principal of the token given")
    principal.set_defaults(run=cmd_principal)

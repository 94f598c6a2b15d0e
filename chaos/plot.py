"""The timeline of a chaos run as a PNG: operation latency over time, fault
windows shaded, failover instants marked, and who led when. Needs matplotlib
(the [plot] extra)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402

from chaos.checker import group_states  # noqa: E402
from chaos.history import ops  # noqa: E402

COLOURS = {"put": "tab:blue", "receive": "tab:green", "ack": "tab:purple", "nack": "tab:brown"}
MARKS = {"kill": "red", "isolate": "darkorange", "terminate": "magenta", "pause": "teal", "kill-engine": "crimson"}
GROUP_OFFSET = 0.15   # each Raft group's leader marks sit a little above the previous group's


def timeline(events: list[dict], path: Path, title: str = "") -> None:
    all_ops = ops(events)
    fig, (lat, lead) = plt.subplots(2, 1, figsize=(16, 8), sharex=True,
                                    gridspec_kw={"height_ratios": [4, 1]})
    end = max((e["t"] for e in events), default=1.0)
    for f, colour in COLOURS.items():
        for outcome, marker, size in (("ok", ".", 3), ("fail", "v", 12), ("info", "x", 12)):
            chosen = [o for o in all_ops if o.f == f and o.type == outcome and o.process != "monitor"]
            if not chosen:
                continue
            lat.scatter([o.invoke_t for o in chosen],
                        [o.latency if math.isfinite(o.latency) else end - o.invoke_t for o in chosen],
                        s=size, marker=marker, color=colour, alpha=0.6, linewidths=0.8,
                        label=f"{f} {outcome} ({len(chosen)})")
    lat.set_yscale("log")
    lat.set_ylabel("latency (s)")
    lat.legend(loc="upper left", fontsize=7, ncol=4, markerscale=2)

    starts = {e["fault"]: e for e in events if e["type"] == "nemesis" and e.get("f") == "start"}
    for e in events:
        if e["type"] == "nemesis" and e.get("f") == "stop" and e["fault"] in starts:
            start = starts[e["fault"]]
            for ax in (lat, lead):
                ax.axvspan(start["t"], e["t"], color="grey", alpha=0.15, linewidth=0)
            lat.text(start["t"], 1.0, start["kind"], transform=lat.get_xaxis_transform(), rotation=90,
                     va="top", ha="right", fontsize=7)
        elif e["type"] == "nemesis" and e.get("f") == "mark" and e["value"].get("failover"):
            lat.axvline(e["t"], color=MARKS.get(e["value"]["failover"], "black"), linewidth=0.8)

    nodes = sorted({o.node for o in all_ops if o.f == "ready" and o.node})
    claims: dict[int, list[tuple[float, str]]] = {}   # Raft group -> (when, node) it was led
    for o in all_ops:
        if o.f == "ready" and o.ok:
            for group, state in group_states(o.result).items():
                if state.get("role") == "leader":
                    claims.setdefault(group, []).append((o.invoke_t, o.node))
    for group, seen in sorted(claims.items()):
        lead.scatter([t for t, _ in seen], [nodes.index(n) + group * GROUP_OFFSET for _, n in seen], s=4,
                     color="black" if len(claims) == 1 else f"C{group % 10}", label=f"group {group}")
    if len(claims) > 1:
        lead.legend(loc="upper left", fontsize=7, ncol=len(claims), markerscale=2)
    lead.set_yticks(range(len(nodes)), nodes)
    lead.set_ylabel("leader" if len(claims) <= 1 else "leader of each group")
    lead.set_xlabel("seconds since start")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

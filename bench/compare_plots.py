"""Pictures for `python -m bench compare`: throughput bars and latency CDFs."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.measure import percentile  # noqa: E402


def plot(out: Path, raw: dict, labels: dict) -> None:
    names = [n for n in raw if raw[n].get("w1")]     # not the sides measured in W6 only
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (workload, title) in zip(axes, (("w1", "W1 one at a time"), ("w2", "W2 pipelined"),
                                            ("w3", "W3 consume + ack"))):
        values = [[r["msgs_per_s"] for r in raw[n][workload]] for n in names]
        ax.bar(range(len(names)), [percentile(v, 50) for v in values], color=[f"C{i}" for i in range(len(names))])
        for i, v in enumerate(values):
            ax.plot([i] * len(v), v, "k.", markersize=4)
        ax.set_xticks(range(len(names)), names)
        ax.set_title(title)
        ax.set_ylabel("messages/s")
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (workload, key, title) in zip(axes, (("w1", "_latencies_ms", "W1 acked write latency"),
                                                 ("w5", "_e2e_ms", "W5 put -> delivered latency"))):
        for n in names:
            values = sorted(v for r in raw[n].get(workload, []) for v in r.get(key, []))
            if values:
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=labels[n])
        ax.set_xscale("log")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "latency_cdf.png", dpi=110)
    plt.close(fig)

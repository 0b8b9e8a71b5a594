#!/usr/bin/env python3
"""Draws a soak's samples (target/soak/samples.jsonl) as target/soak/soak.png.

Usage: soak-plot.py <soak dir>

Panels: RSS and open descriptors of every mesh process (one line per pod, a
restarted pod is a new line), CPU, pods enrolled against pods that should be,
connections (new per second, failed, long-lived open and lost), and what each
ztunnel holds (xDS workloads, certificates, HBONE pool). Injected faults are
shaded; their names are in summary.json.
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "target/soak")
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line]
    if not samples:
        print(f"no samples in {out / 'samples.jsonl'}", file=sys.stderr)
        return 1
    summary_path = out / "summary.json"
    faults = json.loads(summary_path.read_text()).get("faults", []) if summary_path.exists() else []
    minutes = [s["t_s"] / 60 for s in samples]

    fig, axes = plt.subplots(3, 2, figsize=(15, 12), sharex=True)
    (rss, fds), (cpu, pods), (conns, ztunnel) = axes

    per_process = defaultdict(lambda: {"t": [], "rss": [], "fds": [], "cpu": []})
    for s in samples:
        for p in s["processes"]:
            line = per_process[f'{p["pod"]} ({p["pid"]})']
            line["t"].append(s["t_s"] / 60)
            line["rss"].append(p["rss_kib"] / 1024)
            line["fds"].append(p["fds"])
            line["cpu"].append(p["cpu_cores"] if p["cpu_cores"] is not None else float("nan"))
    for name, line in sorted(per_process.items()):
        rss.plot(line["t"], line["rss"], label=name, linewidth=1)
        fds.plot(line["t"], line["fds"], linewidth=1)
        cpu.plot(line["t"], line["cpu"], linewidth=1)
    rss.set_title("RSS per mesh process (MiB)")
    rss.legend(fontsize=6, ncol=2)
    fds.set_title("open descriptors per mesh process")
    cpu.set_title("CPU per mesh process (cores)")

    pods.plot(minutes, [s["meshed_expected"] for s in samples], label="should be enrolled")
    pods.plot(minutes, [s["meshed_enrolled"] for s in samples], label="enrolled (agents)", linestyle="--")
    pods.plot(minutes, [s["pods_running"] for s in samples], label="running", linewidth=0.8)
    pods.set_title("pods")
    pods.legend(fontsize=8)

    def rate(key):
        values = [s["traffic"][key] for s in samples]
        return [0] + [
            (b - a) / max(t1 - t0, 1e-9)
            for a, b, t0, t1 in zip(values, values[1:], [s["t_s"] for s in samples], [s["t_s"] for s in samples[1:]])
        ]

    conns.plot(minutes, rate("short_ok"), label="new connections ok per s")
    failed = [sum(s["traffic"]["short_failed"].values()) for s in samples]
    lost = [sum(s["traffic"]["long_lost"].values()) for s in samples]
    conns.plot(minutes, [s["traffic"]["long_open"] for s in samples], label="long-lived open")
    conns.plot(minutes, failed, label="new connections failed (total)")
    conns.plot(minutes, lost, label="long-lived lost (total)")
    conns.set_title("connections")
    conns.legend(fontsize=8)

    by_node = defaultdict(lambda: {"t": [], "xds": [], "certs": [], "pool": [], "served": []})
    for s in samples:
        for z in s["ztunnels"]:
            line = by_node[z["node"]]
            line["t"].append(s["t_s"] / 60)
            line["xds"].append(z["xds_workloads"])
            line["certs"].append(z["certificates"])
            line["pool"].append(z["hbone_pool"])
            line["served"].append(z["pods_served"])
    ztunnel.plot(minutes, [s["api_pods"] for s in samples], label="pods in the API server", color="black", linewidth=0.8)
    for node, line in sorted(by_node.items()):
        ztunnel.plot(line["t"], line["xds"], label=f"{node}: xDS workloads")
        ztunnel.plot(line["t"], line["served"], label=f"{node}: pods served", linestyle="--")
        ztunnel.plot(line["t"], line["certs"], label=f"{node}: certificates", linestyle=":")
        ztunnel.plot(line["t"], line["pool"], label=f"{node}: HBONE pool", linestyle="-.")
    ztunnel.set_title("what each ztunnel holds")
    ztunnel.legend(fontsize=6, ncol=2)

    for ax in axes.flat:
        for f in faults:
            end = f.get("end_s") or f["start_s"]
            ax.axvspan(f["start_s"] / 60, end / 60, color="red", alpha=0.12)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("minutes (faults shaded)")
    fig.suptitle(f"soak: {samples[-1]['t_s'] / 60:.0f} minutes")
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=90)
    print(f"wrote {out / 'soak.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Draws scale.png from a scale-benchmark output directory (curves.csv, summary.json), or
growth.png from a matrix's directory (growth.csv).

usage: plot.py OUT_DIR

Left: convergence of the burst — jobs with a correct PodGroup against seconds since the first job
create, for podgroup-sync, the bare client and training-operator (dotted: jobs created). Middle:
CDF of the job→PodGroup latency (the job's create response → its PodGroup first seen correct by a
watch). Right: the backlog — N jobs without PodGroups, podgroup-sync started vs the bare client.
"""
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {
    "podgroup-sync-burst": "podgroup-sync",
    "bare-burst": "bare client (limit)",
    "training-operator-burst": "training-operator",
    "podgroup-sync-backlog": "podgroup-sync (from spawn)",
    "bare-backlog": "bare client",
}
COLORS = {
    "podgroup-sync-burst": "tab:blue",
    "bare-burst": "tab:green",
    "training-operator-burst": "tab:red",
    "podgroup-sync-backlog": "tab:blue",
    "bare-backlog": "tab:green",
}


def main(out: Path) -> None:
    series = defaultdict(lambda: ([], []))
    with open(out / "curves.csv", newline="") as f:
        for row in csv.DictReader(f):
            xs, ys = series[(row["phase"], row["series"])]
            xs.append(float(row["x"]))
            ys.append(float(row["y"]))
    summary = json.loads((out / "summary.json").read_text())
    n, m, c = summary["jobs"], summary["namespaces"], summary["concurrency"]

    fig, (conv, cdf, backlog) = plt.subplots(1, 3, figsize=(17, 5.2))
    for phase in ("podgroup-sync-burst", "bare-burst", "training-operator-burst"):
        if (phase, "podgroups") not in series:
            continue
        xs, ys = series[(phase, "podgroups")]
        conv.step(xs, ys, where="post", color=COLORS[phase], label=LABELS[phase])
        jx, jy = series.get((phase, "jobs"), ([], []))
        if jx:
            conv.step(jx, jy, where="post", color=COLORS[phase], linestyle=":", linewidth=1)
        lx, ly = series.get((phase, "latency_ms"), ([], []))
        if lx:
            cdf.step(lx, ly, where="post", color=COLORS[phase], label=LABELS[phase])
    conv.set_title(f"Burst: {n} PyTorchJobs created at once\n(dotted: jobs created)")
    conv.set_xlabel("seconds since the first job create")
    conv.set_ylabel("jobs with a correct PodGroup")
    conv.grid(alpha=0.3)
    conv.legend(loc="lower right")
    cdf.set_title("job → PodGroup latency (create response → seen by a watch)")
    cdf.set_xlabel("milliseconds")
    cdf.set_xscale("log")
    cdf.set_ylabel("fraction of jobs")
    cdf.grid(alpha=0.3, which="both")
    cdf.legend(loc="lower right")
    for phase in ("podgroup-sync-backlog", "bare-backlog"):
        if (phase, "podgroups") in series:
            xs, ys = series[(phase, "podgroups")]
            backlog.step(xs, ys, where="post", color=COLORS[phase], label=LABELS[phase])
    backlog.set_title(f"Backlog: {n} jobs exist without PodGroups")
    backlog.set_xlabel("seconds since start (controller spawn / first write)")
    backlog.set_ylabel("jobs with a correct PodGroup")
    backlog.grid(alpha=0.3)
    backlog.legend(loc="lower right")
    load = summary.get("load_start", "")
    fig.suptitle(
        f"podgroup-sync scale benchmark — {n} jobs, {m} namespaces, concurrency {c}; "
        f"{summary['machine'].get('cores', '?')} cores, load {load}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(out / "scale.png", dpi=110)
    print(out / "scale.png")


GROWTH_COLORS = {
    "podgroup-sync": "tab:blue",
    "bare client": "tab:green",
    "training-operator": "tab:red",
}


def growth(out: Path) -> None:
    """Convergence, peak RSS and CPU of the burst against the number of jobs (log-log)."""
    rows = defaultdict(list)
    with open(out / "growth.csv", newline="") as f:
        for row in csv.DictReader(f):
            rows[row["contender"]].append(row)
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    panels = (
        ("converge_s", "burst: every job has a correct PodGroup (s)"),
        ("hwm_mib", "peak RSS (MiB, VmHWM)"),
        ("cpu_s", "CPU seconds in the burst window"),
    )
    for ax, (field, title) in zip(axes, panels):
        for contender, rs in rows.items():
            pts = sorted((int(r["jobs"]), float(r[field])) for r in rs if r[field])
            if pts:
                ax.plot(*zip(*pts), marker="o", color=GROWTH_COLORS.get(contender), label=contender)
        ax.set_title(title)
        ax.set_xlabel("jobs")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc="upper left")
    fig.suptitle("podgroup-sync scale benchmark — growth with the number of jobs", fontsize=11)
    fig.tight_layout()
    fig.savefig(out / "growth.png", dpi=110)
    print(out / "growth.png")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: plot.py OUT_DIR")
    d = Path(sys.argv[1])
    if (d / "growth.csv").exists():
        growth(d)
    else:
        main(d)

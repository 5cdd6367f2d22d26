#!/usr/bin/env python3
"""Plots compute overhead against memory ratio from a remat-sim results CSV (the DTR paper's figure layout).

One panel per trace, one line per policy (per policy and mode when the CSV mixes modes, per policy and offload
mode when it mixes offload modes: "coop (offload auto)"; a CSV without an offload column counts as offload off).
Offload off is drawn solid, other offload modes dashed in the same colour as their policy. Only runs that passed
are points: an OOM or a thrash has no meaningful overhead, so a line stops at the lowest feasible ratio, as in
the DTR paper, and has a gap where a ratio failed between two that passed. The x axis runs from the loosest budget on the left to the tightest on the
right.

Usage: plot_overhead.py --csv results.csv --out overhead.png [--title TEXT]
Exit status: 0 written, 2 bad arguments or CSV, 3 matplotlib missing.
"""
import argparse
import collections
import csv
import math
import re
import sys

REQUIRED = ("trace", "policy", "mode", "ratio", "result", "overhead")


def trace_label(name):
    """'resnet32-56-9000000000.0-...-default.log' -> 'resnet32 (batch 56)'."""
    stem = name[:-4] if name.endswith(".log") else name
    match = re.match(r"^(.+?)-(\d+)-", stem)
    if match:
        return f"{match.group(1)} (batch {match.group(2)})"
    return stem


def read_rows(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        rows = []
        for line, row in enumerate(reader, start=2):
            try:
                row["ratio"] = float(row["ratio"])
                row["overhead"] = float(row["overhead"]) if row["overhead"] else math.nan
            except ValueError as e:
                raise ValueError(f"{path}:{line}: {e}") from None
            row["offload"] = row.get("offload") or "off"
            rows.append(row)
    return rows


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot_overhead.py: matplotlib is not available to {sys.executable}: {e}", file=sys.stderr)
        return 3

    try:
        rows = read_rows(args.csv)
    except (OSError, ValueError) as e:
        print(f"plot_overhead.py: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"plot_overhead.py: {args.csv}: no rows", file=sys.stderr)
        return 2

    traces = list(dict.fromkeys(r["trace"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    offloads = list(dict.fromkeys(r["offload"] for r in rows))
    policies = list(dict.fromkeys((r["policy"], r["mode"], r["offload"]) for r in rows))

    def make_label(p):
        parts = ([p[1]] if len(modes) > 1 else []) + ([f"offload {p[2]}"] if len(offloads) > 1 else [])
        return f"{p[0]} ({', '.join(parts)})" if parts else p[0]

    label = {p: make_label(p) for p in policies}
    cmap = plt.get_cmap("tab10")
    markers = "osD^vP*Xh<>"
    # Same colour for a policy (and accounting mode) whatever its offload mode; offload modes differ by dash/marker.
    bases = list(dict.fromkeys((p[0], p[1]) for p in policies))
    dashes = {"off": "-", "auto": "--", "always": ":"}
    style = {p: (cmap(bases.index((p[0], p[1])) % 10),
                 markers[(bases.index((p[0], p[1])) + 3 * offloads.index(p[2])) % len(markers)],
                 dashes.get(p[2], "-."))
             for p in policies}

    ncols = min(3, len(traces))
    nrows = math.ceil(len(traces) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.6 * nrows), squeeze=False)
    all_ratios = [r["ratio"] for r in rows]
    for index, trace in enumerate(traces):
        ax = axes[index // ncols][index % ncols]
        # Every run of the policy is a point in ratio order; one that did not pass is a gap (NaN), so a line
        # never bridges a failed ratio.
        series = collections.defaultdict(list)
        for r in rows:
            if r["trace"] == trace:
                passed = r["result"] == "pass" and not math.isnan(r["overhead"])
                key = (r["policy"], r["mode"], r["offload"])
                series[key].append((r["ratio"], r["overhead"] if passed else math.nan))
        for p in policies:
            points = sorted(series.get(p, []), reverse=True)
            if all(math.isnan(y) for _, y in points):
                continue
            color, marker, dash = style[p]
            ax.plot([x for x, _ in points], [y for _, y in points], marker=marker, color=color, label=label[p],
                    linestyle=dash, markersize=4, linewidth=1.4)
        ax.set_title(trace_label(trace), fontsize=10)
        ax.set_xlim(max(all_ratios) + 0.05, min(all_ratios) - 0.05)
        ax.set_xlabel("memory ratio (budget / unconstrained peak)", fontsize=8)
        ax.set_ylabel("compute overhead (x)", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0.98)
    for index in range(len(traces), nrows * ncols):
        axes[index // ncols][index % ncols].set_visible(False)

    handles = [plt.Line2D([], [], color=style[p][0], marker=style[p][1], linestyle=style[p][2], label=label[p])
               for p in policies]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(policies), 7), fontsize=9, frameon=False)
    title = args.title or f"Compute overhead vs memory ratio ({', '.join(modes)} mode); points are runs that passed"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.07 if nrows == 1 else 0.05, 1, 0.95))
    try:
        fig.savefig(args.out, dpi=120)
    except OSError as e:
        print(f"plot_overhead.py: cannot write {args.out}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

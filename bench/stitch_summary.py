#!/usr/bin/env python3
"""Compares remat-sim's counter, arena and stitch modes (issue 18) as Markdown for the README.

One row per (trace, policy): the lowest feasible ratio in each mode (starred when some higher ratio failed:
feasibility not monotone in the budget), and over the ratios where counter and stitch mode both pass, the largest
and the mean of stitch overhead / counter overhead - 1 (the fragmentation left), and the same for arena mode.

Usage: stitch_summary.py counter.csv arena.csv stitch.csv  (stdlib only)
"""
import sys

from sim_csv import read_rows, trace_label

MODES = ("counter", "arena", "stitch")


def lowest_feasible(cells, ratios):
    """The lowest passing ratio, starred when a higher ratio failed; '-' when none passed."""
    passed = [x for x in ratios if cells.get(x, {}).get("result") == "pass"]
    if not passed:
        return "-"
    low = min(passed)
    gap = any(cells.get(x, {}).get("result") != "pass" for x in ratios if x > low)
    return f"{low:g}" + ("*" if gap else "")


def excess(cells, base, ratios):
    """Largest and mean overhead / counter overhead - 1 over the ratios where both passed."""
    diffs = [float(cells[x]["overhead"]) / float(base[x]["overhead"]) - 1 for x in ratios
             if cells.get(x, {}).get("result") == "pass" and base.get(x, {}).get("result") == "pass"]
    if not diffs:
        return "-", "-"
    return f"{100 * max(diffs):+.1f}%", f"{100 * sum(diffs) / len(diffs):+.1f}%"


def main(argv):
    if len(argv) != 4:
        sys.exit("usage: stitch_summary.py counter.csv arena.csv stitch.csv")
    rows = {mode: read_rows([path], "stitch_summary.py counter.csv arena.csv stitch.csv")
            for mode, path in zip(MODES, argv[1:])}
    cell = {}
    for mode, mode_rows in rows.items():
        for r in mode_rows:
            cell.setdefault((mode, r["trace"], r["policy"]), {})[float(r["ratio"])] = r
    traces = list(dict.fromkeys(r["trace"] for r in rows["counter"]))
    policies = list(dict.fromkeys(r["policy"] for r in rows["counter"]))
    ratios = sorted({float(r["ratio"]) for r in rows["counter"]}, reverse=True)
    print("| trace | policy | lowest ratio: counter | arena | stitch | arena vs counter: max | mean "
          "| stitch vs counter: max | mean |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for trace in traces:
        for policy in policies:
            by_mode = {mode: cell.get((mode, trace, policy), {}) for mode in MODES}
            lows = [lowest_feasible(by_mode[mode], ratios) for mode in MODES]
            a_max, a_mean = excess(by_mode["arena"], by_mode["counter"], ratios)
            s_max, s_mean = excess(by_mode["stitch"], by_mode["counter"], ratios)
            if s_max != "-":
                worst = max(worst, float(s_max.rstrip("%")))
            print(f"| {trace_label(trace)} | {policy} | " + " | ".join(lows) +
                  f" | {a_max} | {a_mean} | {s_max} | {s_mean} |")
    print(f"\nLargest stitch-mode excess over counter mode: {worst:+.1f}%")


if __name__ == "__main__":
    main(sys.argv)

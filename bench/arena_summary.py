#!/usr/bin/env python3
"""Summarizes a remat-sim arena-mode CSV as Markdown tables for the README.

Three grids, one row per (trace, policy), one column per ratio:
  1. compute overhead (the run's result instead when it did not pass), plus the lowest feasible ratio: the lowest
     ratio that passed, starred when some higher ratio failed (feasibility is not always monotone);
  2. fragmentation rate: mean over the allocations that needed eviction of free bytes / budget (Coop's measure),
     for every run, failed ones included (they are marked);
  3. search time per run in milliseconds (wall time choosing victims: policy scoring and window search).

Usage: arena_summary.py arena.csv  (stdlib only)
"""
import collections
import sys

from sim_csv import read_rows, trace_label


def main(argv):
    rows = read_rows(argv, "arena_summary.py arena.csv")
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    ratios = sorted({float(r["ratio"]) for r in rows}, reverse=True)
    cell = {(r["trace"], r["policy"], float(r["ratio"])): r for r in rows}
    modes = sorted({r["mode"] for r in rows})
    header = "| trace | policy | " + " | ".join(f"{x:g}" for x in ratios)

    def grid(title, value, extra_header="", extra=None):
        print(f"**{title}**\n")
        print(header + (f" | {extra_header} |" if extra_header else " |"))
        print("|---|---|" + "---:|" * len(ratios) + ("---:|" if extra_header else ""))
        for trace in traces:
            for policy in policies:
                cells = []
                for x in ratios:
                    r = cell.get((trace, policy, x))
                    cells.append("" if r is None else value(r))
                line = f"| {trace_label(trace)} | {policy} | " + " | ".join(cells)
                print(line + (f" | {extra(trace, policy)} |" if extra else " |"))
        print()

    def overhead(r):
        return f"{float(r['overhead']):.3f}" if r["result"] == "pass" else r["result"]

    def lowest_feasible(trace, policy):
        passed = [x for x in ratios if cell.get((trace, policy, x), {}).get("result") == "pass"]
        if not passed:
            return "none"
        lowest = min(passed)
        failed_above = any(cell.get((trace, policy, x), {}).get("result") not in (None, "pass")
                           for x in ratios if x > lowest)
        return f"{lowest:g}" + ("*" if failed_above else "")

    def fragmentation(r):
        text = f"{float(r['fragmentation_rate']):.3f}" if r["fragmentation_rate"] else "-"
        return text if r["result"] == "pass" else f"{text} ({r['result']})"

    def search_ms(r):
        text = f"{int(r['search_time_ns']) / 1e6:.1f}"
        return text if r["result"] == "pass" else f"{text} ({r['result']})"

    print(f"Mode: {', '.join(modes)}. Ratios are budgets relative to each trace's unconstrained peak "
          f"(constants included).\n")
    grid("Compute overhead (x baseline compute; oom/thrash where the run failed)", overhead,
         "lowest feasible ratio", lowest_feasible)
    print("\\* some higher ratio failed: feasibility is not monotone for this policy and trace.\n")
    grid("Fragmentation rate (mean free bytes / budget at allocations that evicted)", fragmentation)
    grid("Search time per run, ms (choosing victims: scoring and window search)", search_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

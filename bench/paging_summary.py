#!/usr/bin/env python3
"""Summarizes a remat-sim CSV run with --offload off,auto (bench/paging_figure.sh) as Markdown tables.

  1. compute overhead per (trace, policy, offload), one column per ratio (the run's result where it did not pass;
     with offload on it includes transfer stall), plus the lowest feasible ratio (starred when some higher ratio
     failed: feasibility is not always monotone);
  2. for offload rows other than off: GiB paged out / GiB paged in / transfer stall in ms, per ratio;
  3. paging's effect per (trace, policy): lowest feasible ratio off -> on, and at each ratio where both passed,
     overhead on minus overhead off (negative: paging helps).

Usage: paging_summary.py paging.csv  (stdlib only)
"""
import sys

from sim_csv import read_rows, trace_label


def main(argv):
    rows = read_rows(argv, "paging_summary.py paging.csv")
    if "offload" not in rows[0]:
        sys.exit(f"{argv[0]}: no offload column (not a remat-sim CSV with paging columns)")
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    offloads = list(dict.fromkeys(r["offload"] for r in rows))
    ratios = sorted({float(r["ratio"]) for r in rows}, reverse=True)
    cell = {(r["trace"], r["policy"], r["offload"], float(r["ratio"])): r for r in rows}
    modes = sorted({r["mode"] for r in rows})
    ratio_header = " | ".join(f"{x:g}" for x in ratios)

    def passed(t, p, o, x):
        r = cell.get((t, p, o, x))
        return r is not None and r["result"] == "pass"

    def lowest_feasible(t, p, o):
        ok = [x for x in ratios if passed(t, p, o, x)]
        if not ok:
            return "none"
        lowest = min(ok)
        failed_above = any(cell.get((t, p, o, x)) is not None and not passed(t, p, o, x) for x in ratios if x > lowest)
        return f"{lowest:g}" + ("*" if failed_above else "")

    print(f"Mode: {', '.join(modes)}. Ratios are budgets relative to each trace's unconstrained peak (constants "
          f"included). Offload modes: {', '.join(offloads)}.\n")

    print("**Compute overhead (x baseline compute, transfer stall included; oom/thrash where the run failed)**\n")
    print(f"| trace | policy | offload | {ratio_header} | lowest feasible ratio |")
    print("|---|---|---|" + "---:|" * len(ratios) + "---:|")
    for t in traces:
        for p in policies:
            for o in offloads:
                cells = []
                for x in ratios:
                    r = cell.get((t, p, o, x))
                    cells.append("" if r is None else
                                 (f"{float(r['overhead']):.3f}" if r["result"] == "pass" else r["result"]))
                print(f"| {trace_label(t)} | {p} | {o} | " + " | ".join(cells) + f" | {lowest_feasible(t, p, o)} |")
    print("\n\\* some higher ratio failed: feasibility is not monotone for this policy and trace.\n")

    paging = [o for o in offloads if o != "off"]
    if paging:
        print("**Traffic with paging: GiB paged out / GiB paged in / transfer stall ms (failed runs: up to where "
              "they stopped, marked)**\n")
        print(f"| trace | policy | offload | {ratio_header} |")
        print("|---|---|---|" + "---:|" * len(ratios))
        for t in traces:
            for p in policies:
                for o in paging:
                    cells = []
                    for x in ratios:
                        r = cell.get((t, p, o, x))
                        if r is None:
                            cells.append("")
                            continue
                        text = (f"{int(r['paged_out_bytes']) / 2**30:.2f} / {int(r['paged_in_bytes']) / 2**30:.2f}"
                                f" / {int(r['transfer_stall_ns']) / 1e6:.1f}")
                        cells.append(text if r["result"] == "pass" else f"{text} ({r['result']})")
                    print(f"| {trace_label(t)} | {p} | {o} | " + " | ".join(cells) + " |")
        print()

    if "off" in offloads and paging:
        print("**Effect of paging: lowest feasible ratio (off -> on) and overhead on - off at ratios where both "
              "passed (negative: paging helps; 0: within 0.0005)**\n")
        print(f"| trace | policy | offload | lowest feasible | {ratio_header} |")
        print("|---|---|---|---|" + "---:|" * len(ratios))
        for t in traces:
            for p in policies:
                for o in paging:
                    cells = []
                    for x in ratios:
                        a, b = cell.get((t, p, "off", x)), cell.get((t, p, o, x))
                        if a is None or b is None:
                            cells.append("")
                        elif passed(t, p, "off", x) and passed(t, p, o, x):
                            delta = float(b["overhead"]) - float(a["overhead"])
                            cells.append("0" if abs(delta) < 5e-4 else f"{delta:+.3f}")
                        elif passed(t, p, o, x):
                            cells.append(f"on only ({float(b['overhead']):.3f})")
                        elif passed(t, p, "off", x):
                            cells.append(f"off only ({b['result']})")
                        else:
                            cells.append("neither")
                    print(f"| {trace_label(t)} | {p} | {o} | {lowest_feasible(t, p, 'off')} -> "
                          f"{lowest_feasible(t, p, o)} | " + " | ".join(cells) + " |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

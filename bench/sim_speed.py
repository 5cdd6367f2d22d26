#!/usr/bin/env python3
"""Replays the whole DTR reference set through remat-sim and compares speed and results with simrd.

Every row of ../shared/traces/dtr/simrd_reference.csv (its log, its heuristic mapped to our policy name, its ratio)
is simulated in counter mode with the thrash limit 2.0. The script prints

  - our total wall time (the remat-sim processes, start to exit: trace parsing and baselines included), once
    single-threaded (--jobs 1, comparable with simrd's single-threaded runs) and once with one thread per core;
  - simrd's total (the sum of the simrd_wall_s column) and the speed-up ratios (target >= 100x), the CPU time
    of the remat-sim processes (less sensitive to other load on the machine), and a per-policy breakdown;
  - parity: how many rows give the reference result (pass/oom/thrash) and, of the rows that pass, how many have an
    overhead within 1% of the reference; RandomStorage rows are listed apart (one unseeded trial in simrd, not a
    parity target); every row that misses is printed.

Usage: bench/sim_speed.py [--remat-sim build/tools/remat-sim] [--shared-dir DIR] [--csv OUT.csv] [--repeat N]
                          [--check]
With --check the exit status is 1 when a target (parity or 100x) is missed.
"""
import argparse
import collections
import csv
import itertools
import os
import resource
import subprocess
import sys
import tempfile
import time

POLICY = {
    "DTR": "dtr",
    "DTREqClass": "dtr-eq",
    "DTRLocal": "dtr-local",
    "MSPS": "msps",
    "LRU": "lru",
    "LargestStorage": "largest",
    "RandomStorage": "random",
}
RESULT = {"pass": "pass", "OOM": "oom", "thrash(>2x)": "thrash"}
NOT_A_PARITY_TARGET = {"random"}
SPEED_TARGET = 100.0
OVERHEAD_TOLERANCE = 0.01


def ratio_key(text):
    return round(float(text), 6)


def read_reference(path):
    """Rows of the reference CSV with our policy and result names; fails loudly on anything unexpected."""
    rows = []
    with open(path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            if row["heuristic"] not in POLICY:
                sys.exit(f"{path}:{line}: unknown heuristic '{row['heuristic']}' (known: {', '.join(POLICY)})")
            if row["result"] not in RESULT:
                sys.exit(f"{path}:{line}: unknown result '{row['result']}' (known: {', '.join(RESULT)})")
            rows.append({
                "log": row["log"],
                "policy": POLICY[row["heuristic"]],
                "ratio": row["ratio"],
                "result": RESULT[row["result"]],
                "overhead": float(row["overhead"]) if row["overhead"] else None,
                "simrd_wall_s": float(row["simrd_wall_s"]),
            })
    return rows


def plan_invocations(reference):
    """Groups the reference rows into remat-sim invocations (TRACE --policies P,... --ratios R,...).

    One invocation per trace when that trace's rows are exactly the product of its policies and ratios (true for
    the shipped file), else one per (trace, policy): we never simulate a row the reference does not have.
    """
    invocations = []
    by_log = collections.OrderedDict()
    for row in reference:
        by_log.setdefault(row["log"], []).append(row)
    for log, rows in by_log.items():
        policies = list(dict.fromkeys(r["policy"] for r in rows))
        ratios = list(dict.fromkeys(r["ratio"] for r in rows))
        wanted = {(r["policy"], ratio_key(r["ratio"])) for r in rows}
        product = {(p, ratio_key(x)) for p, x in itertools.product(policies, ratios)}
        if wanted == product and len(rows) == len(product):
            invocations.append((log, policies, ratios))
        else:
            for policy in policies:
                mine = [r["ratio"] for r in rows if r["policy"] == policy]
                invocations.append((log, [policy], list(dict.fromkeys(mine))))
    return invocations


def run_all(remat_sim, trace_dir, invocations, jobs, out_dir, tag):
    """Runs every invocation; returns (wall seconds, CPU seconds, {(log, policy, ratio_key): our row})."""
    ours = {}
    wall = 0.0
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for index, (log, policies, ratios) in enumerate(invocations):
        out = os.path.join(out_dir, f"{tag}-{index}.csv")
        command = [remat_sim, os.path.join(trace_dir, log), "--dtr-paper", "--mode", "counter", "--overhead-limit", "2.0",
                   "--policies", ",".join(policies), "--ratios", ",".join(ratios), "--out", out]
        if jobs:
            command += ["--jobs", str(jobs)]
        start = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall += time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"remat-sim failed (exit {done.returncode}): {' '.join(command)}\n{done.stderr}")
        with open(out, newline="") as f:
            for row in csv.DictReader(f):
                ours[(row["trace"], row["policy"], ratio_key(row["ratio"]))] = row
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, ours


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remat-sim", default=os.path.join(repo, "build", "tools", "remat-sim"))
    parser.add_argument("--shared-dir", default=os.environ.get("REMAT_SHARED_DIR",
                                                               os.path.join(os.path.dirname(repo), "shared")))
    parser.add_argument("--csv", help="also write our rows next to the reference's to this CSV")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the whole set N times and report the lowest times (other load only adds time)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    trace_dir = os.path.join(args.shared_dir, "traces", "dtr")
    reference_path = os.path.join(trace_dir, "simrd_reference.csv")
    if not os.path.isfile(reference_path):
        sys.exit(f"sim_speed: {reference_path} not found (pass --shared-dir or set REMAT_SHARED_DIR)")
    if not os.access(args.remat_sim, os.X_OK):
        sys.exit(f"sim_speed: {args.remat_sim} is not an executable (build it, or pass --remat-sim)")

    reference = read_reference(reference_path)
    invocations = plan_invocations(reference)
    simrd_total = sum(r["simrd_wall_s"] for r in reference)
    cores = os.cpu_count() or 1
    load = os.getloadavg()

    with tempfile.TemporaryDirectory(prefix="sim_speed-") as tmp:
        def best_of(jobs, tag):
            """Runs the set args.repeat times; the lowest wall and CPU times, and rows that must not change."""
            runs = [run_all(args.remat_sim, trace_dir, invocations, jobs, tmp, f"{tag}{i}") for i in range(args.repeat)]
            for _, _, rows in runs[1:]:
                if {k: (r["result"], r["overhead"]) for k, r in rows.items()} != \
                   {k: (r["result"], r["overhead"]) for k, r in runs[0][2].items()}:
                    sys.exit("sim_speed: two repetitions gave different results (the replay must be deterministic)")
            rows = runs[0][2]
            for key, row in rows.items():  # per-row simulation time: the lowest too
                row["wall_time_ns"] = str(min(int(r[2][key]["wall_time_ns"]) for r in runs))
            return min(r[0] for r in runs), min(r[1] for r in runs), rows

        serial_wall, serial_cpu, ours = best_of(1, "serial")
        parallel_wall, parallel_cpu, ours_parallel = best_of(0, "parallel")

    # Both runs must agree row for row (runs are deterministic and independent of the thread count).
    disagree = [k for k in ours if ours[k]["result"] != ours_parallel.get(k, {}).get("result")
                or ours[k]["overhead"] != ours_parallel.get(k, {}).get("overhead")]

    missing = []
    result_match = collections.Counter()
    overhead_match = collections.Counter()
    passes = collections.Counter()
    total = collections.Counter()
    misses = []
    simulated_ns = 0
    merged = []
    for ref in reference:
        key = (ref["log"], ref["policy"], ratio_key(ref["ratio"]))
        row = ours.get(key)
        group = "random" if ref["policy"] in NOT_A_PARITY_TARGET else "target"
        total[group] += 1
        if row is None:
            missing.append(key)
            continue
        simulated_ns += int(row["wall_time_ns"])
        overhead = float(row["overhead"])
        same_result = row["result"] == ref["result"]
        within = None
        if ref["result"] == "pass":
            passes[group] += 1
            within = same_result and abs(overhead - ref["overhead"]) <= OVERHEAD_TOLERANCE * ref["overhead"]
            overhead_match[group] += bool(within)
        result_match[group] += same_result
        if not same_result or within is False:
            misses.append((ref, row))
        merged.append({"log": ref["log"], "policy": ref["policy"], "ratio": ref["ratio"],
                       "ref_result": ref["result"], "ref_overhead": ref["overhead"] if ref["overhead"] else "",
                       "result": row["result"], "overhead": row["overhead"], "evictions": row["evictions"],
                       "wall_time_ns": row["wall_time_ns"], "simrd_wall_s": ref["simrd_wall_s"]})

    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(merged[0].keys()) if merged else ["log"])
            writer.writeheader()
            writer.writerows(merged)

    print(f"reference set: {len(reference)} simulations on {len(set(r['log'] for r in reference))} traces, "
          f"{len(invocations)} remat-sim invocations, counter mode, thrash limit 2.0"
          + (f"; times are the lowest of {args.repeat} repetitions" if args.repeat > 1 else ""))
    print(f"simrd total wall (sum of simrd_wall_s):        {simrd_total:9.2f} s")
    print(f"remat-sim total wall, --jobs 1:                {serial_wall:9.3f} s   "
          f"speed-up {simrd_total / serial_wall:8.1f}x")
    print(f"remat-sim total wall, --jobs {cores} (one per core): {parallel_wall:9.3f} s   "
          f"speed-up {simrd_total / parallel_wall:8.1f}x")
    print(f"  (of which simulation proper, summed per-row wall_time_ns: {simulated_ns / 1e9:.3f} s)")
    print(f"remat-sim CPU time (user+sys), --jobs 1: {serial_cpu:.3f} s; --jobs {cores}: {parallel_cpu:.3f} s")
    print(f"speed target >= {SPEED_TARGET:.0f}x: {'met' if simrd_total / serial_wall >= SPEED_TARGET else 'MISSED'} "
          f"single-threaded")
    print(f"  (load average when starting: {load[0]:.2f}; other processes on this machine slow both runs)")
    print()
    print("per policy: simrd wall vs our simulation time (summed per-row wall_time_ns, --jobs 1)")
    by_policy = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for ref in reference:
        row = ours.get((ref["log"], ref["policy"], ratio_key(ref["ratio"])))
        entry = by_policy[ref["policy"]]
        entry[0] += ref["simrd_wall_s"]
        entry[1] += int(row["wall_time_ns"]) / 1e9 if row else 0.0
        entry[2] += 1
    for policy, (simrd_s, ours_s, count) in by_policy.items():
        ratio = f"{simrd_s / ours_s:8.1f}x" if ours_s > 0 else "       -"
        print(f"  {policy:<10} {count:3d} rows  simrd {simrd_s:8.2f} s  ours {ours_s:8.3f} s  {ratio}")
    print()
    for group, title in (("target", "parity targets (dtr, dtr-eq, dtr-local, msps, lru, largest)"),
                         ("random", "random (unseeded in simrd: not a parity target)")):
        print(f"{title}: {total[group]} rows")
        print(f"  same result (pass/oom/thrash):           {result_match[group]:4d} / {total[group]}")
        print(f"  passing rows with overhead within 1%:    {overhead_match[group]:4d} / {passes[group]}")
    if missing:
        print(f"\nMISSING from remat-sim's output: {len(missing)} rows, e.g. {missing[:3]}")
    if disagree:
        print(f"\n--jobs 1 and --jobs {cores} disagree on {len(disagree)} rows, e.g. {disagree[:3]}")
    if misses:
        print(f"\nrows that miss ({len(misses)}):")
        print(f"  {'trace':<16} {'policy':<10} {'ratio':>5}  {'ref':<7} {'ref ovh':>8}  {'ours':<7} {'our ovh':>8}")
        for ref, row in misses:
            ref_overhead = f"{ref['overhead']:.4f}" if ref["overhead"] else "-"
            print(f"  {ref['log'].split('-')[0]:<16} {ref['policy']:<10} {ref['ratio']:>5}  {ref['result']:<7} "
                  f"{ref_overhead:>8}  {row['result']:<7} {float(row['overhead']):8.4f}")

    targets_met = (not missing and not disagree
                   and result_match["target"] == total["target"]
                   and overhead_match["target"] == passes["target"]
                   and simrd_total / serial_wall >= SPEED_TARGET)
    return 1 if args.check and not targets_met else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Soak: does remat's state or per-op cost grow with the length of a run? (issue 22, item 2)

Trains a small MLP with Adam for many steps under a budget that binds (drop-only, evictions and replays every
step), and after a warm-up reports, per 1,000 steps, the slope of the process's resident memory, of the wall time
per recorded op and of its part outside the recorded kernels (remat's bookkeeping, replays, Python) (least-squares
lines through one point per window of --window steps), with the engine's table sizes (op, tensor and storage
slots; op lists and union-find nodes, compacted) at the first and last marks and their largest after the warm-up.

    PYTHONPATH=integration/python REMAT_BUILD_DIR=build python bench/soak.py --steps 20000

Targets (issue 22): RSS slope under 64 KiB per 1,000 steps, per-op time slope under 2% per 1,000 steps. Exits 1
when the RSS slope misses its target or the engine's tables grew after the warm-up (the time slope is reported,
not enforced: on a shared machine it moves with the load).
"""

import argparse
import os
import resource
import sys
import time

import torch

import remat
from rss import resident_kib  # bench/ is on the path of a script run from it

# Slots: must not grow after the warm-up. Compacted tables (a sawtooth: rebuilt when their garbage outnumbers what
# is used): their largest size after the warm-up is printed.
SLOTS = ("engine_op_slots", "engine_tensor_slots", "engine_storage_slots")
COMPACTED = ("engine_op_io_entries", "engine_union_find_nodes")
TABLES = SLOTS + COMPACTED


def build(width, depth, batch):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
    inputs = torch.randn(batch, width)
    targets = torch.randn(batch, 1)
    return model, inputs, targets


def step(model, opt, inputs, targets):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    opt.step()
    return loss


def peak_bytes(args):
    """The model's peak under remat with a budget that never binds (the same arena accounting)."""
    model, inputs, targets = build(args.width, args.depth, args.batch)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    with remat.enable("4GiB", costs="estimated"):
        for _ in range(3):
            step(model, opt, inputs, targets)
        return remat.stats()["peak_allocated_bytes"]


def slope(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=2000, help="steps before the first mark")
    parser.add_argument("--window", type=int, default=1000, help="steps per measured point")
    parser.add_argument("--ratio", type=float, default=0.6, help="budget as a fraction of the model's peak")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--batch", type=int, default=1024)
    args = parser.parse_args()
    if args.warmup + 2 * args.window > args.steps:
        parser.error("--steps must cover the warm-up and at least two windows")
    torch.set_num_threads(1)
    peak = peak_bytes(args)
    budget = int(peak * args.ratio)
    model, inputs, targets = build(args.width, args.depth, args.batch)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    points = []  # (step, rss KiB, ns per op, ns per op outside the recorded kernels)
    marks = {}
    with remat.enable(budget, costs="estimated"):
        first = remat.stats()
        window_start, ops_start, kernel_start = time.perf_counter_ns(), first["ops_recorded"], first["op_time_ns"]
        for i in range(1, args.steps + 1):
            step(model, opt, inputs, targets)
            if i >= args.warmup and (i - args.warmup) % args.window == 0:
                stats = remat.stats()
                now = time.perf_counter_ns()
                if i > args.warmup:
                    ops = max(1, stats["ops_recorded"] - ops_start)
                    outside = (now - window_start) - (stats["op_time_ns"] - kernel_start)
                    points.append((i, resident_kib(), (now - window_start) / ops, outside / ops))
                marks.setdefault("first", {k: stats[k] for k in TABLES})
                marks["last"] = {k: stats[k] for k in TABLES}
                marks["max"] = {k: max(stats[k], marks.get("max", {}).get(k, 0)) for k in TABLES}
                window_start, ops_start, kernel_start = time.perf_counter_ns(), stats["ops_recorded"], stats["op_time_ns"]
        final = remat.stats()
    steps_k = [p[0] / 1000 for p in points]
    rss_slope = slope(steps_k, [p[1] for p in points])
    op_ns = [p[2] for p in points]
    time_slope = slope(steps_k, op_ns) / (sum(op_ns) / len(op_ns)) * 100
    outside_ns = [p[3] for p in points]
    outside_slope = slope(steps_k, outside_ns) / (sum(outside_ns) / len(outside_ns)) * 100
    print(f"model: MLP {args.depth}x{args.width}, batch {args.batch}, Adam; peak {peak / 2**20:.2f} MiB, budget "
          f"{args.ratio} = {budget / 2**20:.2f} MiB; {args.steps} steps, {final['ops_recorded']} ops recorded, "
          f"{final['evictions']} evictions, {final['rematerializations']} rematerializations")
    for step_no, rss, ns, outside in points:
        print(f"  step {step_no:6d}: RSS {rss / 1024:8.1f} MiB, {ns / 1000:6.2f} us per op, {outside / 1000:6.2f} us "
              f"of it outside the recorded kernels")
    for name in ("first", "last", "max"):
        print(f"  engine tables, {name}: " + ", ".join(f"{k} {marks[name][k]:.0f}" for k in TABLES))
    print(f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")
    print(f"RSS slope {rss_slope:.1f} KiB per 1000 steps (target < 64); per-op time slope {time_slope:+.2f}% per "
          f"1000 steps (target < 2%), outside the recorded kernels (remat's bookkeeping, replays, Python) "
          f"{outside_slope:+.2f}%")
    grew = [k for k in SLOTS if marks["max"][k] > marks["first"][k]]
    if grew:
        print("engine tables grew after the warm-up: " + ", ".join(grew))
    if final["evictions"] == 0:
        print("the budget never bound (no evictions): raise --ratio's pressure")
        return 1
    return 0 if rss_slope < 64 and not grew else 1


if __name__ == "__main__":
    sys.exit(main())

"""The two fragmentation failures of issue 18, with the contiguous arena and with the stitching arena, drop-only.

    PYTHONPATH=integration/python REMAT_BUILD_DIR=build python bench/stitch_cases.py [--ratio 0.5] [--steps 2]

Cases (as a new user would write them; the model, optimizer and data are built before remat is enabled):
  efficientnet_b0       torchvision efficientnet_b0, 10 classes, batch 8 of 3x128x128, SGD lr 0.01 momentum 0.9;
  mobilenet_v3_small    torchvision mobilenet_v3_small, 10 classes, 4 micro-batches of 4 x 3x128x128 accumulated per
                        step (loss / 4, one optimizer step), the same SGD.
Each case runs: once without remat (the reference: losses, parameters, buffers and optimizer state as bytes), once
under remat with a budget that never binds (its arena peak is the unconstrained peak), then at --ratio of that peak
with arena="contiguous" and arena="stitch" (64 KiB granules; --arenas for others such as stitch:4KiB), offload off, estimated costs (the same choices every
run). A run that trains is compared byte for byte with the reference; one that runs out of memory is reported with
the first line of the error and, for the stitching arena, what held the memory (physical bytes, evictable bytes).
1 intra-op thread. Prints a Markdown table; exits 1 if a run that trained differs from the reference.
"""

import argparse
import datetime
import subprocess
import sys
import time
from pathlib import Path

import torch
import torchvision

_REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_REPO / "tests" / "python"))

import oracle  # noqa: E402  (tests/python/oracle.py: the byte oracle)
import remat  # noqa: E402

MICRO_BATCHES = 4


def build(case):
    torch.manual_seed(0)
    if case == "efficientnet_b0":
        model = torchvision.models.efficientnet_b0(num_classes=10)
        batches = [(torch.randn(8, 3, 128, 128), torch.randint(0, 10, (8,)))]
    else:
        model = torchvision.models.mobilenet_v3_small(num_classes=10)
        batches = [(torch.randn(4, 3, 128, 128), torch.randint(0, 10, (4,))) for _ in range(MICRO_BATCHES)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, optimizer, batches


def step(model, optimizer, batches):
    optimizer.zero_grad(set_to_none=True)
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.cross_entropy(model(x), y) / len(batches)
        loss.backward()
        losses.append(loss.detach().clone())
    optimizer.step()
    return losses


def run(case, steps, budget=None, arena=None):
    """(snapshot, losses, peak bytes, error or None) of `steps` steps, under remat when `budget` is given."""
    model, optimizer, batches = build(case)
    losses = []
    try:
        if budget is None:
            for _ in range(steps):
                losses += step(model, optimizer, batches)
            return oracle.capture(model, optimizer, losses), 0, None
        with remat.enable(budget, costs="estimated", arena=arena):
            for _ in range(steps):
                losses += step(model, optimizer, batches)
            stats = remat.stats()
            peak = stats.get("peak_physical_bytes") or stats["peak_allocated_bytes"]
        return oracle.capture(model, optimizer, losses), peak, None
    except torch.OutOfMemoryError as error:
        return None, 0, str(error)


def why(error):
    """The first line of an out-of-memory error and, when there, the stitching arena's physical and evictable bytes."""
    first = error.splitlines()[0]
    short = first.split(". Raise the budget")[0]
    detail = ""
    if "mapped in" in first:
        tail = first[first.rfind("physical "):]
        detail = "; " + tail.split(")")[0]
    elif "largest window" in first:
        detail = "; " + first[first.rfind("largest window"):].split(")")[0]
    return short + detail


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--cases", default="efficientnet_b0,mobilenet_v3_small")
    parser.add_argument("--arenas", default="contiguous,stitch",
                        help="remat.enable(arena=...) values, e.g. contiguous,stitch,stitch:4KiB")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; {load}")
    print(f"command: python bench/stitch_cases.py --ratio {args.ratio} --steps {args.steps} --arenas {args.arenas}\n")
    print("| case | arena | budget (MiB, ratio) | result | peak MiB | time s | note |")
    print("|---|---|---:|---|---:|---:|---|")
    bad = False
    for case in args.cases.split(","):
        reference, _, _ = run(case, args.steps)
        _, peak, error = run(case, args.steps, budget="64GiB")
        if error:
            print(f"| {case} | - | - | unconstrained run failed | | | {why(error)} |")
            bad = True
            continue
        budget = int(peak * args.ratio)
        for arena in args.arenas.split(","):
            start = time.perf_counter()
            snapshot, used, error = run(case, args.steps, budget=budget, arena=arena)
            seconds = time.perf_counter() - start
            if error is not None:
                result, note = "out of memory", why(error)
            else:
                diffs = oracle.differences(reference, snapshot)
                result = "identical" if not diffs else "DIFFERS"
                note = "" if not diffs else "; ".join(diffs[:3])
                bad = bad or bool(diffs)
            peak_mib = f"{used / 2**20:.1f}" if used else ""
            print(f"| {case} | {arena} | {budget / 2**20:.1f} ({args.ratio:g}) | {result} | {peak_mib} | "
                  f"{seconds:.1f} | {note} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

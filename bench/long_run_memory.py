"""Host memory remat keeps over a long run (issue 6): trains the GPT test model of tests/python/test_remat_training.py
under remat with a budget that never binds, and prints, at a first and a last step, the ops recorded, the records
and storages the bridge keeps, and the process's resident memory; then the growth per op between the two.

    PYTHONPATH=integration/python REMAT_BUILD_DIR=build python bench/long_run_memory.py --steps 60

What it shows: whether what remat keeps grows with the number of steps (records, tracked storages and, since the
engine recycles dead ids, host memory should not: the bytes per op printed last stay near 0). bench/soak.py does the
same over tens of thousands of steps under a binding budget. Exits 1 if the records kept grew by more than one
pruning interval (1024) between the two marks.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import remat  # noqa: E402
import test_remat_training as models  # noqa: E402
from rss import resident_kib  # noqa: E402  (bench/ is on the path of a script run from it)

PRUNE_INTERVAL = 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt", choices=models.MODELS)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--first", type=int, default=10, help="the step of the first mark (after warm-up)")
    args = parser.parse_args()
    if not 0 < args.first < args.steps:
        parser.error(f"--first must be between 0 and --steps ({args.steps}), got {args.first}")
    model, inputs, targets, loss_fn = models.build(args.model)
    opt = models.make_optimizer("sgd", model)
    marks = {}
    with remat.enable(models.HUGE, costs="estimated"):
        for step in range(1, args.steps + 1):
            opt.zero_grad()
            loss_fn(model(inputs), targets).backward()
            opt.step()
            if step in (args.first, args.steps):
                stats = remat.stats()
                marks[step] = dict(rss_kib=resident_kib(), ops=stats["ops_recorded"], records=stats["kept_records"],
                                   storages=stats["tracked_storages"], pruned=stats["pruned_records"])
    for step, mark in marks.items():
        print(f"step {step}: {mark['ops']} ops recorded, {mark['records']} records kept, {mark['storages']} storages "
              f"tracked, {mark['pruned']} records pruned, RSS {mark['rss_kib'] / 1024:.1f} MiB")
    first, last = marks[args.first], marks[args.steps]
    ops = last["ops"] - first["ops"]
    grown = last["rss_kib"] - first["rss_kib"]
    print(f"from step {args.first} to {args.steps}: {ops} ops, RSS +{grown / 1024:.1f} MiB = {grown / ops:.2f} KiB per op; "
          f"records kept {first['records']} -> {last['records']}, storages tracked {first['storages']} -> "
          f"{last['storages']}")
    return 0 if last["records"] - first["records"] <= PRUNE_INTERVAL else 1


if __name__ == "__main__":
    sys.exit(main())

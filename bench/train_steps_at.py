"""Trains one model of bench/train_step.py (its build, optimizer and step) for N steps under remat at a fraction of
its unconstrained peak, and nothing else: a whole-process command for paired timing of two configurations with an
external timer, for example the two CPU arenas (README, "Stitching arena"):

    REMAT_ARENA=stitch farm-bench -n 5 --vs "env REMAT_ARENA=contiguous python bench/train_steps_at.py transformer 0.5 12" \\
        -- python bench/train_steps_at.py transformer 0.5 12

Arguments: model (resnet50 or transformer), budget fraction, steps. Estimated costs, drop-only, 1 thread. The peak
is measured first with a budget that never binds (its time is the same for both configurations)."""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step  # noqa: E402  (bench/train_step.py)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=sorted(train_step.DEFAULT_BATCH))
    parser.add_argument("fraction", type=float)
    parser.add_argument("steps", type=int)
    cli = parser.parse_args(argv)
    if not 0 < cli.fraction <= 1 or cli.steps < 1:
        parser.error("the fraction must be in (0, 1] and the steps at least 1")
    torch.set_num_threads(1)
    args = argparse.Namespace(model=cli.model, batch=train_step.DEFAULT_BATCH[cli.model],
                              image_size=train_step.DEFAULT_IMAGE_SIZE, steps=2, optimizer="sgd", policy=None,
                              costs="estimated")
    _, _, _, stats = train_step.timed_run(args, budget=64 << 30)
    peak = stats["peak_allocated_bytes"]
    args.steps = cli.steps
    train_step.timed_run(args, budget=int(peak * cli.fraction))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

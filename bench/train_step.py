"""Training-step time and peak under remat (issue 6): resnet50 and the GPT-style transformer of examples/train.py,
at budgets that are fractions of the unconstrained peak, side by side with a baseline measured in the same process.

    python bench/train_step.py                                    # resnet50 and transformer, budgets 1,0.7,0.5,0.3
    python bench/train_step.py --models transformer --budgets 0.5 --steps 6 --csv /tmp/steps.csv

Per model, in one process and in this order, with the same seeds (examples/train.py's build(): synthetic data,
SGD with momentum by default):
  1. baseline: the model trained without remat;
  2. unconstrained: under remat with a budget that never binds (64 GiB); its arena peak is "the peak", what remat
     allocates during training (activations, gradients, optimizer state; the model and the data are made before
     remat is enabled), measured as examples/train.py does;
  3. each budget: int(fraction * peak) bytes.
Each run trains --steps steps; the first is a warm-up (it allocates gradients and the optimizer's state), the
step time is the median of the others, by wall clock and by the process's CPU time (all threads; steadier than
wall time when other processes share the cores, though a thread that spins while waiting counts too). Per run:
step time, overhead (step time / the baseline's, by wall and by CPU), the arena's peak, the engine's evictions and rematerializations, the first-run time of the replayed ops, and whether losses
and parameters are bitwise identical to the baseline. A budget that raises torch.OutOfMemoryError is reported as
"oom" with the first line of the message. At the end, the baseline is measured again ("baseline, again"): the
difference between the two baselines is the drift of the machine's load over the model's runs, a scale for how
far the overheads can be trusted on a shared machine.

Prints a markdown table (and writes the rows as CSV with --csv). Exits 0 when every run that finished was
bitwise identical (an oom is a result, not a failure), 1 otherwise.
"""

import argparse
import csv
import gc
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import torch

_REPO = Path(__file__).resolve().parents[1]


def _load_train_example():
    """examples/train.py as a module (it imports remat, from the checkout if the package is not installed)."""
    path = _REPO / "examples" / "train.py"
    spec = importlib.util.spec_from_file_location("remat_example_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train = _load_train_example()
remat = train.remat

# Per model: batch and image size when --batch / --image-size are not given. resnet50 at 8 x 3 x 128 x 128 takes
# about 3.5 s of CPU a step (2 threads), and its activations are more than half of the peak (beside about 180 MiB of
# gradients and momentum); the transformer (examples/train.py's defaults: width 64, 4 layers, context 128) at batch
# 32 takes about 0.6 s.
DEFAULT_BATCH = {"resnet50": 8, "transformer": 32}
DEFAULT_IMAGE_SIZE = 128
FALLBACK_BATCH = 8


def model_args(cli, model):
    """The namespace examples/train.py's build() and our run read, for one model."""
    return argparse.Namespace(
        model=model,
        batch=cli.batch if cli.batch is not None else DEFAULT_BATCH.get(model, FALLBACK_BATCH),
        image_size=cli.image_size if cli.image_size is not None else DEFAULT_IMAGE_SIZE,
        steps=cli.steps,
        optimizer=cli.optimizer,
        policy=cli.policy,
        costs=cli.costs,
    )


def timed_run(args, budget=None):
    """examples/train.py's run() (same build, optimizer, seeds and step), keeping every step's time: run() returns
    their mean, this benchmark reports the median after the warm-up step. Returns (losses, params, per step (wall
    seconds, process CPU seconds), stats or None)."""
    model, inputs, targets, loss_fn = train.build(args)
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.manual_seed(1)
    stats = None
    times = []
    if budget is not None:
        remat.enable(budget, policy=args.policy, costs=args.costs)
    try:
        losses = []
        for _ in range(args.steps):
            start, cpu_start = time.perf_counter(), time.process_time()
            opt.zero_grad()
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
            del loss
            times.append((time.perf_counter() - start, time.process_time() - cpu_start))
    finally:
        if budget is not None:
            remat.disable()
            stats = remat.stats()
    params = [p.detach().clone() for p in model.parameters()]
    return losses, params, times, stats


def median_step(times, cpu=False):
    """Median over the steps after the warm-up, of wall time or of the process's CPU time (every thread's)."""
    return statistics.median(t[1 if cpu else 0] for t in times[1:])


def mib(n):
    return n / (1 << 20)


def bench_model(cli, model):
    args = model_args(cli, model)
    shape = f"batch {args.batch}" + ("" if model == "transformer" else f", {args.image_size}x{args.image_size}")
    print(f"# {model} ({shape}, {args.steps} steps, {args.optimizer}, policy {args.policy or 'default'}, "
          f"{args.costs} costs, {torch.get_num_threads()} threads)", file=sys.stderr, flush=True)
    rows = []

    def row(label, fraction, budget, times=None, base=None, stats=None, same=None, error=None):
        step = median_step(times) if times else None
        cpu = median_step(times, cpu=True) if times else None
        r = {"model": model, "run": label, "fraction": fraction,
             "budget_mib": None if budget is None else round(mib(budget), 1),
             "step_ms": None if step is None else round(step * 1e3, 1),
             "overhead": None if step is None or base is None else round(step / base[0], 3),
             "cpu_ms": None if cpu is None else round(cpu * 1e3, 1),
             "cpu_overhead": None if cpu is None or base is None else round(cpu / base[1], 3),
             "peak_mib": None if stats is None else round(mib(stats["peak_allocated_bytes"]), 1),
             "evictions": None if stats is None else stats.get("evictions", 0),
             "rematerializations": None if stats is None else stats.get("rematerializations", 0),
             "replayed_ms": None if stats is None else round(stats.get("replayed_time_ns", 0) / 1e6, 1),
             "identical": None if same is None else ("yes" if same else "NO"),
             "error": error or ""}
        rows.append(r)
        shown = {k: v for k, v in r.items() if v not in (None, "")}
        print(f"  {shown}", file=sys.stderr, flush=True)
        return r

    base_losses, base_params, base_times, _ = timed_run(args)
    base = (median_step(base_times), median_step(base_times, cpu=True))
    row("baseline", None, None, base_times, base)
    gc.collect()

    losses, params, times, free = timed_run(args, budget=train.HUGE)
    peak = free["peak_allocated_bytes"]
    row("unconstrained", None, None, times, base, free,
        train.identical(base_losses, losses) and train.identical(base_params, params))
    del losses, params
    gc.collect()

    for fraction in cli.budgets:
        budget = int(peak * fraction)
        try:
            losses, params, times, stats = timed_run(args, budget=budget)
        except torch.OutOfMemoryError as error:
            lines = str(error).strip().splitlines()
            message = lines[0] if lines else type(error).__name__
            print(f"  oom at {fraction:g}: {message}", file=sys.stderr, flush=True)
            row(f"{fraction:g}", fraction, budget, error="oom: " + message)
            gc.collect()
            continue
        row(f"{fraction:g}", fraction, budget, times, base, stats,
            train.identical(base_losses, losses) and train.identical(base_params, params))
        del losses, params
        gc.collect()

    _, _, again_times, _ = timed_run(args)
    row("baseline, again", None, None, again_times, base)
    gc.collect()
    return rows


def cell(value, fmt="{}"):
    return "-" if value is None or value == "" else fmt.format(value)


def short_error(error, limit=120):
    """The first sentence of an error's first line (remat's OutOfMemoryError puts the whole story on one line: the
    CSV and the progress lines keep it whole)."""
    head = error.split(". ")[0]
    return head if len(head) <= limit else head[:limit - 3] + "..."


def markdown(rows):
    lines = ["| model | run | budget | step, wall (median) | overhead | step, CPU | overhead, CPU | remat peak "
             "| evictions | remats | replayed | identical |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["error"]:
            lines.append(f"| {r['model']} | {r['run']} | {cell(r['budget_mib'], '{:.1f} MiB')} | "
                         f"{short_error(r['error'])} | | | | | | | | |")
            continue
        lines.append(
            f"| {r['model']} | {r['run']} | {cell(r['budget_mib'], '{:.1f} MiB')} | {cell(r['step_ms'], '{:.0f} ms')} "
            f"| {cell(r['overhead'], '{:.2f}x')} | {cell(r['cpu_ms'], '{:.0f} ms')} "
            f"| {cell(r['cpu_overhead'], '{:.2f}x')} | {cell(r['peak_mib'], '{:.1f} MiB')} | {cell(r['evictions'])} "
            f"| {cell(r['rematerializations'])} | {cell(r['replayed_ms'], '{:.0f} ms')} | {cell(r['identical'])} |")
    return "\n".join(lines)


def parse_budgets(text):
    try:
        budgets = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected fractions of the peak separated by commas, such as "
                                         f"'1,0.7,0.5', got {text!r}") from None
    if not budgets or any(not 0 < b for b in budgets):
        raise argparse.ArgumentTypeError(f"budgets are fractions of the peak > 0, got {text!r}")
    return budgets


def parse_models(text):
    models = [part.strip() for part in text.split(",") if part.strip()]
    if not models:
        raise argparse.ArgumentTypeError("expected model names separated by commas, such as 'resnet50,transformer'")
    return models


def positive_int(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def check_model(parser, name):
    if name == "transformer":
        return
    import torchvision
    if not callable(getattr(torchvision.models, name, None)) or name.startswith("_"):
        parser.error(f"unknown model {name!r}: 'transformer' or a torchvision classification model "
                     f"(resnet50, resnet18, densenet121, ...)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=parse_models, default=["resnet50", "transformer"],
                        help="comma-separated: 'transformer' (examples/train.py's) and torchvision models "
                             "(default: resnet50,transformer)")
    parser.add_argument("--budgets", type=parse_budgets, default=[1.0, 0.7, 0.5, 0.3],
                        help="comma-separated fractions of the unconstrained peak (default: 1,0.7,0.5,0.3)")
    parser.add_argument("--steps", type=positive_int(2), default=4,
                        help="steps per run, the first a warm-up (default 4: the median of 3)")
    parser.add_argument("--policy", default=None, help="eviction policy (default: remat's); one of "
                                                       + ", ".join(remat.policies()))
    parser.add_argument("--costs", choices=("measured", "estimated"), default="measured",
                        help="how the engine weighs ops (default: measured)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--batch", type=positive_int(1), default=None,
                        help=f"batch size for every model (default: {DEFAULT_BATCH}, others {FALLBACK_BATCH})")
    parser.add_argument("--image-size", type=positive_int(32), default=None,
                        help=f"image side for torchvision models (default {DEFAULT_IMAGE_SIZE})")
    parser.add_argument("--csv", metavar="PATH", default=None, help="also write the rows as CSV to PATH")
    cli = parser.parse_args(argv)
    if cli.policy is not None and cli.policy not in remat.policies():
        parser.error(f"unknown policy {cli.policy!r}; registered policies: {', '.join(remat.policies())}")
    for name in cli.models:
        check_model(parser, name)
    if cli.csv is not None:
        directory = os.path.dirname(os.path.abspath(cli.csv))
        if not os.path.isdir(directory):
            parser.error(f"--csv: directory {directory!r} does not exist")
    if remat.is_enabled():
        parser.error("remat is already enabled (REMAT_BUDGET is set?): the baseline must run without it")

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    rows = []
    for name in cli.models:
        rows.extend(bench_model(cli, name))
    load_after = os.getloadavg()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {started}; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (1 min)\n")
    print(markdown(rows))
    if cli.csv is not None:
        with open(cli.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            writer.writeheader()
            writer.writerows(rows)
    return 0 if all(r["identical"] != "NO" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

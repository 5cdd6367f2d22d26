"""Training-step time and peak under remat (issue 6): resnet50 and the GPT-style transformer of examples/train.py,
at budgets that are fractions of the unconstrained peak, side by side with a baseline measured in the same process.

    python bench/train_step.py                                    # resnet50 and transformer, budgets 1,0.7,0.5,0.3
    python bench/train_step.py --models transformer --budgets 0.5 --steps 6 --csv /tmp/steps.csv

Per model, in one process, with the same seeds (examples/train.py's build(): synthetic data, SGD with momentum by
default), these configurations:
  baseline       the model trained without remat;
  unconstrained  under remat with a budget that never binds (64 GiB); its arena peak is "the peak", what remat
                 allocates during training (activations, gradients, optimizer state; the model and the data are made
                 before remat is enabled), measured as examples/train.py does;
  each budget    int(fraction * peak) bytes, once per --offload mode: "off" (evict and recompute only) and "auto"
                 (also page victims to host memory outside the arena when the copy is cheaper than recomputing;
                 on the CPU a copy is a memcpy).
Each run trains --steps steps from a fresh model; the first step is a warm-up (it allocates gradients and the
optimizer's state). Every configuration runs --rounds times: the first round in the order above, the next in
reverse, and so on, so that drift in the machine's load weighs on all of them alike; the baseline's per-round
step times are printed under the table as the scale of that drift. Step time is the median over all rounds' steps
after the warm-ups, by wall clock and by the process's CPU time (all threads; steadier than wall time when other
processes share the cores, though time a thread spins waiting counts too).

Per configuration: step time, overhead (step time / the baseline's, by wall and by CPU), the arena's peak (the
highest of the rounds), the engine's evictions and rematerializations (one number when the rounds agree, else
each round's: with measured op costs the eviction choices depend on timing), the first-run time of the replayed
ops, and whether losses and parameters are bitwise identical to the first baseline's. A budget that raises
torch.OutOfMemoryError is reported as "oom" with the first line of the message (all of it in the progress lines
on stderr and in the CSV), or, if only some rounds ran out, with the others' figures and a note.

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

# Per model: batch and image size when --batch / --image-size are not given. resnet50 at 16 x 3 x 128 x 128 takes
# about 1.9 s a step on the 2-core development machine with --threads 1; its peak is 567 MiB, of which 180 MiB are
# gradients and momentum, and remat.bound.RequiredBytes (the least any drop-and-recompute runtime needs) is 0.32 of
# it, so 0.5 is a budget some policy could meet (at batch 8 the bound is 0.50). The transformer (examples/train.py's
# defaults: width 64, 4 layers, context 128) at batch 32 takes about 0.26 s with --threads 1, with a 184 MiB peak.
DEFAULT_BATCH = {"resnet50": 16, "transformer": 32}
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


def config_label(config):
    """A budget configuration is (fraction, offload mode); the others are strings."""
    if isinstance(config, str):
        return config
    fraction, offload = config
    return f"{fraction:g}" if offload == "off" else f"{fraction:g}, offload {offload}"


def timed_run(args, budget=None, offload="off"):
    """examples/train.py's run() (same build, optimizer, seeds and step), keeping every step's time: run() returns
    their mean, this benchmark reports the median after the warm-up step. Returns (losses, params, per step (wall
    seconds, process CPU seconds), stats or None)."""
    model, inputs, targets, loss_fn = train.build(args)
    opt = train.make_optimizer(args, model)
    torch.manual_seed(1)
    stats = None
    times = []
    if budget is not None:
        remat.enable(budget, policy=args.policy, costs=args.costs, offload=offload)
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


def median_step(runs, cpu=False):
    """Median over the steps after each run's warm-up, pooled over runs (rounds), of wall time or of the process's
    CPU time (every thread's)."""
    return statistics.median(t[1 if cpu else 0] for times in runs for t in times[1:])


def mib(n):
    return n / (1 << 20)


def joined(values):
    """One value when every round agrees, else each round's, separated by slashes."""
    return values[0] if len(set(values)) == 1 else " / ".join(str(v) for v in values)


def bench_model(cli, model):
    args = model_args(cli, model)
    shape = f"batch {args.batch}" + ("" if model == "transformer" else f", {args.image_size}x{args.image_size}")
    print(f"# {model} ({shape}, {args.steps} steps, {cli.rounds} rounds, {args.optimizer}, policy "
          f"{args.policy or 'default'}, {args.costs} costs, {torch.get_num_threads()} threads)",
          file=sys.stderr, flush=True)
    configs = ["baseline", "unconstrained"] + [(f, mode) for mode in cli.offload for f in cli.budgets]
    runs = {c: [] for c in configs}    # per config: the step times of each run that finished
    stats = {c: [] for c in configs}   # remat.stats() of each run that finished
    same = {c: [] for c in configs}    # per finished run: bitwise identical to the first baseline
    errors = {c: [] for c in configs}  # first line of each OutOfMemoryError
    budgets = {}
    reference = None  # the first baseline's (losses, params)
    baseline_rounds = []
    for r in range(cli.rounds):
        # Odd rounds run the configurations in reverse, so that drift in the machine's load weighs on all alike.
        # The first round is in order: the baseline first (the reference) and the unconstrained peak before any
        # budget that is a fraction of it.
        order = configs if r % 2 == 0 else configs[::-1]
        for config in order:
            budget, offload = None, "off"
            if config == "unconstrained":
                budget = train.HUGE
            elif config != "baseline":
                budget, offload = budgets[config[0]], config[1]
            try:
                losses, params, times, run_stats = timed_run(args, budget=budget, offload=offload)
            except torch.OutOfMemoryError as error:
                lines = str(error).strip().splitlines()
                message = lines[0] if lines else type(error).__name__
                errors[config].append(message)
                print(f"  round {r + 1}, {config_label(config)}: oom: {message}", file=sys.stderr, flush=True)
                gc.collect()
                continue
            if reference is None:
                reference = (losses, params)
            identical = train.identical(reference[0], losses) and train.identical(reference[1], params)
            runs[config].append(times)
            same[config].append(identical)
            if run_stats is not None:
                stats[config].append(run_stats)
            if config == "baseline":
                baseline_rounds.append(median_step([times]))
            if config == "unconstrained" and not budgets:
                peak = run_stats["peak_allocated_bytes"]
                budgets.update({f: int(peak * f) for f in cli.budgets})
            print(f"  round {r + 1}, {config_label(config)}: {median_step([times]) * 1e3:.0f} ms/step wall, "
                  f"{median_step([times], cpu=True) * 1e3:.0f} ms CPU"
                  + ("" if run_stats is None else f", peak {mib(run_stats['peak_allocated_bytes']):.1f} MiB, "
                     f"{run_stats.get('evictions', 0)} evictions")
                  + f", identical {'yes' if identical else 'NO'}", file=sys.stderr, flush=True)
            del losses, params
            gc.collect()

    base = (median_step(runs["baseline"]), median_step(runs["baseline"], cpu=True))
    rows = []
    for config in configs:
        finished = runs[config]
        step = median_step(finished) if finished else None
        cpu = median_step(finished, cpu=True) if finished else None
        st = stats[config]
        fraction = None if isinstance(config, str) else config[0]
        error = ""
        if errors[config]:
            error = "oom: " + errors[config][0]
            if finished:
                error = f"oom in {len(errors[config])} of {cli.rounds} rounds: " + errors[config][0]
        rows.append({
            "model": model,
            "run": config_label(config),
            "fraction": fraction,
            "offload": None if fraction is None else config[1],
            "budget_mib": round(mib(budgets[fraction]), 1) if fraction in budgets else None,
            "step_ms": None if step is None else round(step * 1e3, 1),
            "overhead": None if step is None else round(step / base[0], 3),
            "cpu_ms": None if cpu is None else round(cpu * 1e3, 1),
            "cpu_overhead": None if cpu is None else round(cpu / base[1], 3),
            "peak_mib": round(mib(max(s["peak_allocated_bytes"] for s in st)), 1) if st else None,
            "evictions": joined([s.get("evictions", 0) for s in st]) if st else None,
            "rematerializations": joined([s.get("rematerializations", 0) for s in st]) if st else None,
            "replayed_ms": round(statistics.median(s.get("replayed_time_ns", 0) for s in st) / 1e6, 1) if st else None,
            "paged_out_mib": round(mib(statistics.median(s.get("paged_out_bytes", 0) for s in st)), 1) if st else None,
            # What paging really saves: the host tier's peak beside the arena's (on a CPU both are the same RAM).
            "host_peak_mib": round(mib(max(s.get("host_peak_bytes", 0) for s in st)), 1) if st else None,
            # The two tiers at once (their peaks apart need not coincide).
            "together_peak_mib": round(mib(max(s.get("resident_and_host_peak_bytes", 0) for s in st)), 1) if st else None,
            "identical": None if not same[config] else ("yes" if all(same[config]) else "NO"),
            "baseline_rounds_ms": " / ".join(f"{t * 1e3:.0f}" for t in baseline_rounds) if config == "baseline" else "",
            "error": error,
        })
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
             "| host tier peak | both tiers at once | evictions | remats | replayed | paged out | identical |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["error"] and r["step_ms"] is None:
            lines.append(f"| {r['model']} | {r['run']} | {cell(r['budget_mib'], '{:.1f} MiB')} | "
                         f"{short_error(r['error'])} | | | | | | | | | | | |")
            continue
        lines.append(
            f"| {r['model']} | {r['run']} | {cell(r['budget_mib'], '{:.1f} MiB')} | {cell(r['step_ms'], '{:.0f} ms')} "
            f"| {cell(r['overhead'], '{:.2f}x')} | {cell(r['cpu_ms'], '{:.0f} ms')} "
            f"| {cell(r['cpu_overhead'], '{:.2f}x')} | {cell(r['peak_mib'], '{:.1f} MiB')} "
            f"| {cell(r['host_peak_mib'], '{:.1f} MiB')} | {cell(r['together_peak_mib'], '{:.1f} MiB')} "
            f"| {cell(r['evictions'])} "
            f"| {cell(r['rematerializations'])} | {cell(r['replayed_ms'], '{:.0f} ms')} "
            f"| {cell(r['paged_out_mib'], '{:.0f} MiB')} | {cell(r['identical'])} |")
    drift = [f"{r['model']} {r['baseline_rounds_ms']} ms" for r in rows if r["baseline_rounds_ms"]]
    partial = [f"{r['model']} at {r['run']}: {short_error(r['error'])}" for r in rows
               if r["error"] and r["step_ms"] is not None]
    if drift:
        lines.append("\nBaseline step time per round (wall; the spread is the drift of the machine's load): "
                     + "; ".join(drift) + ".")
    if partial:
        lines.append("\nSome rounds ran out of memory: " + "; ".join(partial) + ".")
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


def parse_offload(text):
    modes = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [m for m in modes if m not in ("off", "auto", "always")]
    if not modes or unknown:
        raise argparse.ArgumentTypeError(f"expected offload modes off, auto, always separated by commas, got {text!r}")
    return list(dict.fromkeys(modes))


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
    parser.add_argument("--steps", type=positive_int(2), default=3,
                        help="steps per run, the first a warm-up (default 3)")
    parser.add_argument("--rounds", type=positive_int(1), default=2,
                        help="times every configuration runs, in order then reversed (default 2); step times are "
                             "the median over all rounds' steps after the warm-ups")
    parser.add_argument("--policy", default=None, help="eviction policy (default: remat's); one of "
                                                       + ", ".join(remat.policies()))
    parser.add_argument("--costs", choices=("measured", "estimated"), default="measured",
                        help="how the engine weighs ops (default: measured)")
    parser.add_argument("--offload", type=parse_offload, default=["off", "auto"],
                        help="comma-separated paging modes to run each budget with: off (evict and recompute only), "
                             "auto, always (default: off,auto)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--batch", type=positive_int(1), default=None,
                        help=f"batch size for every model (default: {DEFAULT_BATCH}, others {FALLBACK_BATCH})")
    parser.add_argument("--image-size", type=positive_int(32), default=None,
                        help=f"image side for torchvision models (default {DEFAULT_IMAGE_SIZE})")
    parser.add_argument("--threads", type=positive_int(1), default=None,
                        help="torch's intra-op threads (default: torch's, %d here). On a machine other processes "
                             "share, 1 makes the CPU-time columns the steadier measure: no worker thread spins "
                             "waiting for a preempted one" % torch.get_num_threads())
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
    if cli.threads is not None:
        torch.set_num_threads(cli.threads)
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
    import resource  # noqa: E402 (only here: the process's own peak, after every run)
    print(f"process peak RSS over every run: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB "
          "(torch itself included)")
    if cli.csv is not None:
        with open(cli.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            writer.writeheader()
            writer.writerows(rows)
    return 0 if all(r["identical"] != "NO" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""torch.compile under remat: the lowest budgets that train, per model, compile granularity and paging mode.

    python bench/compile_budgets.py                       # gpt and cnn, per block and whole, offload auto and off
    python bench/compile_budgets.py --models gpt --compile blocks --offload off --budgets 0.7,0.6,0.5

The models are those of tests/python/test_compile.py (a 4-block GPT with Adam, a 6-block residual CNN with batch
norm and SGD; one intra-op thread; estimated op costs; --steps steps), compiled with inductor per block
(``block.compile()``) or whole (``torch.compile(model)``). "The peak" is the compiled run's arena peak under remat
with a budget that never binds. Every budget is int(fraction * peak) and every run is compared byte for byte
(tests/python/oracle.py) with the same compiled model trained without remat. Step times are the median wall time
of the steps after the first (which compiles, from inductor's cache after the first run), against the compiled
model without remat measured in the same process just before ("remat, unbound": under remat with the budget that
never binds, the cost of recording alone).

Prints a markdown table: per configuration and fraction, "identical" with the run's arena peak and the host tier's
peak beside it (on a CPU both are the same RAM: paging moves memory there, it does not save it), page-outs,
rematerializations and step time, or "oom" with the first words of the message, or "DIFFERS". Exits 1 if any run
differs.
"""

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))  # oracle.py


def _load_models():
    spec = importlib.util.spec_from_file_location("remat_compile_models", ROOT / "tests" / "python" / "test_compile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt,cnn")
    parser.add_argument("--compile", default="blocks,whole")
    parser.add_argument("--offload", default="auto,off")
    parser.add_argument("--budgets", default="1.05,1.0,0.8,0.7,0.6,0.5,0.4,0.3")
    parser.add_argument("--steps", type=int, default=4, help="steps per run; the first (compiling) is not timed")
    args = parser.parse_args()

    import torch

    models = _load_models()
    oracle = models.oracle
    torch.set_num_threads(1)
    rows, differs = [], False
    for name in args.models.split(","):
        builder = getattr(models, name)
        for mode in args.compile.split(","):
            reference, _ = models.train(builder, mode, steps=args.steps)
            base = statistics.median(models.STEP_SECONDS[1:])
            _, stats = models.train(builder, mode, models.HUGE, steps=args.steps)
            peak = stats["peak_allocated_bytes"]
            unbound = statistics.median(models.STEP_SECONDS[1:]) / base
            for offload in args.offload.split(","):
                for fraction in (float(f) for f in args.budgets.split(",")):
                    budget = int(fraction * peak)
                    try:
                        got, stats = models.train(builder, mode, budget, offload=offload, steps=args.steps)
                        step = statistics.median(models.STEP_SECONDS[1:])
                    except torch.OutOfMemoryError as error:
                        result = "oom: " + str(error)[:70].replace("|", "/")
                    else:
                        try:
                            oracle.assert_identical(reference, got, f"{name} {mode} {offload} {fraction}")
                        except AssertionError as error:
                            differs = True
                            result = "DIFFERS: " + str(error)[:70]
                        else:
                            result = (f"identical; peak {stats['peak_allocated_bytes'] / 2**20:.1f} MiB "
                                      f"+ host tier {stats['host_peak_bytes'] / 2**20:.1f} MiB, "
                                      f"{stats['page_outs']} page-outs, {stats['rematerializations']} remats, "
                                      f"step {step * 1e3:.0f} ms = {step / base:.2f}x")
                    print(f"{name} {mode} offload={offload} {fraction}: {result}", file=sys.stderr, flush=True)
                    rows.append((name, mode, f"{peak / 2**20:.1f} MiB", f"{base * 1e3:.0f} ms", f"{unbound:.2f}x",
                                 offload, fraction, result))
    print("| model | compiled | compiled peak | compiled step | remat, unbound | offload | budget / peak | result |")
    print("|---|---|---:|---:|---:|---|---:|---|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())

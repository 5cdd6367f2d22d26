"""torch.compile under remat: the lowest budgets that train, per model, compile granularity and paging mode.

    python bench/compile_budgets.py                       # gpt and cnn, per block and whole, offload auto and off
    python bench/compile_budgets.py --models gpt --compile blocks --offload off --budgets 0.7,0.6,0.5

The models are those of tests/python/test_compile.py (a 4-block GPT with Adam, a 6-block residual CNN with batch
norm and SGD; one intra-op thread; estimated op costs; 3 steps), compiled with inductor per block
(``block.compile()``) or whole (``torch.compile(model)``). "The peak" is the compiled run's arena peak under remat
with a budget that never binds. Every budget is int(fraction * peak) and every run is compared byte for byte
(tests/python/oracle.py) with the same compiled model trained without remat.

Prints a markdown table: per configuration and fraction, "identical" with the run's arena peak, page-outs and
rematerializations, or "oom" with the first words of the message, or "DIFFERS". Exits 1 if any run differs.
"""

import argparse
import importlib.util
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
    args = parser.parse_args()

    import torch

    models = _load_models()
    oracle = models.oracle
    torch.set_num_threads(1)
    rows, differs = [], False
    for name in args.models.split(","):
        builder = getattr(models, name)
        for mode in args.compile.split(","):
            reference, _ = models.train(builder, mode)
            peak = models.compiled_peak(builder, mode)
            for offload in args.offload.split(","):
                for fraction in (float(f) for f in args.budgets.split(",")):
                    budget = int(fraction * peak)
                    try:
                        got, stats = models.train(builder, mode, budget, offload=offload)
                    except torch.OutOfMemoryError as error:
                        result = "oom: " + str(error)[:70].replace("|", "/")
                    else:
                        try:
                            oracle.assert_identical(reference, got, f"{name} {mode} {offload} {fraction}")
                        except AssertionError as error:
                            differs = True
                            result = "DIFFERS: " + str(error)[:70]
                        else:
                            result = (f"identical; peak {stats['peak_allocated_bytes'] / 2**20:.1f} MiB, "
                                      f"{stats['page_outs']} page-outs, {stats['rematerializations']} remats")
                    print(f"{name} {mode} offload={offload} {fraction}: {result}", file=sys.stderr, flush=True)
                    rows.append((name, mode, f"{peak / 2**20:.1f} MiB", offload, fraction, result))
    print("| model | compiled | compiled peak | offload | budget / peak | result |")
    print("|---|---|---:|---|---:|---|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
